"""Host-side cache state: one length counter per slot, and every per-step tensor derived
from it (write indices, key/value lengths, RoPE positions, last-token rows).

Pure Python/NumPy; nothing here touches a device. Every check runs before a step is planned,
so a bad request never reaches an engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from trt_kv.errors import CacheOverflowError, ShapeError, SlotError, mismatch


@dataclass(frozen=True)
class StepPlan:
    """The inputs of one step over slots ``lo .. lo + B - 1`` with S new-token columns."""

    lo: int
    counts: np.ndarray  # [B] int64, new tokens per sequence (<= S)
    input_ids: np.ndarray  # [B, S] int32, right-padded with 0
    position_ids: np.ndarray  # [B, S] int64, cache row of each token
    write_indices: np.ndarray  # [B] int32, first row written (= length before the step)
    kv_lengths: np.ndarray  # [B] int32, valid keys after the step
    last_token_rows: np.ndarray  # [B] int32, b * S + counts[b] - 1

    @property
    def slots(self) -> range:
        return range(self.lo, self.lo + len(self.counts))

    @property
    def update_lengths(self) -> np.ndarray:
        """``[B + 1]`` int32 cumulative token counts (the packed form's ``update_lengths``)."""
        return np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int32)


class CacheState:
    """Lengths of ``capacity`` cache slots of ``max_seq_len`` rows each."""

    def __init__(self, capacity: int, max_seq_len: int, max_step_tokens: int | None = None) -> None:
        self.capacity = capacity
        self.max_seq_len = max_seq_len
        self.max_step_tokens = max_seq_len if max_step_tokens is None else max_step_tokens
        self._lengths = np.zeros(capacity, dtype=np.int64)
        self._frozen = False

    # -- queries -----------------------------------------------------------------------
    def length(self, slot: int) -> int:
        """Tokens cached in ``slot``."""
        return int(self._lengths[self._check_slot(slot)])

    @property
    def lengths(self) -> np.ndarray:
        """``[capacity]`` cached tokens per slot (a copy)."""
        return self._lengths.copy()

    @property
    def frozen(self) -> bool:
        return self._frozen

    def _check_slot(self, slot: int) -> int:
        if not isinstance(slot, (int, np.integer)) or not 0 <= slot < self.capacity:
            raise SlotError(mismatch("slot", f"an integer in [0, {self.capacity})", "", slot))
        return int(slot)

    # -- planning ----------------------------------------------------------------------
    def plan(self, slots: Sequence[int], tokens: Sequence[Sequence[int]] | np.ndarray) -> StepPlan:
        """Plan one step feeding ``tokens[k]`` to ``slots[k]``.

        ``tokens`` is one list per slot (ragged), or an integer array ``[B, S]`` when every
        slot gets S tokens (the decode fast path: no per-sequence Python work).

        ``slots`` must be consecutive (``lo, lo + 1, ...``): each step binds one contiguous
        window of the cache buffers. Use :meth:`reorder` to gather sequences first.

        Raises:
            SlotError: no slots, unknown or non-consecutive slots, more than ``capacity``,
                a sequence with no tokens.
            ShapeError: S > ``max_step_tokens`` (the engine's profile bound).
            CacheOverflowError: ``length + S > S_max`` for a slot (S = the padded width, since
                the padded update writes S rows).
        """
        b = len(slots)
        if b == 0 or b != len(tokens):
            raise SlotError(
                mismatch("slots", "one non-empty token list per slot", len(slots), len(tokens))
            )
        if b > self.capacity:
            raise SlotError(mismatch("batch", f"at most capacity = {self.capacity}", "", b))
        lo = self._check_slot(slots[0])
        consecutive = isinstance(slots, range) and slots.step == 1
        if not consecutive and list(slots) != list(range(lo, lo + b)):
            raise SlotError(
                mismatch("slots", "consecutive slots", list(range(lo, lo + b)), list(slots))
            )
        self._check_slot(lo + b - 1)
        if isinstance(tokens, np.ndarray):
            if tokens.ndim != 2 or tokens.shape[1] == 0:
                raise SlotError(mismatch("tokens", "an array [B, S] with S >= 1", "", tokens.shape))
            s = tokens.shape[1]
            counts = np.full(b, s, dtype=np.int64)
            input_ids = tokens.astype(np.int32)
        else:
            counts = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=b)
            if (counts == 0).any():
                empty = int(slots[int(np.argmin(counts))])
                raise SlotError(mismatch(f"slot {empty}", "at least one new token", ">= 1", 0))
            s = int(counts.max())
            input_ids = np.zeros((b, s), dtype=np.int32)
            for k, t in enumerate(tokens):
                input_ids[k, : len(t)] = t
        if s > self.max_step_tokens:
            raise ShapeError(
                mismatch("tokens", "at most max_step_tokens per step", self.max_step_tokens, s)
            )
        start = self._lengths[lo : lo + b]
        if int(start.max()) + s > self.max_seq_len:
            k = int(np.argmax(start))
            raise CacheOverflowError(
                f"slot {lo + k}: expected length + S <= S_max = {self.max_seq_len}, "
                f"got {int(start[k])} + {s} = {int(start[k]) + s}"
            )
        return StepPlan(
            lo=lo,
            counts=counts,
            input_ids=input_ids,
            position_ids=start[:, None] + np.arange(s, dtype=np.int64)[None, :],
            write_indices=start.astype(np.int32),
            kv_lengths=(start + counts).astype(np.int32),
            last_token_rows=(np.arange(b) * s + counts - 1).astype(np.int32),
        )

    def commit(self, plan: StepPlan) -> None:
        """Advance the planned slots by their token counts (not while frozen)."""
        if not self._frozen:
            self._lengths[plan.lo : plan.lo + len(plan.counts)] += plan.counts

    # -- cache operations (lengths only; the storage moves the data) ---------------------
    def reset(self, slot: int | None = None) -> None:
        """Forget every slot, or one."""
        if slot is None:
            self._lengths[:] = 0
        else:
            self._lengths[self._check_slot(slot)] = 0

    def crop(self, slot: int, length: int) -> None:
        """Keep the first ``length`` tokens of ``slot`` (Hugging Face ``DynamicCache.crop``)."""
        current = self.length(slot)
        if length < 0:
            length = max(current + length, 0)  # crop(slot, -n) drops the last n, like HF
        if length > current:
            raise CacheOverflowError(
                mismatch(f"slot {slot}", "crop length <= current length", current, length)
            )
        self._lengths[slot] = length

    def set_length(self, slot: int, length: int) -> None:
        """Declare ``slot`` to hold ``length`` tokens (after a restore or import)."""
        self._check_slot(slot)
        if not 0 <= length <= self.max_seq_len:
            raise CacheOverflowError(
                mismatch(f"slot {slot}", f"length in [0, {self.max_seq_len}]", "", length)
            )
        self._lengths[slot] = length

    def fork(self, src: int, dst: int) -> None:
        """``dst`` continues from ``src``'s prefix."""
        self._lengths[self._check_slot(dst)] = self.length(src)

    def reorder(self, order: Sequence[int]) -> None:
        """Slot k takes the state of slot ``order[k]`` (beam search ``reorder_cache``);
        ``order`` may repeat or drop slots and may be shorter than ``capacity``."""
        for s in order:
            self._check_slot(s)
        n = len(order)
        if n > self.capacity:
            raise SlotError(mismatch("order", f"at most {self.capacity} slots", "", n))
        self._lengths[:n] = self._lengths[list(order)]

    def freeze(self) -> None:
        """Run later steps without committing their tokens (speculative or scoring steps)."""
        self._frozen = True

    def unfreeze(self) -> None:
        self._frozen = False

    @contextmanager
    def frozen_steps(self) -> Iterator[None]:
        """``freeze()`` for the duration of a ``with`` block."""
        previous, self._frozen = self._frozen, True
        try:
            yield
        finally:
            self._frozen = previous
