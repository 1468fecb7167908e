"""Backend on the NumPy reference model (no network, no TensorRT)."""

from __future__ import annotations

import numpy as np

from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.builder.model_caches import model_cache_aliases
from trt_kv.models.host_reference import HostReference
from trt_kv.models.llama.config import LlamaConfig
from trt_kv.models.llama.reference import forward
from trt_kv.models.llama.rope import long_rope_after
from trt_kv.models.llama.weights import LlamaWeights, check_weights
from trt_kv.runtime.cache_state import StepPlan


def llama_cache_aliases(config: LlamaConfig, max_seq_len: int, dtype: str) -> list[CacheAlias]:
    """The alias records a Llama network of this shape has, in input order."""
    return model_cache_aliases(
        config.num_hidden_layers, config.num_key_value_heads, max_seq_len, config.head_dim, dtype
    )


class ReferenceBackend(HostReference):
    """Runs :func:`trt_kv.models.llama.reference.forward` in float32 on host caches."""

    def __init__(
        self,
        config: LlamaConfig,
        weights: LlamaWeights,
        *,
        capacity: int,
        max_seq_len: int,
        max_step_tokens: int | None = None,
    ) -> None:
        """Raises as :class:`~trt_kv.models.host_reference.HostReference`, or as
        :func:`~trt_kv.models.llama.weights.check_weights` for ``weights`` that do not fit
        ``config``."""
        super().__init__(
            llama_cache_aliases(config, max_seq_len, "float32"),
            num_layers=config.num_hidden_layers,
            vocab_size=config.vocab_size,
            capacity=capacity,
            max_seq_len=max_seq_len,
            max_step_tokens=max_step_tokens,
            long_rope_after=long_rope_after(config, max_seq_len),
        )
        self.config = config
        self.weights = check_weights(weights, config).astype(np.float32)

    def forward(self, plan: StepPlan, caches: list) -> np.ndarray:
        return forward(
            self.config,
            self.weights,
            plan.input_ids,
            plan.position_ids,
            caches,
            plan.write_indices,
            plan.kv_lengths,
            plan.rope_lengths,
        )
