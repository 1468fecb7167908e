"""The KV-cache example of TensorRT's KVCacheUpdate operator page, as a network: the
built-in network of ``trt-kv build`` and ``demo`` beside the models
(:func:`trt_kv.engine.store.build_doc_example`)."""

from __future__ import annotations

import numpy as np

from trt_kv.builder.engine import Profile, create_network
from trt_kv.builder.kv_cache import add_kv_cache_update

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
