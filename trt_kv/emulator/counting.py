"""Counting mode: what a block of code asks of the emulated device.

``with counting() as counts: ...`` records every emulated CUDA runtime/driver call by name
(``counts.calls["cudaMemcpyAsync"]``), every call of the emulated TensorRT execution context
by method name (``counts.trt["set_input_shape"]``) and the bytes each copy moves by direction
(``counts.bytes["HD"]``: host to device; ``"DH"``, ``"DD"``, ``"HH"``), counted when the call
is made (deferred work is counted once, when submitted). Only the caller's calls count: a
call the emulator makes inside another (TensorRT's stand-in checking its bindings, say) does
not. Blocks nest; each sees the calls made inside it. Emulated figures: they count what
trt_kv asks for, not what a GPU spends.

``counting(perform=False)`` also stubs the stream work out: copies, memsets, engine
enqueues and graph launches are checked and counted when submitted but never run; and
``counts.emulator_seconds`` is the time spent inside the emulated calls, so a timer around
the block, less that, measures the host's own work (results read back are garbage).
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Counts:
    """CUDA calls and TensorRT context calls by name, copied bytes by direction (``"HD"``,
    ``"DH"``, ``"DD"``, ``"HH"``) and seconds inside emulated calls, for one
    :func:`counting` block."""

    perform: bool = True  # False: stream work is counted, not run
    calls: Counter[str] = field(default_factory=Counter)
    trt: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    emulator_seconds: float = 0.0


_ACTIVE: list[Counts] = []
_INSIDE: list[str] = []  # emulated calls running now (the emulator is single-threaded)


@contextmanager
def counting(*, perform: bool = True) -> Iterator[Counts]:
    """Count the emulated device's calls and copied bytes made inside the block; with
    ``perform=False``, stream work submitted inside it is not run."""
    counts = Counts(perform=perform)
    _ACTIVE.append(counts)
    try:
        yield counts
    finally:
        _ACTIVE.remove(counts)


@contextmanager
def emulated_call(name: str, api: str) -> Iterator[None]:
    """One call of an emulated API (``api``: ``"cuda"`` or ``"trt"``): counted, and timed,
    where the caller made it; not where the emulator made it inside another call."""
    outermost = not _INSIDE
    if outermost:
        for counts in _ACTIVE:
            (counts.calls if api == "cuda" else counts.trt)[name] += 1
    _INSIDE.append(name)
    start = time.perf_counter()
    try:
        yield
    finally:
        _INSIDE.pop()
        if outermost:
            spent = time.perf_counter() - start
            for counts in _ACTIVE:
                counts.emulator_seconds += spent


def counted_methods(cls: type) -> type:
    """Class decorator: every public method of ``cls`` is an emulated TensorRT call."""
    for name, method in list(vars(cls).items()):
        if callable(method) and not name.startswith("_"):
            setattr(cls, name, _counted(name, method))
    return cls


def _counted(name: str, method: Callable) -> Callable:
    @functools.wraps(method)
    def call(*args: object, **kwargs: object) -> object:
        with emulated_call(name, "trt"):
            return method(*args, **kwargs)

    return call


def performing() -> bool:
    """Whether stream work submitted now is to run (no ``perform=False`` block is open)."""
    return all(counts.perform for counts in _ACTIVE)


def record_copy(kind: str, nbytes: int) -> None:
    """A copy of ``nbytes`` in direction ``kind`` (``"HD"``...) was submitted."""
    for counts in _ACTIVE:
        counts.bytes[kind] += nbytes
