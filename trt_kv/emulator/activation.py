"""Activation of the emulated GPU: :func:`emulated_gpu` installs the stand-ins, then every
installer registered through :mod:`trt_kv.emulator.hooks`, and undoes them all on exit.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from trt_kv.emulator import cuda_driver, cuda_runtime, polygraphy_cuda
from trt_kv.emulator.device import DEFAULT_COMPUTE_CAPABILITY, device
from trt_kv.emulator.hooks import ACTIVE, LOCK, Installer, installers
from trt_kv.emulator.memory import EmulatorError

if TYPE_CHECKING:  # the engine records import the interpreter: loaded on first activation
    from trt_kv.emulator.engines import RebuildFn


def _install_cuda_modules() -> Callable[[], None]:
    """``cuda.bindings.runtime`` / ``driver`` -> the stand-ins (module attribute and
    ``sys.modules``, so ``from cuda.bindings import runtime`` finds them)."""
    package = importlib.import_module("cuda.bindings")
    # cuda.bindings.nvrtc binds names of the real driver module when first imported: load it
    # before the driver is swapped.
    importlib.import_module("cuda.bindings.nvrtc")
    saved = []
    for name, stand_in in (("runtime", cuda_runtime), ("driver", cuda_driver)):
        full = f"cuda.bindings.{name}"
        saved.append((name, full, getattr(package, name, None), sys.modules.get(full)))
        setattr(package, name, stand_in)
        sys.modules[full] = stand_in

    def undo() -> None:
        for name, full, attr, module in saved:
            if attr is None:
                delattr(package, name)
            else:
                setattr(package, name, attr)
            if module is None:
                sys.modules.pop(full, None)
            else:
                sys.modules[full] = module

    return undo


def _install_tensorrt() -> Callable[[], None]:
    """TensorRT's ``Runtime``/``ICudaEngine``/``IExecutionContext``/``IRuntimeConfig`` ->
    :mod:`.tensorrt_runtime` (imported here: it pulls in the interpreter and the builder)."""
    from trt_kv.emulator import tensorrt_runtime

    return tensorrt_runtime.install()


# the stand-ins, installed in this order before the registered installers
_BUILT_IN: tuple[Installer, ...] = (
    _install_cuda_modules,
    polygraphy_cuda.install,
    _install_tensorrt,
)


@contextmanager
def emulated_gpu(
    compute_capability: tuple[int, int] | None = None,
    engines: Iterable[str | Path] = (),
    rebuild: RebuildFn | None = None,
) -> Iterator[None]:
    """Run the block on the emulated GPU; nested blocks share one activation. Everything
    installed is restored on exit of the outermost block, even when it raises. Leaving the
    outermost block completes the stream work still queued (its errors raise
    :class:`~trt_kv.emulator.streams.StreamWorkError` there), or drops it when the block
    raised (it may write host buffers the failure released).

    ``compute_capability``: the device's ``(major, minor)`` (None: the default 8.9, or the
    enclosing block's); ``cudaDeviceGetAttribute``, ``cudaGetDeviceProperties`` and the
    emulated TensorRT-RTX's refusal of engines that cannot run on it answer from it.
    ``engines`` (files, or folders of ``*.engine``): the engine files built outside this
    process the emulated TensorRT may deserialize, by rebuilding the network of each
    sidecar's ``recipe`` with ``rebuild(recipe, metadata) -> (network, profiles, keep)``
    (None: the enclosing block's; trt_kv's is
    ``trt_kv.engine.recipes.recipe_rebuilder(models)``, see :mod:`trt_kv.emulator.engines`);
    without one such an engine is refused. Engines built in the process need neither.

    Raises:
        EmulatorError: a nested block asking for another compute capability than the
            active one.
    """
    from trt_kv.emulator import engines as _engines

    with LOCK:
        active = ACTIVE["cc"]
        if active is not None and compute_capability not in (None, active):
            raise EmulatorError(
                f"emulated_gpu(compute_capability={compute_capability}): expected the active "
                f"block's {active} or None, got another (one device, one capability)"
            )
        if ACTIVE["depth"] == 0:
            ACTIVE["undo"] = _install_all()
            device().compute_capability = compute_capability or DEFAULT_COMPUTE_CAPABILITY
            ACTIVE["cc"] = device().compute_capability
        ACTIVE["depth"] += 1
        _engines.add_sources(engines, rebuild)
    failed = True
    try:
        yield
        failed = False
    finally:
        with LOCK:
            _engines.drop_rebuild(rebuild)
            ACTIVE["depth"] -= 1
            if ACTIVE["depth"] == 0:
                try:
                    _finish_queued_work(failed)
                finally:
                    for step in reversed(ACTIVE["undo"]):
                        step()
                    ACTIVE["undo"] = []
                    ACTIVE["cc"] = None
                    _engines.clear_sources()


def _install_all() -> list[Callable[[], None]]:
    """Run the stand-ins' installers, then the registered ones; returns their undos, in
    order. The registry is read again after each installer, so that one registered while
    they run (by a module a stand-in imports) runs too. On failure, undoes what ran and
    raises."""
    undo: list[Callable[[], None]] = []
    try:
        for installer in _BUILT_IN:
            undo.append(installer())
        done = 0
        while done < len(registered := installers()):
            undo.append(registered[done]())
            done += 1
    except BaseException:
        for step in reversed(undo):
            step()
        raise
    return undo


def _finish_queued_work(failed: bool) -> None:
    """Complete the queued stream work (raising what it raises), or drop it after a failure."""
    queue = device().queue
    if failed:
        queue.discard()
        return
    try:
        queue.complete_all("leaving emulated_gpu()")
    except BaseException:
        queue.discard()
        raise
