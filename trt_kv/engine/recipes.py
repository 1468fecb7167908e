"""Engines rebuilt from their sidecar's recipe: the network an engine file was built from,
made again by the functions that built it.

A sidecar's ``recipe`` (written by :mod:`trt_kv.engine.store`) names the network: the
documentation example (``{"network": "kv_cache_doc_example"}``), or a model engine of any
architecture (``{"network": ARCH, "model": NAME, "weights_sha256": SHA}``, never a path), whose
network comes from a loaded model with those weights and the recorded build options
(:func:`network_from_recipe`). The emulated TensorRT runtime needs that network to run an
engine built in another process. Above :mod:`trt_kv.models`, like the store.
"""

from __future__ import annotations

from trt_kv.engine.digest import weights_digest
from trt_kv.engine.store import OPTIONS_KEY, BuildOptions
from trt_kv.errors import mismatch
from trt_kv.models.architectures import architecture_named


def network_from_recipe(recipe: dict, metadata: dict, model: object) -> object:
    """The network a model engine's sidecar recipe names, rebuilt from ``model`` (a loaded
    :class:`~trt_kv.models.loading.Model`, whose weights must hash to the recorded sha256) with
    the recorded build options.

    Raises:
        ArgumentError: a recipe of no known architecture.
        ConfigError: the model's weights (sha256) or config differ from the recorded ones.
    """
    from trt_kv.errors import ConfigError

    arch = architecture_named(recipe.get("network"))
    digest = weights_digest(model.weights)
    if digest != recipe["weights_sha256"]:
        raise ConfigError(
            mismatch(
                f"weights of {recipe['model']!r}",
                "sha256 (from the recipe)",
                recipe["weights_sha256"],
                digest,
            )
        )
    if model.config.to_json() != metadata["config"]:
        raise ConfigError(mismatch(f"config of {recipe['model']!r}", "", metadata["config"], ""))
    options = BuildOptions(**metadata[OPTIONS_KEY]).network_options()
    return arch.build_network(model.config, model.weights, **options)
