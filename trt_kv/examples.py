"""Built-in networks: the KV-cache example of TensorRT's KVCacheUpdate operator page, and
the Llama model sources (the seeded SmolLM2-135M default, or a checkpoint folder)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_kv.builder import Profile, add_kv_cache_update, create_network
from trt_kv.models.llama import LlamaConfig, LlamaWeights, load_hf_weights, random_weights

# Shapes of the documentation example: cache [4, 2, 8, 1], update [4, 2, 4, 1], indices [4].
DOC_CACHE_SHAPE = (4, 2, 8, 1)
DOC_UPDATE_SHAPE = (4, 2, 4, 1)
DOC_WRITE_INDICES = np.array([2, 1, 1, 3], dtype=np.int32)


def doc_example_network(
    dtype: str = "float32", index_dtype: str = "int32"
) -> tuple[object, object, list[Profile]]:
    """``(builder, network, profiles)`` of the documentation example: inputs ``cache``,
    ``update``, ``write_indices``; output ``cache_out`` aliasing ``cache``. Static shapes."""
    from trt_kv import dtypes

    builder, network = create_network()
    cache = network.add_input("cache", dtypes.to_trt(dtype), DOC_CACHE_SHAPE)
    update = network.add_input("update", dtypes.to_trt(dtype), DOC_UPDATE_SHAPE)
    write_indices = network.add_input("write_indices", dtypes.to_trt(index_dtype), (4,))
    add_kv_cache_update(network, cache, update, write_indices, output_name="cache_out")
    return builder, network, []


def load_model(spec: str, seed: int = 0) -> tuple[str, LlamaConfig, LlamaWeights]:
    """``"default"``: SmolLM2-135M shape with seeded random weights (no download); else a
    Hugging Face checkpoint folder. Returns ``(name, config, weights)``."""
    if spec == "default":
        config = LlamaConfig.smollm2_135m()
        return "smollm2-135m-random", config, random_weights(config, seed=seed)
    folder = Path(spec)
    config = LlamaConfig.from_hf(folder)
    return folder.resolve().name, config, load_hf_weights(folder, config)
