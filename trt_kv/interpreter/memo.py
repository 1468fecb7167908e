"""What a step's layers derive alike from the same inputs, derived once a step.

A decode step's attention layers (30 in the default model) read the same mask and lengths,
its RoPE layers (60) the same positions, and each derives the same thing from them: the keys
attention reads and its keep mask, the table rows RoPE reads (~10-15 us a layer in Python).
A :class:`Memo` holds the last value of one such derivation, keyed by its inputs' shapes,
dtypes and bytes (an array changed in place, or another array with the same values, is told
apart by its bytes, never by its identity) and by the plain values given with them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

T = TypeVar("T")


class Memo:
    """The last value of one derivation (:meth:`get`); shared by the layers of every plan
    (one entry: plans that alternate derive again, as without it). The value is shared too:
    arrays in it should be read-only (:func:`frozen`). Safe across threads: the entry is
    one tuple, read once and replaced whole."""

    def __init__(self) -> None:
        self._last: tuple[tuple, object] | None = None

    def get(
        self, arrays: tuple[np.ndarray | None, ...], extra: tuple, derive: Callable[[], T]
    ) -> T:
        """``derive()``, or its value for the same ``arrays`` (None for an absent one) and
        ``extra`` (hashable plain values) as the last call's."""
        key = (extra, *(None if a is None else (a.shape, a.dtype.str, a.tobytes()) for a in arrays))
        last = self._last
        if last is not None and last[0] == key:
            return last[1]  # type: ignore[return-value]
        value = derive()
        self._last = (key, value)
        return value


def frozen(a: np.ndarray) -> np.ndarray:
    """A C-contiguous, read-only copy of ``a`` (a value a :class:`Memo` shares: never a view
    of an array its caller may change)."""
    a = np.array(a, order="C", copy=True)
    a.flags.writeable = False
    return a
