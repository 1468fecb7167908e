"""Counting mode: what a block of code asks of the emulated device.

``with counting() as counts: ...`` records every emulated CUDA runtime/driver call by name
(``counts.calls["cudaMemcpyAsync"]``), every call of the emulated TensorRT execution context
by method name (``counts.trt["set_input_shape"]``) and the bytes each copy moves by direction
(``counts.bytes["HD"]``: host to device; ``"DH"``, ``"DD"``, ``"HH"``), counted when the call
is made (deferred work is counted once, when submitted). Blocks nest; each sees the calls
made inside it. Emulated figures: they count what trt_kv asks for, not what a GPU spends.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Counts:
    """CUDA calls and TensorRT context calls by name, and copied bytes by direction
    (``"HD"``, ``"DH"``, ``"DD"``, ``"HH"``) inside one :func:`counting` block."""

    calls: Counter[str] = field(default_factory=Counter)
    trt: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)


_ACTIVE: list[Counts] = []
_INSIDE: list[str] = []  # counted methods running now (the emulator is single-threaded)


@contextmanager
def counting() -> Iterator[Counts]:
    """Count the emulated device's calls and copied bytes made inside the block."""
    counts = Counts()
    _ACTIVE.append(counts)
    try:
        yield counts
    finally:
        _ACTIVE.remove(counts)


def record_call(name: str) -> None:
    """One CUDA call of ``name`` (the emulated API's entry points report here)."""
    for counts in _ACTIVE:
        counts.calls[name] += 1


def counted_methods(cls: type) -> type:
    """Class decorator: every public method of ``cls`` counts its calls in ``Counts.trt``
    (the caller's calls only: one method calling another inside the stand-in is not
    counted again)."""
    for name, method in list(vars(cls).items()):
        if callable(method) and not name.startswith("_"):
            setattr(cls, name, _counted(name, method))
    return cls


def _counted(name: str, method: Callable) -> Callable:
    @functools.wraps(method)
    def call(*args: object, **kwargs: object) -> object:
        if not _INSIDE:
            for counts in _ACTIVE:
                counts.trt[name] += 1
        _INSIDE.append(name)
        try:
            return method(*args, **kwargs)
        finally:
            _INSIDE.pop()

    return call


def record_copy(kind: str, nbytes: int) -> None:
    """A copy of ``nbytes`` in direction ``kind`` (``"HD"``...) was submitted."""
    for counts in _ACTIVE:
        counts.bytes[kind] += nbytes
