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
        own = (stand_in.__name__, *getattr(stand_in, "EMULATOR_PARTS", ()))
        if origin in own or origin.startswith("cuda."):
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


# -- the TensorRT runtime stand-ins -------------------------------------------------------------
def overloads(method):
    """Parameter-name lists (without ``self``) of a pybind11 method, one per overload, from
    its docstring: ``name(self: T, a: U, b: V) -> W`` lines."""
    found = []
    for line in (method.__doc__ or "").splitlines():
        m = re.match(r"\s*(?:\d+\.\s*)?\w+\((.*)\)\s*->", line)
        if m and "*args" not in m.group(1):
            params = [p.split(":")[0].strip() for p in re.split(r",\s*(?![^\[]*\])", m.group(1))]
            found.append([p for p in params if p and p != "self"])
    return found


def stand_in_pairs():
    from trt_kv._trt import trt
    from trt_kv.emulator import tensorrt_context, tensorrt_inspector, tensorrt_runtime

    ours = {
        "Runtime": tensorrt_runtime.Runtime,
        "ICudaEngine": tensorrt_runtime.ICudaEngine,
        "IExecutionContext": tensorrt_context.IExecutionContext,
        "IRuntimeConfig": tensorrt_runtime.IRuntimeConfig,
        "IRuntimeCache": tensorrt_runtime.IRuntimeCache,
        "EngineInspector": tensorrt_inspector.EngineInspector,
    }
    assert set(ours) == set(tensorrt_runtime.STAND_INS)
    return [(cls, getattr(trt, name)) for name, cls in ours.items()]


def test_tensorrt_stand_in_methods_exist_on_the_installed_classes():
    for ours, real in stand_in_pairs():
        names = [n for n in vars(ours) if not n.startswith("_")]
        assert names, ours
        assert [n for n in names if not hasattr(real, n)] == [], real.__name__


def test_tensorrt_stand_in_methods_take_the_arguments_of_an_overload():
    for ours, real in stand_in_pairs():
        for name, fn in vars(ours).items():
            if name.startswith("_") or not isinstance(fn, types.FunctionType):
                continue
            mine = list(inspect.signature(fn).parameters)[1:]
            theirs = overloads(getattr(real, name))
            assert theirs, (real.__name__, name)
            if len(theirs) == 1:  # one signature: the same names
                assert mine == theirs[0], (real.__name__, name)
            else:  # overloads: one parameter list per call shape; ours takes each arity
                assert {len(t) for t in theirs} <= set(range(len(mine) + 1)), (real.__name__, name)


def test_tensorrt_stand_in_instances_have_only_real_attributes():
    from trt_kv._trt import trt
    from trt_kv.builder import build_engine
    from trt_kv.builder.doc_example import doc_example_network
    from trt_kv.emulator import emulated_gpu

    with emulated_gpu():
        builder, network, profiles = doc_example_network()
        data = build_engine(builder, network, profiles).data
        runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
        engine = runtime.deserialize_cuda_engine(data)
        instances = [runtime, engine, engine.create_execution_context()]
        instances.append(engine.create_runtime_config())
        instances.append(instances[-1].create_runtime_cache())
        instances.append(engine.create_engine_inspector())
    for obj, (_, real) in zip(instances, stand_in_pairs()):
        public = [n for n in vars(obj) if not n.startswith("_")]
        assert [n for n in public if not hasattr(real, n)] == [], real.__name__
