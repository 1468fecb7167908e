"""What a step's layers derive alike from the same inputs, derived once a step.

A decode step's attention layers (30 in the default model) read the same mask and lengths,
its RoPE layers (60) the same positions, and each derives the same thing from them: the keys
attention reads and its keep mask, the table rows RoPE reads (~10-15 us a layer in Python).
A :class:`Memo` holds the last values of one such derivation, keyed by its inputs' shapes,
dtypes and bytes (an array changed in place, or another array with the same values, is told
apart by its bytes, never by its identity) and by the plain values given with them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

T = TypeVar("T")


class Memo:
    """The last values of one derivation (:meth:`get`), up to ``size`` keys (a step's Q and K
    RoPE layers read the same positions at two shapes); shared by the layers of every plan
    (plans that alternate derive again, as without it). The values are shared too: arrays in
    them should be read-only (:func:`frozen`). Safe across threads: the entries are one
    dict, read once and replaced whole."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._entries: dict[tuple, object] = {}

    def get(
        self, arrays: tuple[np.ndarray | None, ...], extra: tuple, derive: Callable[[], T]
    ) -> T:
        """``derive()``, or its value for the same ``arrays`` (None for an absent one) and
        ``extra`` (hashable plain values) as one of the last calls'."""
        key = (extra, *(None if a is None else (a.shape, a.dtype.str, a.tobytes()) for a in arrays))
        entries = self._entries
        if key in entries:
            return entries[key]  # type: ignore[return-value]
        value = derive()
        kept = entries if len(entries) < self.size else {}  # a new step's: start again
        self._entries = {**kept, key: value}
        return value


def frozen(a: np.ndarray) -> np.ndarray:
    """A C-contiguous, read-only copy of ``a`` (a value a :class:`Memo` shares: never a view
    of an array its caller may change)."""
    a = np.array(a, order="C", copy=True)
    a.flags.writeable = False
    return a
