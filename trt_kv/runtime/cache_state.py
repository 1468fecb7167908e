"""Host-side cache state: one length counter per slot, and every per-step tensor derived
from it (write indices, key/value lengths, RoPE positions, last-token rows).

Pure Python/NumPy; nothing here touches a device. Every check runs before a step is planned,
so a bad request never reaches an engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np

from trt_kv.build_defaults import default_step_tokens
from trt_kv.errors import (
    ArgumentError,
    CacheOverflowError,
    DTypeError,
    ShapeError,
    SlotError,
    check_int,
    mismatch,
)


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
    # [B] int32, each sequence's length after the whole request: kv_lengths, except in the
    # chunks of a chunked prefill (the last chunk's). It picks longrope's table, as one Hugging
    # Face forward of the request would.
    rope_lengths: np.ndarray
    # [B] bool, the slots whose tokens count (None: all): a window step's idle slots take one
    # pad token the network writes past their cached rows, and commit leaves them as they were
    active: np.ndarray | None = None

    @property
    def slots(self) -> range:
        return range(self.lo, self.lo + len(self.counts))

    @property
    def update_lengths(self) -> np.ndarray:
        """``[B + 1]`` int32 cumulative token counts (the packed form's ``update_lengths``)."""
        return np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int32)


def token_rows(
    tokens: Sequence[Sequence[int]], lo: int, vocab_size: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Ragged token lists of slots ``lo, lo + 1, ...`` as one right-padded ``[B, S]`` int32
    array (padding 0) and the counts ``[B]`` int64. Every id is checked: an integer (never a
    float or bool, which NumPy would truncate) in ``[0, vocab_size)``.

    Raises:
        ShapeError: an entry that is not a 1-D list of ids.
        SlotError: an empty list.
        DTypeError, ArgumentError: see :func:`check_token_ids`.
    """
    rows = []
    for k, t in enumerate(tokens):
        name = f"slot {lo + k}"
        row = id_array(name, t)
        if row.ndim != 1:
            raise ShapeError(mismatch(name, "a 1-D list of token ids", "", repr(t)))
        if row.size == 0:
            raise SlotError(mismatch(name, "at least one new token", ">= 1", 0))
        check_token_ids(name, row, vocab_size)
        rows.append(row)
    counts = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    input_ids = np.zeros((len(rows), int(counts.max())), dtype=np.int32)
    for k, row in enumerate(rows):
        input_ids[k, : len(row)] = row
    return input_ids, counts


def id_array(name: str, ids: object) -> np.ndarray:
    """``ids`` as an array; a list must hold Python/NumPy integers only (NumPy would turn
    ``[1, True]`` into ``[1, 1]`` and ``[1, 2.0]`` into floats). Raises DTypeError for an
    element that is not an integer, ShapeError for a nested or ragged list."""
    if isinstance(ids, np.ndarray):
        return ids
    if isinstance(ids, (list, tuple)):
        for t in ids:
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer, list, tuple)):
                raise DTypeError(mismatch(name, "integer token ids", "", repr(t)))
    try:
        return np.asarray(ids)
    except (ValueError, TypeError) as err:
        raise ShapeError(mismatch(name, "a list of token ids", "", repr(ids))) from err


_UNSIGNED = {np.dtype(f"i{n}"): np.dtype(f"u{n}") for n in (1, 2, 4, 8)}


def check_token_ids(name: str, ids: np.ndarray, vocab_size: int | None) -> None:
    """Raise DTypeError unless ``ids`` are integers, ArgumentError unless each is in
    ``[0, vocab_size)`` (negative ids would wrap around, ids >= V index past the table).
    One reduction: viewed as unsigned, a negative id is larger than any vocabulary."""
    if ids.dtype.kind not in "iu":
        raise DTypeError(mismatch(name, "integer token ids", "", f"dtype {ids.dtype}"))
    top = np.iinfo(np.int32).max + 1 if vocab_size is None else vocab_size
    unsigned = _UNSIGNED.get(ids.dtype)
    if unsigned is not None:
        fits = int(ids.view(unsigned).max()) < top
    else:  # unsigned, or a non-native byte order
        fits = int(ids.min()) >= 0 and int(ids.max()) < top
    if fits:
        return
    lo, hi = int(ids.min()), int(ids.max())
    bad = lo if lo < 0 else hi
    raise ArgumentError(mismatch(name, f"token ids in [0, {top})", "", bad))


class CacheState:
    """Lengths of ``capacity`` cache slots of ``max_seq_len`` rows each; token ids are
    checked against ``vocab_size`` when given. ``max_step_tokens`` (the widest step
    :meth:`plan` takes) None: :func:`~trt_kv.build_defaults.default_step_tokens` of
    ``max_seq_len``, as a built network's."""

    def __init__(
        self,
        capacity: int,
        max_seq_len: int,
        max_step_tokens: int | None = None,
        vocab_size: int | None = None,
    ) -> None:
        self.capacity = check_int("capacity", capacity, 1)
        self.max_seq_len = check_int("max_seq_len", max_seq_len, 1)
        self.max_step_tokens = (
            default_step_tokens(self.max_seq_len)
            if max_step_tokens is None
            else check_int("max_step_tokens", max_step_tokens, 1)
        )
        self.vocab_size = None if vocab_size is None else check_int("vocab_size", vocab_size, 1)
        self._lengths = np.zeros(capacity, dtype=np.int64)
        self._frozen = False

    # -- queries -----------------------------------------------------------------------
    def length(self, slot: int) -> int:
        """Tokens cached in ``slot``."""
        return int(self._lengths[self.check_slot(slot)])

    @property
    def lengths(self) -> np.ndarray:
        """``[capacity]`` cached tokens per slot (a copy)."""
        return self._lengths.copy()

    @property
    def frozen(self) -> bool:
        return self._frozen

    def check_slot(self, slot: int) -> int:
        """``slot`` as an int; SlotError unless it is an integer in ``[0, capacity)``."""
        if (
            isinstance(slot, (bool, np.bool_))
            or not isinstance(slot, (int, np.integer))
            or not 0 <= slot < self.capacity
        ):
            raise SlotError(mismatch("slot", f"an integer in [0, {self.capacity})", "", slot))
        return int(slot)

    # -- planning ----------------------------------------------------------------------
    def plan(
        self,
        slots: Sequence[int],
        tokens: Sequence[Sequence[int]] | np.ndarray,
        *,
        from_empty: bool = False,
    ) -> StepPlan:
        """Plan one step feeding ``tokens[k]`` to ``slots[k]``; changes nothing.

        ``tokens`` is one list per slot (ragged), or an integer array ``[B, S]`` when every
        slot gets S tokens (the decode fast path: no per-sequence Python work).
        ``from_empty`` plans as if the slots were reset first (a prefill), so a prefill is
        checked in full before anything is reset.

        ``slots`` must be consecutive (``lo, lo + 1, ...``): each step binds one contiguous
        window of the cache buffers. Use :meth:`reorder` to gather sequences first.

        Raises:
            SlotError: no slots, unknown or non-consecutive slots, more than ``capacity``,
                a sequence with no tokens.
            DTypeError: token ids that are not integers (floats are never truncated).
            ArgumentError: a token id outside ``[0, vocab_size)``.
            ShapeError: a token list that is not 1-D; S > ``max_step_tokens`` (the engine's
                profile bound).
            CacheOverflowError: ``length + S > S_max`` for a slot (S = the padded width, since
                the padded update writes S rows).
        """
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, (Sequence, np.ndarray)):
            raise ShapeError(mismatch("tokens", "one list of token ids per slot", "", repr(tokens)))
        b = len(slots)
        if b == 0 or b != len(tokens):
            raise SlotError(
                mismatch("slots", "one non-empty token list per slot", len(slots), len(tokens))
            )
        if b > self.capacity:
            raise SlotError(mismatch("batch", f"at most capacity = {self.capacity}", "", b))
        lo = self.check_slot(slots[0])
        consecutive = isinstance(slots, range) and slots.step == 1
        if not consecutive and list(slots) != list(range(lo, lo + b)):
            raise SlotError(
                mismatch("slots", "consecutive slots", list(range(lo, lo + b)), list(slots))
            )
        self.check_slot(lo + b - 1)
        if isinstance(tokens, np.ndarray):
            if tokens.ndim != 2 or tokens.shape[1] == 0:
                raise SlotError(mismatch("tokens", "an array [B, S] with S >= 1", "", tokens.shape))
            check_token_ids("tokens", tokens, self.vocab_size)
            s = tokens.shape[1]
            counts = np.full(b, s, dtype=np.int64)
            input_ids = tokens.astype(np.int32)
        else:
            input_ids, counts = token_rows(tokens, lo, self.vocab_size)
            s = input_ids.shape[1]
        if s > self.max_step_tokens:
            raise ShapeError(
                mismatch("tokens", "at most max_step_tokens per step", self.max_step_tokens, s)
            )
        start = np.zeros(b, np.int64) if from_empty else self._lengths[lo : lo + b]
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
            rope_lengths=(start + counts).astype(np.int32),
            last_token_rows=(np.arange(b) * s + counts - 1).astype(np.int32),
        )

    def plan_window(self, tokens: Mapping[int, Sequence[int]], lo: int | None = None) -> StepPlan:
        """Plan one step feeding ``tokens[slot]`` to each of its slots, which need not be
        consecutive: the step binds the window ``lo .. max`` of them (``lo`` None: their
        min; a lower ``lo`` for storage whose windows start at aligned slots), and each slot in it
        that is not a key (idle) takes one pad token 0 at its length, attending to its own
        cached rows; its row of the logits is meaningless and :meth:`commit` leaves its
        length as it was (``StepPlan.active``). Nothing is copied between slots. An idle slot
        must have room for the step's S rows (see :meth:`idle_room`); changes nothing.

        Raises:
            SlotError: no slots, an unknown slot.
            As :meth:`plan` otherwise (CacheOverflowError also for an idle slot without room).
        """
        if not isinstance(tokens, Mapping) or not tokens:
            raise SlotError(mismatch("tokens", "a non-empty mapping slot -> token ids", "", tokens))
        slots = sorted(self.check_slot(s) for s in tokens)
        lo = slots[0] if lo is None else min(self.check_slot(lo), slots[0])
        window = range(lo, slots[-1] + 1)
        rows = [tokens.get(s, [0]) for s in window]
        plan = self.plan(window, rows)
        active = np.array([s in tokens for s in window])
        return replace(plan, active=None if active.all() else active)

    def idle_room(self, slots: Sequence[int], width: int) -> list[int]:
        """Crop each of ``slots`` holding more than ``S_max - width`` tokens to that length,
        so a window step of ``width`` columns can write its pad rows there; the slots
        cropped (each loses its last cached tokens, nothing else changes)."""
        cropped = []
        for s in slots:
            if self.length(s) > self.max_seq_len - width:
                self._lengths[s] = self.max_seq_len - width
                cropped.append(s)
        return cropped

    def commit(self, plan: StepPlan) -> None:
        """Advance the planned slots by their token counts (not while frozen); a window
        step's idle slots (``plan.active`` False) stay as they were."""
        if not self._frozen:
            counts = plan.counts if plan.active is None else plan.counts * plan.active
            self._lengths[plan.lo : plan.lo + len(plan.counts)] += counts

    # -- cache operations (lengths only; the storage moves the data) ---------------------
    def reset(self, slot: int | None = None) -> None:
        """Forget every slot, or one."""
        if slot is None:
            self._lengths[:] = 0
        else:
            self._lengths[self.check_slot(slot)] = 0

    def crop(self, slot: int, length: int) -> None:
        """Keep the first ``length`` tokens of ``slot`` (Hugging Face ``DynamicCache.crop``)."""
        current = self.length(slot)
        length = check_int("length", length)
        if length < 0:
            length = max(current + length, 0)  # crop(slot, -n) drops the last n, like HF
        if length > current:
            raise CacheOverflowError(
                mismatch(f"slot {slot}", "crop length <= current length", current, length)
            )
        self._lengths[slot] = length

    def set_length(self, slot: int, length: int) -> None:
        """Declare ``slot`` to hold ``length`` tokens (after a restore or import)."""
        self.check_slot(slot)
        length = check_int("length", length)
        if not 0 <= length <= self.max_seq_len:
            raise CacheOverflowError(
                mismatch(f"slot {slot}", f"length in [0, {self.max_seq_len}]", "", length)
            )
        self._lengths[slot] = length

    def fork(self, src: int, dst: int) -> None:
        """``dst`` continues from ``src``'s prefix."""
        self._lengths[self.check_slot(dst)] = self.length(src)

    def reorder(self, order: Sequence[int]) -> None:
        """Slot k takes the state of slot ``order[k]`` (beam search ``reorder_cache``);
        ``order`` may repeat or drop slots and may be shorter than ``capacity``.

        Raises:
            SlotError: ``order`` not a sequence of slots, an unknown slot, or longer than
                ``capacity``.
        """
        self.check_order(order)
        self._lengths[: len(order)] = self._lengths[list(order)]

    def check_order(self, order: Sequence[int]) -> None:
        """Raise as :meth:`reorder` would, changing nothing."""
        if isinstance(order, (str, bytes)) or not isinstance(order, (Sequence, np.ndarray)):
            raise SlotError(mismatch("order", "a sequence of slots", "", repr(order)))
        for s in order:
            self.check_slot(s)
        if len(order) > self.capacity:
            raise SlotError(mismatch("order", f"at most {self.capacity} slots", "", len(order)))

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
