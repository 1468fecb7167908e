"""trt_kv's KV-cache update plugin, for TensorRT without IKVCacheUpdateLayer."""

from __future__ import annotations

from trt_kv._trt import FEATURES, trt
from trt_kv.errors import NetworkError, mismatch

PLUGIN_NAME = "TrtKvCacheUpdate"
PLUGIN_NAMESPACE = "trt_kv"
PLUGIN_VERSION = "1"


def is_plugin_cache_update(layer: object) -> bool:
    """True when ``layer`` is a trt_kv KV-cache update plugin layer."""
    return layer.type == trt.LayerType.PLUGIN_V3 and layer.name.startswith("trt_kv_plugin:")


def add_plugin_cache_update(
    network: object,
    cache: object,
    update: object,
    write_indices: object,
    update_lengths: object | None = None,
) -> object:
    """Add the plugin layer; returns the updated cache tensor ``[B, N, S_max, H]``."""
    if not FEATURES.python_plugins:
        raise NetworkError(
            mismatch(
                "network",
                "INetworkDefinition.add_plugin_v3 for method='plugin'",
                "TensorRT with Python plugins",
                f"{FEATURES.module} {FEATURES.version} has none",
            )
        )
    raise NotImplementedError
