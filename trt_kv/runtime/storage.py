"""Cache storage: the K/V buffers of every layer, ``[capacity, N, S_max, H]`` each.

One interface, two homes: :class:`HostCaches` (NumPy arrays, for the reference and the
interpreter) and ``DeviceCaches`` (device memory through cuda-python, in
``trt_kv.runtime.gpu.device``). Slot-level operations (fork, reorder, snapshot, restore, legacy
import/export) are written once here, on four primitives each home implements.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence

import ml_dtypes
import numpy as np

from trt_kv import dtypes
from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.builder.model_caches import cache_names
from trt_kv.errors import ArgumentError, DTypeError, ShapeError, mismatch

Snapshot = dict[str, np.ndarray]  # cache input name -> [N, L, H] rows of one slot
SCRATCH = -1  # the slot a reorder parks one slot of a cycle in (beside the capacity)


def reorder_moves(order: Sequence[int]) -> list[tuple[int, int]]:
    """Slot copies ``(src, dst)`` that give slot k the contents of slot ``order[k]``.

    A slot is written once, and only after every slot that reads its old contents has
    copied them; a cycle (``[1, 0]``: a swap) saves one of its slots to :data:`SCRATCH`
    first. So a permutation of B slots in C cycles is B - (fixed points) + C copies: a beam
    of 4 swapped in pairs moves 4 slots and 2 scratch saves. Slots at or past
    ``len(order)``, and slots that keep their own contents, are not touched.
    """
    reads = {k: s for k, s in enumerate(order) if s != k}  # dst -> src, still to copy
    moves: list[tuple[int, int]] = []
    while reads:
        wanted = Counter(reads.values())  # slots whose old contents are still to be read
        ready = [k for k in reads if not wanted[k]]
        if not ready:  # every slot left is read by another: cycles; park one slot
            parked = next(iter(reads))
            moves.append((parked, SCRATCH))
            reads = {k: SCRATCH if s == parked else s for k, s in reads.items()}
            continue
        moves.extend((reads.pop(k), k) for k in ready)
    return moves


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
    def zero(self, slot: int | None = None, count: int = 1) -> None:
        """Zero every slot, or ``count`` slots from ``slot`` on (one fill per cache)."""

    @abstractmethod
    def copy_slot(self, src: int, dst: int) -> None:
        """Copy every cache's slot ``src`` onto slot ``dst``; either may be :data:`SCRATCH`
        once :meth:`reserve_scratch` has run."""

    @abstractmethod
    def reserve_scratch(self) -> None:
        """Hold one more slot per cache, :data:`SCRATCH`, from now on (idempotent)."""

    @abstractmethod
    def read_slot(self, name: str, slot: int) -> np.ndarray:
        """Host copy ``[N, S_max, H]`` of one cache's slot."""

    @abstractmethod
    def write_slot(self, name: str, slot: int, rows: np.ndarray) -> None:
        """Write ``rows [N, L, H]`` into the first L rows of one cache's slot."""

    def check_window(self, lo: int) -> None:
        """Raise SlotError if a step's window of slots cannot start at ``lo`` (any slot can
        here; device storage needs 256-byte aligned window addresses)."""
        return None  # host arrays: a window may start at any slot

    # -- derived -----------------------------------------------------------------------
    def nbytes(self) -> dict[str, int]:
        """Bytes per cache buffer."""
        per_slot = int(np.prod(self.slot_shape))
        return {
            a.input: self.capacity * per_slot * dtypes.to_numpy(a.dtype).itemsize
            for a in self.aliases
        }

    def reorder(self, order: Sequence[int]) -> None:
        """Slot k takes the contents of slot ``order[k]`` (slots may repeat or drop), by slot
        copies inside the storage (:func:`reorder_moves`: each slot written at most once, a
        cycle through the scratch slot), never through a host round trip."""
        moves = reorder_moves(order)
        if any(SCRATCH in move for move in moves):
            self.reserve_scratch()  # before the first copy: a failure changes no slot
        for src, dst in moves:
            self.copy_slot(src, dst)

    def snapshot(self, slot: int, length: int) -> Snapshot:
        """Host copies ``[N, length, H]`` of one slot's caches."""
        return {a.input: self.read_slot(a.input, slot)[:, :length].copy() for a in self.aliases}

    def restore(self, slot: int, snap: Snapshot) -> int:
        """Write a snapshot back into ``slot``; returns its length. Every array is checked
        before any is written.

        Raises:
            ShapeError: not one ``[N, L, H]`` array per cache with a common L <= S_max.
            DTypeError: an array that is not floating point, or a finite value the cache
                dtype cannot hold (it would become inf).
        """
        names = sorted(a.input for a in self.aliases)
        if not isinstance(snap, dict) or sorted(snap) != names:
            got = sorted(snap) if isinstance(snap, dict) else type(snap).__name__
            raise ShapeError(mismatch("snapshot", "one [N, L, H] array per cache", names, got))
        rows = {name: self._check_rows(name, arr) for name, arr in snap.items()}
        lengths = sorted({r.shape[1] for r in rows.values()})
        if len(lengths) != 1:
            raise ShapeError(mismatch("snapshot", "one length L for every cache", "", lengths))
        for name, r in rows.items():
            self.write_slot(name, slot, r)
        return lengths[0]

    def _check_rows(self, name: str, rows: object) -> np.ndarray:
        """``rows [N, L <= S_max, H]`` cast to the cache dtype, or ShapeError / DTypeError."""
        n, s_max, h = self.slot_shape
        rows = as_array(name, rows)
        if rows.ndim != 3 or rows.shape[0] != n or rows.shape[2] != h or rows.shape[1] > s_max:
            raise ShapeError(mismatch(name, "rows shape", (n, f"L <= {s_max}", h), rows.shape))
        return cast_rows(name, rows, self.dtype(name))

    def dtype(self, name: str) -> np.dtype:
        """NumPy dtype of cache ``name``."""
        return dtypes.to_numpy(next(a.dtype for a in self.aliases if a.input == name))

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
        """Inverse of :meth:`export_legacy`; returns the sequence length imported. Every
        array is checked before any is written.

        Raises:
            ShapeError: not one ``(key, value)`` pair per layer; an array not
                ``[len(slots), N, L, H]``; layers of different L.
            DTypeError: as :meth:`restore`.
        """
        layers = len(self.aliases) // 2
        if isinstance(past, (str, bytes)) or not isinstance(past, Sequence):
            raise ShapeError(mismatch("past_key_values", "a sequence of layers", "", type(past)))
        if len(past) != layers:
            raise ShapeError(mismatch("past_key_values", "layers", layers, len(past)))
        named = []
        for i, pair in enumerate(past):
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
                got = len(pair) if isinstance(pair, Sequence) else type(pair).__name__
                raise ShapeError(mismatch(f"past_key_values[{i}]", "a (key, value) pair", "", got))
            named += list(zip(cache_names(i)[:2], pair))
        checked = []
        for name, arr in named:  # check all before writing any: nothing half-written
            arr = as_array(name, arr)
            if arr.ndim != 4 or arr.shape[0] != len(slots):
                raise ShapeError(mismatch(name, "shape [B, N, L, H] with B", len(slots), arr.shape))
            checked.append((name, [self._check_rows(name, a) for a in arr]))
        lengths = sorted({rows[0].shape[1] for _, rows in checked if rows})
        if len(lengths) != 1:
            raise ShapeError(
                mismatch("past_key_values", "one length L for every layer", "", lengths)
            )
        for name, rows in checked:
            for s, r in zip(slots, rows):
                self.write_slot(name, s, r)
        return lengths[0] if lengths else 0


