"""What a backend is: something that runs one planned step on its cache storage.

Backends are interchangeable, as Polygraphy's runners are: the reference model, the CPU
interpreter, trt_kv's own TensorRT bindings (fast path) and Polygraphy's ``TrtRunner``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from trt_kv.errors import ArgumentError, ClosedError, mismatch
from trt_kv.models.llama.config import LlamaConfig
from trt_kv.models.llama.network import (
    INPUT_IDS,
    KV_LENGTHS,
    LAST_TOKEN_ROWS,
    POSITION_IDS,
    ROPE_LENGTHS,
)
from trt_kv.models.llama.rope import long_rope_after
from trt_kv.runtime.cache_state import StepPlan
from trt_kv.runtime.storage import CacheStorage

WRITE_INDICES, UPDATE_LENGTHS = "write_indices", "update_lengths"


class Backend(Protocol):
    """What :class:`~trt_kv.runtime.session.Session` needs of a backend (a user's own too):
    ``storage``, ``max_step_tokens``, ``vocab_size`` and ``run`` (:data:`REQUIRED`).
    ``name`` is for display (trt_kv's backends and the CLI have one). ``long_rope_after`` is
    optional: a backend without it is treated as None (no longrope re-prefill, ever)."""

    name: str
    storage: CacheStorage
    max_step_tokens: int  # most new tokens per sequence in one step (S bound)
    vocab_size: int
    # longrope's original_max_position_embeddings when S_max can pass it (generate prefills a
    # sequence again when it crosses it), else None: see trt_kv.models.llama.rope. Optional.
    long_rope_after: int | None

    def run(self, plan: StepPlan) -> np.ndarray:
        """Run ``plan`` on ``storage`` (caches updated in place); logits ``[B, V]`` float32."""
        ...


REQUIRED = ("storage", "max_step_tokens", "vocab_size", "run")


def check_backend(backend: object) -> None:
    """Raise ArgumentError naming every :data:`REQUIRED` attribute ``backend`` lacks."""
    missing = [a for a in REQUIRED if not hasattr(backend, a)]
    if missing:
        raise ArgumentError(
            mismatch(
                "backend",
                f"a backend with {', '.join(REQUIRED)}",
                "",
                f"{type(backend).__name__} without {', '.join(missing)}",
            )
        )


def check_open(backend: str, closed: bool) -> None:
    """:class:`~trt_kv.errors.ClosedError` naming ``backend`` for a step after its close()."""
    if closed:
        raise ClosedError(mismatch(backend, "an open backend", "", "closed"))


def step_feed(plan: StepPlan, input_names: set[str] | frozenset[str]) -> dict[str, np.ndarray]:
    """The non-cache inputs of a step, restricted to those the network declares."""
    feed = {
        INPUT_IDS: plan.input_ids,
        POSITION_IDS: plan.position_ids,
        WRITE_INDICES: plan.write_indices,
        KV_LENGTHS: plan.kv_lengths,
        LAST_TOKEN_ROWS: plan.last_token_rows,
        ROPE_LENGTHS: plan.rope_lengths,
    }
    if UPDATE_LENGTHS in input_names:
        feed[UPDATE_LENGTHS] = plan.update_lengths
    return {k: v for k, v in feed.items() if k in input_names}


def long_rope_after_of(metadata: dict) -> int | None:
    """:func:`~trt_kv.models.llama.rope.long_rope_after` of an engine, from its sidecar
    metadata (``config``, ``max_seq_len``)."""
    config = LlamaConfig.from_json(metadata["config"])
    return long_rope_after(config, metadata["max_seq_len"])


def last_token_logits(logits: np.ndarray, plan: StepPlan) -> np.ndarray:
    """``[B, V]`` float32 from ``[B, V]`` or all-position ``[B, S, V]`` logits."""
    if logits.ndim == 3:
        logits = logits[np.arange(len(plan.counts)), plan.counts - 1]
    return np.asarray(logits, dtype=np.float32)
