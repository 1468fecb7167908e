"""Engines rebuilt from their sidecar's recipe: the network an engine file was built from,
made again by the functions that built it.

A sidecar's ``recipe`` (written by :mod:`trt_kv.engine.store`) names the network: the
documentation example (``{"network": "kv_cache_doc_example"}``), or a model engine of any
architecture (``{"network": ARCH, "model": NAME, "weights_sha256": SHA}``, never a path), whose
network comes from a loaded model with those weights and the recorded build options
(:func:`network_from_recipe`). The emulated TensorRT runtime needs that network to run an
engine built in another process: :func:`recipe_rebuilder` is the rebuild function
``trt_kv.emulator.emulated_gpu(rebuild=...)`` takes (the CLI's ``--emulate-gpu`` passes one),
and the one place that decides every recipe. Above :mod:`trt_kv.models`, like the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from trt_kv.builder import Profile
from trt_kv.builder.doc_example import doc_example_network
from trt_kv.engine.digest import weights_digest
from trt_kv.engine.store import DOC_EXAMPLE, OPTIONS_KEY, BuildOptions
from trt_kv.errors import ConfigError, mismatch
from trt_kv.models.architectures import architecture_named
from trt_kv.models.loading import load_model

# (network, its optimization profiles, what keeps its weights alive)
Rebuilt = tuple[object, list[Profile], object]
RebuildFn = Callable[[dict, dict], Rebuilt]  # (sidecar recipe, sidecar metadata) -> Rebuilt


def recipe_rebuilder(models: Iterable[str | Path] = ()) -> RebuildFn:
    """The rebuild function for ``emulated_gpu(rebuild=...)``: ``rebuild(recipe, metadata)``
    (a sidecar's ``recipe`` and its whole ``metadata``) returns ``(network, profiles, keep)``
    as the build made them: the documentation example's network, or a model engine's
    (:func:`network_from_recipe`) from the one of ``models`` whose weights hash to the
    recipe's sha256 (the sidecar names the model, never a path on the machine that built it).

    ``models``: :func:`~trt_kv.models.loading.load_model` specs, loaded (and their weights
    hashed) in order the first time a recipe needs one, and kept by the function for the
    next (a new rebuilder loads them again).

    The function raises ConfigError for a recipe whose weights no model of ``models`` has
    (or whose config differs), ArgumentError for one of no known architecture.
    """
    specs = [str(m) for m in models]
    loaded: dict[str, tuple[object, str]] = {}  # spec -> (model, its weights sha256)

    def model_for(recipe: dict) -> object:
        seen = []
        for spec in specs:
            if spec not in loaded:
                model = load_model(spec, progress=False)
                loaded[spec] = (model, weights_digest(model.weights))
            model, digest = loaded[spec]
            if digest == recipe["weights_sha256"]:
                return model
            seen.append(f"{spec} ({digest[:12]})")
        raise ConfigError(
            mismatch(
                f"recipe of model {recipe.get('model')!r}",
                "a model given to recipe_rebuilder([...]) with weights sha256",
                recipe["weights_sha256"][:12],
                seen or "no models given",
            )
        )

    def rebuild(recipe: dict, metadata: dict) -> Rebuilt:
        if recipe.get("network") == DOC_EXAMPLE:
            builder, network, profiles = doc_example_network()
            return network, profiles, builder
        net = network_from_recipe(recipe, metadata, model_for(recipe))
        return net.network, net.profiles, net

    return rebuild


def network_from_recipe(recipe: dict, metadata: dict, model: object) -> object:
    """The network a model engine's sidecar recipe names, rebuilt from ``model`` (a loaded
    :class:`~trt_kv.models.loading.Model`, whose weights must hash to the recorded sha256) with
    the recorded build options.

    Raises:
        ArgumentError: a recipe of no known architecture.
        ConfigError: the model's weights (sha256) or config differ from the recorded ones.
    """
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
