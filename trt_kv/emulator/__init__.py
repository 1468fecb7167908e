"""An emulated GPU: run trt_kv's GPU code paths on a CPU, unchanged.

``with emulated_gpu(): ...`` installs CPU stand-ins where trt_kv and Polygraphy look the CUDA
API up: ``cuda.bindings.runtime`` / ``driver`` (:mod:`.cuda_runtime`, :mod:`.cuda_driver`),
``polygraphy.cuda.wrapper()`` (:mod:`.polygraphy_cuda`), TensorRT's runtime classes
(:mod:`.tensorrt_runtime`), then whatever installers are registered (:mod:`.hooks`). Device
memory lives in host memory behind integer pointers (:mod:`.memory`); the device outlives the
block (:func:`trt_kv.emulator.device.device`), like a real GPU. Stream work is deferred until
a synchronizing call needs it (:mod:`.streams`), so code that reads a result before CUDA
guarantees it fails here as it would (racily) on a GPU. Results on it are "emulated", never
"verified on GPU". See :mod:`.activation` for :func:`emulated_gpu` itself.

The emulator sits beside the runtime and below it: it imports nothing above the runtime (the
builder, the engine file format, the interpreter, the plugin kernels, ``trt_kv._trt``, never
the runtime, the models, the engine store or the CLI). Engines built in another process are
rebuilt from their sidecar's recipe by a function passed in as ``emulated_gpu(rebuild=...)``
(trt_kv's is ``trt_kv.engine.recipes.recipe_rebuilder``; see :mod:`.engines`).

The product enters by one door: :mod:`trt_kv.runtime.gpu.cuda` imports
:func:`register_installer` from :mod:`.hooks` to have its cached GPU probe forgotten on entry
to and exit from every block. Importing this package for that loads none of the stand-ins:
the names below come from their modules on first use. Nothing else in trt_kv's product path
imports the emulator; tests and ``--emulate-gpu`` do.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

from trt_kv.emulator.hooks import Installer, is_active, provides, register_installer

if TYPE_CHECKING:
    from trt_kv.emulator.activation import emulated_gpu
    from trt_kv.emulator.counting import Counts, counting
    from trt_kv.emulator.cuda_runtime import submit
    from trt_kv.emulator.device import CudaCallFailed, device
    from trt_kv.emulator.memory import DeviceMemory, EmulatorError
    from trt_kv.emulator.streams import StreamWorkError

__all__ = [
    "Counts",
    "CudaCallFailed",
    "DeviceMemory",
    "EmulatorError",
    "Installer",
    "StreamWorkError",
    "counting",
    "device",
    "emulated_gpu",
    "is_active",
    "provides",
    "register_installer",
    "submit",
]

# name -> the module of this package that defines it, imported on first use
_LAZY = {
    "Counts": "counting",
    "counting": "counting",
    "CudaCallFailed": "device",
    "device": "device",
    "DeviceMemory": "memory",
    "EmulatorError": "memory",
    "StreamWorkError": "streams",
    "submit": "cuda_runtime",
    "emulated_gpu": "activation",
}


class _Package(types.ModuleType):
    """This package: the names of :data:`_LAZY` load their module on first use."""

    def __getattr__(self, name: str) -> object:
        if name not in _LAZY:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{self.__name__}.{_LAZY[name]}"), name)
        setattr(self, name, value)
        return value

    def __setattr__(self, name: str, value: object) -> None:
        # ``device`` and ``counting`` each name a function and the module defining it; the
        # import system binds the module on the package when it loads: keep the function
        if _LAZY.get(name) == name and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
