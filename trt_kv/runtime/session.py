"""One session API over any backend: the caller speaks tokens and slots, never write indices.

session = Session(backend)
logits = session.prefill([[1, 2, 3], [4, 5]])    # slots 0 and 1
logits = session.decode([7, 8])                   # one token each
session.fork(0, 2); session.crop(1, 3); snap = session.snapshot(0)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np

from trt_kv.errors import (
    ArgumentError,
    ClosedError,
    ShapeError,
    SlotError,
    check_int,
    mismatch,
)
from trt_kv.runtime.backend import (
    Backend,
    Candidates,
    candidates_of,
    check_backend,
    exclusive,
    guard_of,
    held,
)
from trt_kv.runtime.cache_state import CacheState, id_array
from trt_kv.runtime.chunking import Chunk, plan_chunks, step_width
from trt_kv.runtime.storage import Snapshot


def _decode_ids(tokens: object) -> np.ndarray:
    """One token id per slot ``[B]`` as the step's ``[B, 1]``; ShapeError when not 1-D."""
    ids = id_array("tokens", tokens)
    if ids.ndim != 1:
        raise ShapeError(mismatch("tokens", "one token id per slot [B]", "", ids.shape))
    return ids.reshape(-1, 1)


_exclusive = held(lambda session, name: session.exclusive(name))  # Session.exclusive(name)


