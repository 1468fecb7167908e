"""trt_kv's KV-cache update plugin, for TensorRT without IKVCacheUpdateLayer (< 10.15).

A Python ``IPluginV3`` (:mod:`trt_kv.plugin.plugin`) whose ``enqueue`` launches the CUDA
kernels of ``plugins/kv_cache_update.cu`` through cuda-python (:mod:`trt_kv.plugin.launch`),
compiled by NVRTC for the GPU at hand (:mod:`trt_kv.plugin.kernels`). ``plugins/README.md``
says why this packaging, and what aliasing needs from the builder config and the runtime.
"""

from __future__ import annotations

from trt_kv._trt import FEATURES, trt
from trt_kv.errors import NetworkError, mismatch
from trt_kv.plugin.plugin import (
    ALIASED_IO,
    PLUGIN_NAME,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    KvCacheUpdatePlugin,
    KvCacheUpdatePluginCreator,
    create_plugin,
    enable_aliased_io,
    register_creator,
)

LAYER_PREFIX = "trt_kv_plugin:"

__all__ = [
    "ALIASED_IO",
    "LAYER_PREFIX",
    "PLUGIN_NAME",
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "KvCacheUpdatePlugin",
    "KvCacheUpdatePluginCreator",
    "add_plugin_cache_update",
    "create_plugin",
    "enable_aliased_io",
    "is_plugin_cache_update",
    "register_creator",
]


def is_plugin_cache_update(layer: object) -> bool:
    """True when ``layer`` is a trt_kv KV-cache update plugin layer.

    Its inputs are ``(cache, update, write_indices[, update_lengths])`` and output 0 is the
    updated cache, exactly like the native layer (4 inputs means the packed form).
    """
    return layer.type == trt.LayerType.PLUGIN_V3 and layer.name.startswith(LAYER_PREFIX)


def add_plugin_cache_update(
    network: object,
    cache: object,
    update: object,
    write_indices: object,
    update_lengths: object | None = None,
) -> object:
    """Add the plugin layer; returns the updated cache tensor ``[B, N, S_max, H]``.

    Operands as :func:`trt_kv.builder.add_kv_cache_update` (already validated there): cache
    ``[B, N, S_max, H]``, update ``[B, N, S, H]`` or packed ``[T, N, H]`` with
    ``update_lengths [B + 1]``, ``write_indices [B]``. The layer is named
    ``trt_kv_plugin:<cache name>``. Build with :func:`enable_aliased_io` on the builder config.

    Raises:
        NetworkError: the TensorRT module has no ``INetworkDefinition.add_plugin_v3``
            (TensorRT-RTX), or TensorRT refused the layer.
    """
    if not FEATURES.python_plugins:
        raise NetworkError(
            mismatch(
                "network",
                "INetworkDefinition.add_plugin_v3 for method='plugin'",
                "TensorRT with Python plugins",
                f"{FEATURES.module} {FEATURES.version} has none",
            )
        )
    form = "padded" if update_lengths is None else "packed"
    inputs = [cache, update, write_indices]
    if update_lengths is not None:
        inputs.append(update_lengths)
    layer = network.add_plugin_v3(inputs, [], create_plugin(form))
    if layer is None:
        raise NetworkError(
            mismatch(cache.name, "a plugin layer from add_plugin_v3", "a layer", None)
        )
    layer.name = f"{LAYER_PREFIX}{cache.name}"
    return layer.get_output(0)
