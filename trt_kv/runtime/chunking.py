"""Chunked prefill: a step wider than ``max_step_tokens`` becomes consecutive steps.

Chunk c feeds tokens ``[c * W, (c + 1) * W)`` of every sequence that still has some, one step
per run of consecutive slots (a step binds one contiguous window of cache slots). Every chunk
is planned on a scratch copy of the cache state before anything runs, so a request that would
overflow in its last chunk fails before its first one. Chunk c + 1 attends to the rows chunk c
wrote, so the logits equal one long prefill's (up to float rounding); every chunk carries the
request's final lengths (``StepPlan.rope_lengths``), so longrope picks the table one long
prefill would.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from trt_kv.runtime.cache_state import CacheState, StepPlan


@dataclass(frozen=True)
class Chunk:
    """One planned chunk step and which of its logits rows are a sequence's last token."""

    plan: StepPlan
    # (sequence index in the request, row of this step's logits) of each sequence whose last
    # token this step feeds; None: an unchunked step, every row is its sequence's last
    last: tuple[tuple[int, int], ...] | None


def step_width(tokens: Sequence[Sequence[int]] | np.ndarray) -> int:
    """The padded width S of a step feeding ``tokens`` (0 for no tokens)."""
    if isinstance(tokens, np.ndarray):
        return tokens.shape[1] if tokens.ndim == 2 else 0
    return max((len(t) if hasattr(t, "__len__") else 1 for t in tokens), default=0)


def _runs(indices: list[int]) -> list[list[int]]:
    """``[0, 1, 3, 4, 5]`` -> ``[[0, 1], [3, 4, 5]]``."""
    runs: list[list[int]] = []
    for k in indices:
        if runs and runs[-1][-1] == k - 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def plan_chunks(
    state: CacheState,
    lo: int,
    tokens: Sequence[Sequence[int]] | np.ndarray,
    width: int,
    *,
    from_empty: bool = False,
) -> list[Chunk]:
    """Plan feeding ``tokens[k]`` to slot ``lo + k`` in chunks of at most ``width`` tokens
    (``from_empty``: as if those slots were reset first, a prefill).

    ``state`` is not changed: commit each chunk's plan after running it. Under
    :meth:`CacheState.freeze` the chunks are planned as if unfrozen (each chunk must see the
    previous ones), and the frozen state's commits then leave the lengths as they were.

    Raises:
        SlotError, ShapeError, CacheOverflowError: as :meth:`CacheState.plan` for any chunk.
    """
    scratch = copy.deepcopy(state)
    scratch.unfreeze()
    if from_empty:
        for k in range(len(tokens)):
            scratch.reset(lo + k)
    lengths = [len(t) for t in tokens]
    chunks: list[Chunk] = []
    for start in range(0, max(lengths, default=1), width):
        active = [k for k, n in enumerate(lengths) if n > start or start == 0]
        for run in _runs(active):
            part = [list(tokens[k][start : start + width]) for k in run]
            plan = scratch.plan(range(lo + run[0], lo + run[-1] + 1), part)
            scratch.commit(plan)
            if not chunks:  # the first chunk feeds (and checked) every sequence
                final = plan.write_indices + np.array(lengths, np.int32)  # [B] after the request
            plan = replace(plan, rope_lengths=final[run])  # longrope: one table per request
            last = tuple((k, row) for row, k in enumerate(run) if lengths[k] <= start + width)
            chunks.append(Chunk(plan, last))
    return chunks
