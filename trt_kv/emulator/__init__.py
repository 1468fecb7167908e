"""An emulated GPU: run trt_kv's GPU code paths on a CPU, unchanged.

``with emulated_gpu(): ...`` installs CPU stand-ins where trt_kv and Polygraphy look the CUDA
API up: ``cuda.bindings.runtime`` / ``driver`` (:mod:`.cuda_runtime`, :mod:`.cuda_driver`),
``polygraphy.cuda.wrapper()`` (:mod:`.polygraphy_cuda`), and whatever extra installers are
registered (the TensorRT runtime). Device memory lives in host memory behind integer pointers
(:mod:`.memory`); the device outlives the block (:func:`trt_kv.emulator.device.device`), like a
real GPU. Stream work is deferred until a synchronizing call needs it (:mod:`.streams`), so code
that reads a result before CUDA guarantees it fails here as it would (racily) on a GPU. Results
on it are "emulated", never "verified on GPU".

Nothing in trt_kv's product path imports this package; tests and ``--emulate-gpu`` do.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from trt_kv.emulator import cuda_driver, cuda_runtime, polygraphy_cuda
from trt_kv.emulator.counting import Counts, counting
from trt_kv.emulator.cuda_runtime import submit
from trt_kv.emulator.device import DEFAULT_COMPUTE_CAPABILITY, CudaCallFailed, device
from trt_kv.emulator.memory import DeviceMemory, EmulatorError
from trt_kv.emulator.streams import StreamWorkError

if TYPE_CHECKING:  # the engine records import the interpreter: loaded on first activation
    from trt_kv.emulator.engines import RebuildFn

__all__ = [
    "Counts",
    "CudaCallFailed",
    "DeviceMemory",
    "EmulatorError",
    "StreamWorkError",
    "counting",
    "device",
    "emulated_gpu",
    "is_active",
    "provides",
    "register_installer",
    "submit",
]

Installer = Callable[[], Callable[[], None]]  # installs a stand-in; returns its undo


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


def _clear_gpu_probe() -> Callable[[], None]:
    """``gpu_unavailable_reason()`` is cached: forget its answer on entry and on exit."""
    from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason

    gpu_unavailable_reason.cache_clear()
    return gpu_unavailable_reason.cache_clear


def _install_tensorrt() -> Callable[[], None]:
    """TensorRT's ``Runtime``/``ICudaEngine``/``IExecutionContext``/``IRuntimeConfig`` ->
    :mod:`.tensorrt_runtime` (imported here: it pulls in the interpreter and the builder)."""
    from trt_kv.emulator import tensorrt_runtime

    return tensorrt_runtime.install()


_INSTALLERS: list[Installer] = [
    _install_cuda_modules,
    polygraphy_cuda.install,
    _install_tensorrt,
    _clear_gpu_probe,
]
_PROVIDES = {"cuda", "polygraphy", "tensorrt"}
_LOCK = threading.RLock()
_ACTIVE: dict[str, object] = {"depth": 0, "undo": [], "cc": None}


def register_installer(installer: Installer, provides: str | None = None) -> None:
    """Run ``installer`` on every activation (after the CUDA stand-ins); its return value is
    called on exit. ``provides`` names what it emulates (``"tensorrt"`` for the TensorRT
    runtime; see :func:`provides`). Registering the same installer twice has no effect."""
    with _LOCK:
        if installer not in _INSTALLERS:
            _INSTALLERS.append(installer)
        if provides:
            _PROVIDES.add(provides)


def provides() -> frozenset[str]:
    """What an activation emulates: ``"cuda"``, ``"polygraphy"``, plus what registered
    installers provide (``"tensorrt"`` once the TensorRT runtime stand-in is registered)."""
    return frozenset(_PROVIDES)


def is_active() -> bool:
    """Whether an :func:`emulated_gpu` block is active."""
    return _ACTIVE["depth"] > 0


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

    with _LOCK:
        active = _ACTIVE["cc"]
        if active is not None and compute_capability not in (None, active):
            raise EmulatorError(
                f"emulated_gpu(compute_capability={compute_capability}): expected the active "
                f"block's {active} or None, got another (one device, one capability)"
            )
        if _ACTIVE["depth"] == 0:
            undo: list[Callable[[], None]] = []
            try:
                for installer in _INSTALLERS:
                    undo.append(installer())
            except BaseException:
                for step in reversed(undo):
                    step()
                raise
            _ACTIVE["undo"] = undo
            device().compute_capability = compute_capability or DEFAULT_COMPUTE_CAPABILITY
            _ACTIVE["cc"] = device().compute_capability
        _ACTIVE["depth"] += 1
        _engines.add_sources(engines, rebuild)
    failed = True
    try:
        yield
        failed = False
    finally:
        with _LOCK:
            _engines.drop_rebuild(rebuild)
            _ACTIVE["depth"] -= 1
            if _ACTIVE["depth"] == 0:
                try:
                    _finish_queued_work(failed)
                finally:
                    for step in reversed(_ACTIVE["undo"]):
                        step()
                    _ACTIVE["undo"] = []
                    _ACTIVE["cc"] = None
                    _engines.clear_sources()


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
