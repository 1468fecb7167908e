"""Code that runs on the emulated GPU calls real API: every function, type and method the CUDA
and Polygraphy stand-ins provide exists, with the same name (and, for cuda-python functions,
the same parameter names), on the installed ``cuda.bindings`` modules and Polygraphy."""

import inspect
import re
import types

import pytest

from trt_kv.emulator import cuda_driver, cuda_runtime, polygraphy_cuda


def real_modules():
    import cuda.bindings.driver as driver
    import cuda.bindings.runtime as runtime

    return {cuda_runtime: runtime, cuda_driver: driver}


def provided(stand_in):
    """Public names of a stand-in module: its own functions and cuda-python's re-exported
    types; not the modules and helpers it merely imports, nor its declared emulator extras."""
    names = []
    for name, obj in vars(stand_in).items():
        if name.startswith("_") or name in stand_in.EMULATOR_EXTRAS:
            continue
        if isinstance(obj, types.ModuleType) or name == "annotations":
            continue
        origin = getattr(obj, "__module__", "") or ""
        if origin == stand_in.__name__ or origin.startswith("cuda."):
            names.append(name)
    return names


def parameters(fn):
    """Parameter names; cuda-python's from its docstring's first line, e.g.
    ``cudaMemcpy(dst, src, size_t count, kind: cudaMemcpyKind)``."""
    if not isinstance(fn, types.FunctionType):
        head = fn.__doc__.strip().splitlines()[0]
        inside = re.fullmatch(r"\w+\((.*)\)", head).group(1)
        return [p.split(":")[0].split()[-1].lstrip("*") for p in inside.split(",") if p.strip()]
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("stand_in", [cuda_runtime, cuda_driver], ids=lambda m: m.__name__)
def test_every_provided_name_exists_on_cuda_bindings(stand_in):
    real = real_modules()[stand_in]
    names = provided(stand_in)
    assert len(names) > 10
    missing = [n for n in names if not hasattr(real, n)]
    assert missing == []


@pytest.mark.parametrize("stand_in", [cuda_runtime, cuda_driver], ids=lambda m: m.__name__)
def test_types_are_cuda_bindings_own(stand_in):
    real = real_modules()[stand_in]
    for name in provided(stand_in):
        obj = getattr(stand_in, name)
        if isinstance(obj, type):
            assert obj is getattr(real, name), name


@pytest.mark.parametrize("stand_in", [cuda_runtime, cuda_driver], ids=lambda m: m.__name__)
def test_functions_take_the_same_parameters(stand_in):
    real = real_modules()[stand_in]
    for name in provided(stand_in):
        obj = getattr(stand_in, name)
        if isinstance(obj, types.FunctionType):
            assert parameters(obj) == parameters(getattr(real, name)), name


def test_emulator_extras_are_declared_and_not_cuda_api():
    real = real_modules()
    for stand_in in (cuda_runtime, cuda_driver):
        for name in stand_in.EMULATOR_EXTRAS:
            assert hasattr(stand_in, name) and not hasattr(real[stand_in], name), name


def test_polygraphy_wrapper_methods_exist_on_polygraphy_cuda():
    from polygraphy.cuda import Cuda

    methods = [n for n, v in vars(polygraphy_cuda.EmulatedCuda).items() if callable(v)]
    methods = [n for n in methods if not n.startswith("_")]
    assert len(methods) >= 7
    assert [n for n in methods if not callable(getattr(Cuda, n, None))] == []
