"""What every model's reference backend shares: float32 host caches of the model's shape, the
sizes a session reads, and a step that runs the model's NumPy forward on a window of them.

Each model supplies its checks and its :meth:`HostReference.forward`; the reference stays the
model's own oracle (no network, no TensorRT), only the bookkeeping around it is shared.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trt_kv.build_defaults import default_step_tokens
from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.builder.model_caches import layer_caches
from trt_kv.errors import check_int
from trt_kv.runtime.backend import last_token_logits, one_thread
from trt_kv.runtime.cache_state import StepPlan
from trt_kv.runtime.storage import HostCaches


class HostReference:
    """A backend on a model's NumPy forward, with host caches ``aliases`` of ``capacity``
    slots. ``max_step_tokens`` None: :func:`~trt_kv.build_defaults.default_step_tokens` of
    ``max_seq_len``, as a built network's (a wider step is prefilled in chunks).

    Raises:
        ArgumentError: ``capacity``, ``max_seq_len`` or ``max_step_tokens`` not an integer
            >= 1, a step wider than ``max_seq_len``, caches beyond host memory.
    """

    name = "reference"

    def __init__(
        self,
        aliases: Sequence[CacheAlias],
        *,
        num_layers: int,
        vocab_size: int,
        capacity: int,
        max_seq_len: int,
        max_step_tokens: int | None,
        long_rope_after: int | None = None,
    ) -> None:
        check_int("capacity", capacity, 1)
        check_int("max_seq_len", max_seq_len, 1)
        if max_step_tokens is not None:
            check_int("max_step_tokens", max_step_tokens, 1, max_seq_len)
        self.num_layers = num_layers
        self.storage = HostCaches(aliases, capacity)
        self.max_step_tokens = (
            default_step_tokens(max_seq_len) if max_step_tokens is None else max_step_tokens
        )
        self.vocab_size = vocab_size
        self.long_rope_after = long_rope_after

    def forward(self, plan: StepPlan, caches: list) -> np.ndarray:
        """The model's logits for ``plan`` on ``caches`` (per layer, updated in place)."""
        raise NotImplementedError

    @one_thread
    def run(self, plan: StepPlan) -> np.ndarray:
        """One step on the window of ``plan``'s slots; the last logits ``[B, V]`` float32."""
        window = self.storage.window(plan.lo, len(plan.counts))
        return last_token_logits(self.forward(plan, layer_caches(window, self.num_layers)), plan)
