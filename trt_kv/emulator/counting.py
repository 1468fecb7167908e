"""Counting mode: what a block of code asks of the emulated device.

``with counting() as counts: ...`` records every emulated CUDA runtime/driver call by name
(``counts.calls["cudaMemcpyAsync"]``) and the bytes each copy moves by direction
(``counts.bytes["HD"]``: host to device; ``"DH"``, ``"DD"``, ``"HH"``), counted when the call
is made (deferred work is counted once, when submitted). Blocks nest; each sees the calls
made inside it. Emulated figures: they count what trt_kv asks for, not what a GPU spends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Counts:
    """Calls by API name and copied bytes by direction (``"HD"``, ``"DH"``, ``"DD"``,
    ``"HH"``) inside one :func:`counting` block."""

    calls: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)


_ACTIVE: list[Counts] = []


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
    """One call of ``name`` (the emulated API's entry points report here)."""
    for counts in _ACTIVE:
        counts.calls[name] += 1


def record_copy(kind: str, nbytes: int) -> None:
    """A copy of ``nbytes`` in direction ``kind`` (``"HD"``...) was submitted."""
    for counts in _ACTIVE:
        counts.bytes[kind] += nbytes
