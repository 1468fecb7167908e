"""The emulator's door for the product: :func:`register_installer`, and whether a block is on.

The runtime enters here, and only here: :mod:`trt_kv.runtime.gpu.cuda` registers the reset of
its cached GPU probe (``gpu_unavailable_reason``) as an installer, so that the probe is asked
again on entry to and exit from every :func:`~trt_kv.emulator.emulated_gpu` block, and the
emulator needs no import of the runtime. This module imports only the standard library, and
the package's ``__init__`` loads none of the CUDA and TensorRT stand-ins until they are asked
for: importing the runtime costs nothing more for it.

It also holds the activation state :func:`~trt_kv.emulator.emulated_gpu` keeps (:data:`LOCK`,
:data:`ACTIVE`), so that an installer registered while a block is active runs at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Installer = Callable[[], Callable[[], None]]  # installs a stand-in; returns its undo

LOCK = threading.RLock()
# depth: blocks entered and not left; undo: what the outermost block's exit undoes, in
# reverse; cc: the active device's compute capability (None outside a block)
ACTIVE: dict[str, object] = {"depth": 0, "undo": [], "cc": None}
_INSTALLERS: list[Installer] = []  # registered, in order; run after the built-in stand-ins
_PROVIDES = {"cuda", "polygraphy", "tensorrt"}


def register_installer(installer: Installer, provides: str | None = None) -> None:
    """Run ``installer`` on every activation (after the CUDA and TensorRT stand-ins); its
    return value is called on exit. Registered while a block is active, it runs at once and
    its undo with the outermost block's exit. ``provides`` names what it emulates
    (see :func:`provides`). Registering the same installer twice has no effect."""
    with LOCK:
        if installer not in _INSTALLERS:
            _INSTALLERS.append(installer)
            if ACTIVE["depth"]:
                ACTIVE["undo"].append(installer())
        if provides:
            _PROVIDES.add(provides)


def installers() -> list[Installer]:
    """The registered installers, in the order they run."""
    with LOCK:
        return list(_INSTALLERS)


def provides() -> frozenset[str]:
    """What an activation emulates: ``"cuda"``, ``"polygraphy"``, ``"tensorrt"`` (the
    TensorRT runtime), plus what registered installers provide."""
    return frozenset(_PROVIDES)


def is_active() -> bool:
    """Whether an :func:`~trt_kv.emulator.emulated_gpu` block is active."""
    return ACTIVE["depth"] > 0
