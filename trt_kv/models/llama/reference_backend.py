"""Backend on the NumPy reference model (no network, no TensorRT)."""

from __future__ import annotations

import numpy as np

from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.builder.model_caches import layer_caches, model_cache_aliases
from trt_kv.errors import check_int
from trt_kv.models.llama.config import LlamaConfig
from trt_kv.models.llama.rope import long_rope_after
from trt_kv.models.llama.weights import LlamaWeights, check_weights
from trt_kv.reference.llama import forward
from trt_kv.runtime.backend import last_token_logits
from trt_kv.runtime.cache_state import StepPlan
from trt_kv.runtime.storage import HostCaches


def llama_cache_aliases(config: LlamaConfig, max_seq_len: int, dtype: str) -> list[CacheAlias]:
    """The alias records a Llama network of this shape has, in input order."""
    return model_cache_aliases(
        config.num_hidden_layers, config.num_key_value_heads, max_seq_len, config.head_dim, dtype
    )


class ReferenceBackend:
    """Runs :func:`trt_kv.reference.llama.forward` in float32 on host caches."""

    name = "reference"

    def __init__(
        self,
        config: LlamaConfig,
        weights: LlamaWeights,
        *,
        capacity: int,
        max_seq_len: int,
        max_step_tokens: int | None = None,
    ) -> None:
        """Raises ArgumentError (``capacity``, ``max_seq_len`` or ``max_step_tokens`` not an
        integer >= 1, a step wider than ``max_seq_len``, caches beyond host memory) or as
        :func:`~trt_kv.models.llama.weights.check_weights` for ``weights`` that do not fit
        ``config``."""
        check_int("capacity", capacity, 1)
        check_int("max_seq_len", max_seq_len, 1)
        if max_step_tokens is not None:
            check_int("max_step_tokens", max_step_tokens, 1, max_seq_len)
        self.config = config
        self.weights = check_weights(weights, config).astype(np.float32)
        self.storage = HostCaches(llama_cache_aliases(config, max_seq_len, "float32"), capacity)
        self.max_step_tokens = max_step_tokens or max_seq_len
        self.vocab_size = config.vocab_size
        self.long_rope_after = long_rope_after(config, max_seq_len)

    def run(self, plan: StepPlan) -> np.ndarray:
        window = self.storage.window(plan.lo, len(plan.counts))
        caches = layer_caches(window, self.config.num_hidden_layers)
        logits = forward(
            self.config,
            self.weights,
            plan.input_ids,
            plan.position_ids,
            caches,
            plan.write_indices,
            plan.kv_lengths,
            plan.rope_lengths,
        )
        return last_token_logits(logits, plan)
