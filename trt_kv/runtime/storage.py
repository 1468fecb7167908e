"""Cache storage: the K/V buffers of every layer, ``[capacity, N, S_max, H]`` each.

One interface, two homes: :class:`HostCaches` (NumPy arrays, for the reference and the
interpreter) and ``DeviceCaches`` (device memory through cuda-python, in
``trt_kv.runtime.device``). Slot-level operations (fork, reorder, snapshot, restore, legacy
import/export) are written once here, on four primitives each home implements.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from trt_kv import dtypes
from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.builder.model_caches import cache_names
from trt_kv.errors import ShapeError, mismatch

Snapshot = dict[str, np.ndarray]  # cache input name -> [N, L, H] rows of one slot


class CacheStorage(ABC):
    """Buffers for ``aliases`` (one per cache input) with ``capacity`` slots."""

    def __init__(self, aliases: Sequence[CacheAlias], capacity: int) -> None:
        self.aliases = list(aliases)
        self.capacity = capacity
        _, n, s_max, h = self.aliases[0].shape
        self.max_seq_len = s_max
        self.slot_shape = (n, s_max, h)

    # -- primitives ------------------------------------------------------------------
    @abstractmethod
    def zero(self, slot: int | None = None) -> None:
        """Zero every slot, or one."""

    @abstractmethod
    def copy_slot(self, src: int, dst: int) -> None:
        """Copy every cache's slot ``src`` onto slot ``dst``."""

    @abstractmethod
    def read_slot(self, name: str, slot: int) -> np.ndarray:
        """Host copy ``[N, S_max, H]`` of one cache's slot."""

    @abstractmethod
    def write_slot(self, name: str, slot: int, rows: np.ndarray) -> None:
        """Write ``rows [N, L, H]`` into the first L rows of one cache's slot."""

    # -- derived -----------------------------------------------------------------------
    def nbytes(self) -> dict[str, int]:
        """Bytes per cache buffer."""
        per_slot = int(np.prod(self.slot_shape))
        return {
            a.input: self.capacity * per_slot * dtypes.to_numpy(a.dtype).itemsize
            for a in self.aliases
        }

    def reorder(self, order: Sequence[int]) -> None:
        """Slot k takes the contents of slot ``order[k]`` (slots may repeat or drop)."""
        saved = {s: {a.input: self.read_slot(a.input, s) for a in self.aliases} for s in set(order)}
        for k, s in enumerate(order):
            for name, rows in saved[s].items():
                self.write_slot(name, k, rows)

    def snapshot(self, slot: int, length: int) -> Snapshot:
        """Host copies ``[N, length, H]`` of one slot's caches."""
        return {a.input: self.read_slot(a.input, slot)[:, :length].copy() for a in self.aliases}

    def restore(self, slot: int, snap: Snapshot) -> int:
        """Write a snapshot back into ``slot``; returns its length."""
        lengths = {rows.shape[1] for rows in snap.values()}
        if set(snap) != {a.input for a in self.aliases} or len(lengths) != 1:
            raise ShapeError(
                mismatch(
                    "snapshot",
                    "one [N, L, H] array per cache",
                    sorted(a.input for a in self.aliases),
                    sorted(snap),
                )
            )
        for name, rows in snap.items():  # check all before writing any: nothing half-written
            self._check_rows(name, rows)
        for name, rows in snap.items():
            self.write_slot(name, slot, rows)
        return lengths.pop()

    def _check_rows(self, name: str, rows: np.ndarray) -> None:
        n, s_max, h = self.slot_shape
        if rows.ndim != 3 or rows.shape[0] != n or rows.shape[2] != h or rows.shape[1] > s_max:
            raise ShapeError(mismatch(name, "rows shape", (n, f"L <= {s_max}", h), rows.shape))

    def export_legacy(self, slots: Sequence[int], length: int) -> tuple:
        """Hugging Face legacy ``past_key_values``: per layer ``(key, value)``, each
        ``[len(slots), N, length, H]``."""
        layers = len(self.aliases) // 2
        out = []
        for i in range(layers):
            k, v, *_ = cache_names(i)
            out.append(
                tuple(
                    np.stack([self.read_slot(name, s)[:, :length] for s in slots])
                    for name in (k, v)
                )
            )
        return tuple(out)

    def import_legacy(
        self, past: Sequence[tuple[np.ndarray, np.ndarray]], slots: Sequence[int]
    ) -> int:
        """Inverse of :meth:`export_legacy`; returns the sequence length imported."""
        if len(past) * 2 != len(self.aliases):
            raise ShapeError(
                mismatch("past_key_values", "layers", len(self.aliases) // 2, len(past))
            )
        named = [
            (name, arr)
            for i, pair in enumerate(past)
            for name, arr in zip(cache_names(i)[:2], pair)
        ]
        for name, arr in named:  # check all before writing any: nothing half-written
            if arr.ndim != 4 or arr.shape[0] != len(slots):
                raise ShapeError(mismatch(name, "shape [B, N, L, H] with B", len(slots), arr.shape))
            self._check_rows(name, arr[0])
        lengths = sorted({arr.shape[2] for _, arr in named})
        if len(lengths) != 1:
            raise ShapeError(
                mismatch("past_key_values", "one length L for every layer", "", lengths)
            )
        for name, arr in named:
            for b, s in enumerate(slots):
                self.write_slot(name, s, arr[b])
        return past[0][0].shape[2]


class HostCaches(CacheStorage):
    """Caches as NumPy arrays ``[capacity, N, S_max, H]``; steps bind views of a window."""

    def __init__(self, aliases: Sequence[CacheAlias], capacity: int) -> None:
        super().__init__(aliases, capacity)
        self.arrays = {
            a.input: np.zeros((capacity, *self.slot_shape), dtypes.to_numpy(a.dtype))
            for a in self.aliases
        }

    def window(self, lo: int, b: int) -> dict[str, np.ndarray]:
        """In-place views ``[b, N, S_max, H]`` of slots ``lo .. lo + b - 1``."""
        return {name: arr[lo : lo + b] for name, arr in self.arrays.items()}

    def zero(self, slot: int | None = None) -> None:
        for arr in self.arrays.values():
            if slot is None:
                arr[...] = 0
            else:
                arr[slot] = 0

    def copy_slot(self, src: int, dst: int) -> None:
        for arr in self.arrays.values():
            arr[dst] = arr[src]

    def read_slot(self, name: str, slot: int) -> np.ndarray:
        return self.arrays[name][slot].copy()

    def write_slot(self, name: str, slot: int, rows: np.ndarray) -> None:
        arr = self.arrays[name]
        arr[slot, :, : rows.shape[1]] = rows.astype(arr.dtype, copy=False)
