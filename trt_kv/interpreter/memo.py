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
        self._last: tuple | None = None  # (extra, arrays, their keys, value) of the last call

    def get(
        self, arrays: tuple[np.ndarray | None, ...], extra: tuple, derive: Callable[[], T]
    ) -> T:
        """``derive()``, or its value for the same ``arrays`` (None for an absent one) and
        ``extra`` (hashable plain values) as one of the last calls'. The same array objects
        as the last call's (a step's layers, one after another) are compared by their
        shapes, dtypes and bytes alone, without building and hashing the key."""
        last = self._last
        if last is not None and last[0] == extra and len(arrays) == len(last[1]):
            for a, b, k in zip(arrays, last[1], last[2]):
                if a is not b or (a is not None and _key(a) != k):
                    break
            else:
                return last[3]  # type: ignore[no-any-return]
        keys = tuple(None if a is None else _key(a) for a in arrays)
        key = (extra, *keys)
        entries = self._entries
        if key in entries:
            value = entries[key]
        else:
            value = derive()
            kept = entries if len(entries) < self.size else {}  # a new step's: start again
            self._entries = {**kept, key: value}
        self._last = (extra, arrays, keys, value)
        return value  # type: ignore[return-value]


def _key(a: np.ndarray) -> tuple:
    """What tells an array's values apart: its shape, dtype and bytes."""
    return a.shape, a.dtype.str, a.tobytes()


def frozen(a: np.ndarray) -> np.ndarray:
    """A C-contiguous, read-only copy of ``a`` (a value a :class:`Memo` shares: never a view
    of an array its caller may change)."""
    a = np.array(a, order="C", copy=True)
    a.flags.writeable = False
    return a