def as_array(name: str, value: object) -> np.ndarray:
    """``value`` as a NumPy array; ShapeError (with the cause) for a ragged nesting."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as err:
        raise ShapeError(mismatch(name, "an array", "", type(value).__name__)) from err


def cast_rows(name: str, rows: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``rows`` in the cache ``dtype``; DTypeError when they are not floating point or a
    finite value would not fit (float32 1e6 -> float16 inf). NaN and inf pass as they are."""
    if rows.dtype.kind != "f" and rows.dtype != ml_dtypes.bfloat16:
        raise DTypeError(mismatch(name, "floating-point rows", "", f"dtype {rows.dtype}"))
    if rows.dtype == dtype:
        return rows
    with np.errstate(over="ignore", invalid="ignore"):
        cast = rows.astype(dtype)
        overflow = np.isinf(cast) & np.isfinite(rows)
    if overflow.any():
        worst = float(np.abs(rows.astype(np.float64)[overflow]).max())
        top = float(ml_dtypes.finfo(dtype).max)
        raise DTypeError(
            mismatch(name, f"values within {dtypes.name_of(dtype)} range +-{top:g}", "", worst)
        )
    return cast


class HostCaches(CacheStorage):
    """Caches as NumPy arrays ``[capacity, N, S_max, H]``; steps bind views of a window.

    ``wide_float16_caches``: float16 caches are float32 arrays holding float16 values, for an
    interpreter plan compiled with the same option (it reads them without widening; what
    it writes are float16 values already, as each update is declared float16). Every write
    here rounds to float16, and reads return
    float16 arrays, so only :attr:`arrays` and :meth:`nbytes` show the wider holder.

    Raises:
        ArgumentError: the caches do not fit host memory (naming capacity, S_max and the
            bytes asked for; NumPy's MemoryError is the cause).
    """

    def __init__(
        self, aliases: Sequence[CacheAlias], capacity: int, *, wide_float16_caches: bool = False
    ) -> None:
        super().__init__(aliases, capacity)
        shape = (capacity, *self.slot_shape)
        held = {a.input: self._held(a, wide_float16_caches) for a in self.aliases}
        self._scratch: dict[str, np.ndarray] = {}  # one slot per cache, made by a reorder
        try:
            self.arrays = {name: np.zeros(shape, dtype) for name, dtype in held.items()}
        except MemoryError as err:
            total = sum(dtype.itemsize for dtype in held.values())
            total *= int(np.prod(shape, dtype=np.int64))
            raise ArgumentError(
                mismatch(
                    f"caches [capacity={capacity}, N, S_max={shape[2]}, H] x {len(self.aliases)}",
                    "a size that fits host memory, asked for",
                    f"{total:,} bytes",
                    f"MemoryError ({err})",
                )
            ) from err

    @staticmethod
    def _held(alias: CacheAlias, wide_float16_caches: bool) -> np.dtype:
        """The dtype of the array holding a cache: its own, or float32 for a wide float16."""
        dtype = np.dtype(dtypes.to_numpy(alias.dtype))
        return np.dtype(np.float32) if wide_float16_caches and dtype == np.float16 else dtype

    def nbytes(self) -> dict[str, int]:
        return {name: arr.nbytes for name, arr in self.arrays.items()}

    def window(self, lo: int, b: int) -> dict[str, np.ndarray]:
        """In-place views ``[b, N, S_max, H]`` of slots ``lo .. lo + b - 1``."""
        return {name: arr[lo : lo + b] for name, arr in self.arrays.items()}

    def zero(self, slot: int | None = None, count: int = 1) -> None:
        for arr in self.arrays.values():
            if slot is None:
                arr[...] = 0
            else:
                arr[slot : slot + count] = 0

    def reserve_scratch(self) -> None:
        if not self._scratch:
            self._scratch = {name: np.empty_like(arr[0]) for name, arr in self.arrays.items()}

    def copy_slot(self, src: int, dst: int) -> None:
        for name, arr in self.arrays.items():
            to = self._scratch[name] if dst == SCRATCH else arr[dst]
            to[...] = self._scratch[name] if src == SCRATCH else arr[src]

    def read_slot(self, name: str, slot: int) -> np.ndarray:
        return self.arrays[name][slot].astype(self.dtype(name))  # a copy, in the cache dtype

    def write_slot(self, name: str, slot: int, rows: np.ndarray) -> None:
        rows = cast_rows(name, np.asarray(rows), self.dtype(name))  # rounded to the cache dtype
        self.arrays[name][slot, :, : rows.shape[1]] = rows