class Session:
    """Cache slots of ``backend.storage`` and their lengths; every error is raised before
    anything runs.

    ``long_rope_after`` is the backend's, or None when it has none (a user's backend need
    not: see :class:`~trt_kv.runtime.backend.Backend`).

    One thread at a time: every operation but the queries (``length``, ``capacity``,
    ``memory``) holds the session, and its backend, for its duration, and one started while
    another thread holds either (this session, or another session on the same backend)
    raises :class:`~trt_kv.errors.ConcurrentUseError` at once, naming both (it neither waits
    nor changes anything). Every such operation first raises
    :class:`~trt_kv.errors.ClosedError` when the backend is closed.

    Raises:
        ArgumentError: ``backend`` lacks a required attribute (each missing one named).
    """

    def __init__(self, backend: Backend) -> None:
        check_backend(backend)
        self.backend = backend
        self.long_rope_after: int | None = getattr(backend, "long_rope_after", None)
        self.storage = backend.storage
        self.state = CacheState(
            self.storage.capacity,
            self.storage.max_seq_len,
            backend.max_step_tokens,
            backend.vocab_size,
        )
        self._guard = guard_of(backend)  # shared by every Session on this backend

    @contextmanager
    def exclusive(self, operation: str) -> Iterator[None]:
        """Hold the session for ``operation`` (the same thread may nest operations:
        :func:`~trt_kv.runtime.generate.generate` holds it across its steps).

        Raises:
            ClosedError: the backend is closed (``backend.closed`` true).
            ConcurrentUseError: another thread holds the session.
        """
        with exclusive(self._guard, f"Session.{operation}"):
            if getattr(self.backend, "closed", False):
                name = type(self.backend).__name__
                raise ClosedError(
                    mismatch(f"Session.{operation}", f"an open backend ({name})", "", "closed")
                )
            yield

    @property
    def capacity(self) -> int:
        return self.state.capacity

    # -- steps -------------------------------------------------------------------------
    def _plan(self, tokens: object, lo: int, *, from_empty: bool = False) -> list[Chunk]:
        """The step's plan, or its chunks' plans when wider than ``max_step_tokens``."""
        lo = check_int("lo", lo)
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, (Sequence, np.ndarray)):
            raise ShapeError(mismatch("tokens", "one list of token ids per slot", "", repr(tokens)))
        if isinstance(tokens, np.ndarray) and tokens.ndim != 2:
            raise ShapeError(mismatch("tokens", "an array [B, S]", "", f"shape {tokens.shape}"))
        width = self.backend.max_step_tokens
        if step_width(tokens) > width:  # chunked prefill
            chunks = plan_chunks(self.state, lo, tokens, width, from_empty=from_empty)
        else:
            plan = self.state.plan(range(lo, lo + len(tokens)), tokens, from_empty=from_empty)
            chunks = [Chunk(plan, None)]
        check_plan = getattr(self.backend, "check_plan", None)
        for chunk in chunks:
            self.storage.check_window(chunk.plan.lo)
            if check_plan is not None:  # e.g. a batch no optimization profile holds
                check_plan(chunk.plan)
        return chunks

    def _run(self, chunks: list[Chunk], batch: int) -> np.ndarray:
        """Run and commit each planned chunk; the last logits ``[B, V]`` of each sequence."""
        if len(chunks) == 1 and chunks[0].last is None:
            logits = self.backend.run(chunks[0].plan)
            self.state.commit(chunks[0].plan)
            return logits
        out = np.empty((batch, self.backend.vocab_size), np.float32)
        for chunk in chunks:
            logits = self.backend.run(chunk.plan)
            self.state.commit(chunk.plan)
            for k, row in chunk.last:
                out[k] = logits[row]
        return out

    def _slots(self, slots: Sequence[int]) -> list[int]:
        if isinstance(slots, (str, bytes)) or not isinstance(slots, (Sequence, np.ndarray)):
            raise SlotError(mismatch("slots", "a sequence of slots", "", repr(slots)))
        return [self.state.check_slot(s) for s in slots]

    @_exclusive
    def step(self, tokens: Sequence[Sequence[int]] | np.ndarray, lo: int = 0) -> np.ndarray:
        """Feed ``tokens[k]`` to slot ``lo + k`` (one list per slot, or an integer array
        ``[B, S]``); returns each one's last logits ``[B, V]``. A step wider than
        ``max_step_tokens`` is fed in chunks (chunked prefill), with the logits of one step.

        Raises:
            SlotError, ShapeError, DTypeError, ArgumentError, CacheOverflowError: see
                :meth:`CacheState.plan`; nothing has run or changed when they are raised.
        """
        return self._run(self._plan(tokens, lo), len(tokens))

    @_exclusive
    def step_slots(self, tokens: Mapping[int, Sequence[int]]) -> np.ndarray:
        """Feed ``tokens[slot]`` to each of its slots, consecutive or not (continuous
        batching: running sequences where they stand); returns their last logits ``[B, V]``
        in ascending slot order (B = ``len(tokens)``). One backend step over the window
        ``min .. max`` of the slots: an idle slot inside it takes one pad token past its
        cached rows and keeps its length (:meth:`CacheState.plan_window`); an idle slot
        within S of ``S_max`` is first cropped to ``S_max - S`` (it loses its last cached
        tokens). Nothing is copied between slots.

        Raises:
            As :meth:`step`; nothing has run or changed when they are raised, but the crop.
        """
        if not isinstance(tokens, Mapping) or not tokens:
            raise SlotError(mismatch("tokens", "a non-empty mapping slot -> token ids", "", tokens))
        slots = sorted(self.state.check_slot(s) for s in tokens)
        width = step_width([tokens[s] for s in slots])
        lo = self._aligned(slots[0])
        idle = [s for s in range(lo, slots[-1] + 1) if s not in tokens]
        self.state.idle_room(idle, min(width, self.state.max_seq_len))
        plan = self.state.plan_window(tokens, lo)
        check_plan = getattr(self.backend, "check_plan", None)
        if check_plan is not None:
            check_plan(plan)
        logits = self.backend.run(plan)
        self.state.commit(plan)
        return logits if plan.active is None else logits[plan.active]

    def _aligned(self, slot: int) -> int:
        """The highest window start ``<= slot`` the storage takes (device windows start at
        256-byte aligned slots; host windows anywhere); SlotError where none does."""
        for lo in range(slot, -1, -1):
            try:
                self.storage.check_window(lo)
                return lo
            except SlotError:
                if lo == 0:
                    raise
        return 0

    @_exclusive
    def prefill(self, prompts: Sequence[Sequence[int]], lo: int = 0) -> np.ndarray:
        """Reset slots ``lo ..`` and feed them ``prompts``; returns last logits ``[B, V]``.

        The whole step is checked (as if the slots were empty) before any slot is reset:
        an error leaves every slot as it was. Raises as :meth:`step`.
        """
        chunks = self._plan(prompts, lo, from_empty=True)
        for slot in range(lo, lo + len(prompts)):
            self.state.reset(slot)
        self.storage.zero(lo, len(prompts))  # one fill per cache for the whole window
        return self._run(chunks, len(prompts))

    @_exclusive
    def decode(self, tokens: Sequence[int] | np.ndarray, lo: int = 0) -> np.ndarray:
        """One new token per slot ``lo, lo + 1, ...`` (ids ``[B]``, integers); returns logits
        ``[B, V]``. Raises as :meth:`step`; ShapeError when ``tokens`` is not 1-D."""
        return self.step(_decode_ids(tokens), lo)

    @_exclusive
    def decode_top_k(self, tokens: Sequence[int] | np.ndarray, lo: int = 0) -> Candidates:
        """:meth:`decode`, returning the network's next-token candidates (``ids [B, k]``,
        ``logits [B, k]`` or None for k = 1: :data:`~trt_kv.runtime.backend.Candidates`)
        instead of the logits: only they leave the device.

        Raises:
            ArgumentError: the backend has no ``run_top_k`` / ``device_top_k`` >= 1.
            As :meth:`decode` otherwise.
        """
        if not candidates_of(self.backend):  # also: device_top_k None, or no run_top_k
            raise ArgumentError(
                mismatch(
                    "backend",
                    "one with run_top_k and device_top_k >= 1",
                    "",
                    type(self.backend).__name__,
                )
            )
        (chunk,) = self._plan(_decode_ids(tokens), lo)  # one token each: never chunked
        candidates = self.backend.run_top_k(chunk.plan)
        self.state.commit(chunk.plan)
        return candidates

    # -- cache operations ------------------------------------------------------------------
    def length(self, slot: int) -> int:
        return self.state.length(slot)

    @_exclusive
    def reset(self, slot: int | None = None) -> None:
        """Empty every slot (or one) and zero its buffers."""
        if slot is not None:
            self.state.length(slot)  # validates before touching storage
        self.state.reset(slot)
        self.storage.zero(slot)

    @_exclusive
    def crop(self, slot: int, length: int) -> None:
        """Keep the first ``length`` tokens (negative: drop the last ``-length``)."""
        self.state.crop(slot, length)

    @_exclusive
    def fork(self, src: int, dst: int) -> None:
        """``dst`` gets a copy of ``src``'s cache and length (shared prefix)."""
        self.state.fork(src, dst)
        self.storage.copy_slot(src, dst)

    @_exclusive
    def reorder(self, order: Sequence[int]) -> None:
        """Slot k takes slot ``order[k]`` (beam search ``reorder_cache`` / select). The
        caches move first (a device reorder may need its scratch slot: an allocation that
        fails leaves every slot and length as it was), then the lengths."""
        self.state.check_order(order)
        self.storage.reorder(order)
        self.state.reorder(order)

    @_exclusive
    def freeze(self) -> None:
        """Later steps run but do not advance lengths (their cache rows are overwritten by
        the next committed step)."""
        self.state.freeze()

    @_exclusive
    def unfreeze(self) -> None:
        self.state.unfreeze()

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """:meth:`freeze` for the duration of a ``with`` block."""
        with self.exclusive("frozen"):  # closed, or another thread's: raise before the block
            pass
        with self.state.frozen_steps():
            yield

    @_exclusive
    def snapshot(self, slot: int) -> Snapshot:
        """Host copies ``[N, L, H]`` of every cache of ``slot`` (L = its length)."""
        return self.storage.snapshot(slot, self.state.length(slot))

    @_exclusive
    def restore(self, slot: int, snap: Snapshot) -> None:
        self.state.length(slot)
        self.state.set_length(slot, self.storage.restore(slot, snap))

    @_exclusive
    def export_legacy(self, slots: Sequence[int]) -> tuple:
        """Per-layer ``(key, value)`` arrays ``[len(slots), N, L, H]``; all slots must hold
        the same length L (Hugging Face's legacy ``past_key_values``)."""
        lengths = {self.state.length(s) for s in self._slots(slots)}
        if len(lengths) != 1:
            raise ShapeError(
                mismatch("slots", "one common length", "equal lengths", sorted(lengths))
            )
        return self.storage.export_legacy(slots, lengths.pop())

    @_exclusive
    def import_legacy(
        self, past: Sequence[tuple[np.ndarray, np.ndarray]], slots: Sequence[int]
    ) -> None:
        """Write per-layer ``(key, value)`` arrays ``[len(slots), N, L, H]`` into ``slots``.

        Raises:
            SlotError: an unknown or repeated slot.
            ShapeError: not exactly one (key, value) pair per layer, or a malformed array.
            DTypeError: arrays that are not floating point, or values the cache dtype cannot
                hold.
        """
        slots = self._slots(slots)
        if len(set(slots)) != len(slots):
            raise SlotError(mismatch("slots", "distinct slots", "", slots))
        length = self.storage.import_legacy(past, slots)
        for s in slots:
            self.state.set_length(s, length)

    def memory(self) -> dict[str, int]:
        """Bytes per cache buffer, plus ``"total"``."""
        per = self.storage.nbytes()
        return {**per, "total": sum(per.values())}
