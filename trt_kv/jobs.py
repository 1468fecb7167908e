"""Build jobs: network -> engine bytes -> engine file with sidecar, as one call each.

A model engine's file name and sidecar key come from :class:`BuildOptions`, every option
that changes the built engine, so engines of other shapes never overwrite each other and a
cached engine is reused only when every option matches. A new build option is a new field
of :class:`BuildOptions` (and a keyword of every architecture's network builder, e.g.
``build_llama_network``, of the same name): it joins the file name, the sidecar key and the
build call without further edits. The architecture comes from the config's type
(:mod:`trt_kv.models.architectures`); the sidecar records the network's decoder roles.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trt_kv import build_defaults as defaults
from trt_kv.builder import DecoderRoles, Profile, Routes, build_engine
from trt_kv.engine_file import EngineMeta, describe, load_engine_file, save_engine
from trt_kv.engines_dir import ENGINES_DIR
from trt_kv.errors import ArgumentError, EngineFileError, mismatch
from trt_kv.examples import doc_example_network
from trt_kv.models.architectures import architecture_named, architecture_of

OPTIONS_KEY = "build_options"  # sidecar metadata: the BuildOptions an engine was built with
BUILT_AT_KEY = "built_at"  # sidecar metadata: UTC time the build finished (ISO 8601)


def _tag(tag: str, always: bool = True) -> dict:
    """Field metadata: the file-name ``tag`` and whether it shows at its default value."""
    return {"tag": tag, "always": always}


@dataclass(frozen=True)
class BuildOptions:
    """Every option of a model engine build (keywords of ``build_llama_network``).

    File-name parts: ``float16-s512-b8-t128`` always; other fields only off their default,
    as ``name_value`` (``name`` for True). The defaults are :mod:`trt_kv.build_defaults`'s;
    ``max_step_tokens`` None is ``min(128, max_seq_len)``.
    """

    dtype: str = field(default=defaults.DTYPE, metadata=_tag(""))
    max_seq_len: int = field(default=defaults.MAX_SEQ_LEN, metadata=_tag("s"))
    max_batch: int = field(default=defaults.MAX_BATCH, metadata=_tag("b"))
    max_step_tokens: int | None = field(default=None, metadata=_tag("t"))
    all_logits: bool = False
    # the route of each network part ("auto": the best available)
    routes: Routes = field(default_factory=Routes)
    # None: weights in ``dtype``; "int8" / "int4" / "keep" (see build_llama_network)
    weight_format: str | None = field(default=None, metadata=_tag("weights", always=False))

    def __post_init__(self) -> None:
        if self.max_step_tokens is None and isinstance(self.max_seq_len, int):
            step = defaults.default_step_tokens(self.max_seq_len)
            object.__setattr__(self, "max_step_tokens", step)
        if isinstance(self.routes, dict):  # from to_json(): a sidecar or a CLI round trip
            object.__setattr__(self, "routes", Routes.from_json(self.routes))
        if self.weight_format == self.dtype:  # weights in the activation dtype: the default
            object.__setattr__(self, "weight_format", None)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def network_options(self) -> dict:
        """The keywords of ``build_llama_network``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def key(self) -> str:
        """The file-name part naming these options, e.g. ``"float16-s512-b8-t128"``."""
        parts = []
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata or _tag(f.name, always=False)
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            if value == default and not meta["always"]:
                continue
            if value is True:
                parts.append(meta["tag"])
            elif hasattr(value, "key"):  # a structured option that names itself (Routes)
                parts.append(value.key())
            elif isinstance(value, (bool, int, float, str)):
                parts.append(meta["tag"] + ("_" if meta["tag"] and isinstance(value, str) else ""))
                parts[-1] += re.sub(r"[^A-Za-z0-9.]+", "_", str(value))
            else:  # anything structured: a short digest of its JSON
                text = json.dumps(value, sort_keys=True, default=str)
                parts.append(f"{meta['tag']}_{hashlib.sha256(text.encode()).hexdigest()[:8]}")
        return "-".join(parts)


@dataclass(frozen=True)
class BuiltFile:
    """One engine on disk and its sidecar content; ``reused`` when found, not built."""

    path: Path
    meta: EngineMeta
    reused: bool = False

    @property
    def built_at(self) -> str | None:
        """When the engine was built (UTC, ISO 8601), if its sidecar says."""
        return self.meta.metadata.get(BUILT_AT_KEY)


def build_to_file(
    builder: object,
    network: object,
    profiles: list[Profile],
    path: Path,
    metadata: dict | None = None,
    roles: DecoderRoles | None = None,
) -> BuiltFile:
    """Compile ``network`` and write ``path`` plus its sidecar (with the build time and
    ``roles``, the decoder contract a session backend reads: None for a network that is not
    a decoder, such as the doc example)."""
    built = build_engine(builder, network, profiles)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta = describe(network, built, profiles, {**(metadata or {}), BUILT_AT_KEY: stamp}, roles)
    return BuiltFile(save_engine(path, built, meta), meta)


DOC_EXAMPLE = "kv_cache_doc_example"
DOC_EXAMPLE_METADATA = {"model": DOC_EXAMPLE, "recipe": {"network": DOC_EXAMPLE}}


def build_doc_example(out_dir: Path = ENGINES_DIR) -> BuiltFile:
    """The KVCacheUpdate documentation example (float32 cache [4, 2, 8, 1])."""
    builder, network, profiles = doc_example_network()
    path = out_dir / f"{DOC_EXAMPLE}.engine"
    return build_to_file(builder, network, profiles, path, DOC_EXAMPLE_METADATA)


def find_doc_example(out_dir: Path = ENGINES_DIR) -> BuiltFile | None:
    """The documentation example's engine in ``out_dir`` as :func:`build_doc_example` wrote
    it, readable by the running TensorRT with an intact checksum; None otherwise."""
    path = out_dir / f"{DOC_EXAMPLE}.engine"
    return _reusable(
        path, lambda meta: all(meta.metadata.get(k) == v for k, v in DOC_EXAMPLE_METADATA.items())
    )


def doc_example_engine(out_dir: Path = ENGINES_DIR) -> BuiltFile:
    """:func:`find_doc_example`, else :func:`build_doc_example`."""
    return find_doc_example(out_dir) or build_doc_example(out_dir)


def _reusable(path: Path, matches: Callable[[EngineMeta], bool]) -> BuiltFile | None:
    """``path`` as a reused :class:`BuiltFile` when it and its sidecar load (checksum,
    TensorRT module and version) and ``matches(its sidecar)``; None otherwise."""
    if not path.is_file():
        return None
    try:
        _, meta = load_engine_file(path)
    except EngineFileError:
        return None  # stale, tampered with, or from another TensorRT: rebuild
    return BuiltFile(path, meta, reused=True) if matches(meta) else None


def model_engine_path(name: str, options: BuildOptions, out_dir: Path | str = ENGINES_DIR) -> Path:
    """``out_dir / "<name>-<options.key()>.engine"``.

    Raises:
        ArgumentError: ``name`` not a non-empty file-name part (no path separator).
    """
    if not isinstance(name, str) or not name or "/" in name or "\\" in name:
        raise ArgumentError(
            mismatch("name", "a file-name part (no path separator)", "", repr(name))
        )
    return Path(out_dir) / f"{name}-{options.key()}.engine"


def find_model_engine(
    name: str, config: object, options: BuildOptions, out_dir: Path = ENGINES_DIR
) -> BuiltFile | None:
    """The engine in ``out_dir`` built for this model config and exactly these options,
    readable by the running TensorRT with an intact checksum and decoder roles (an engine
    built before the decoder contract is rebuilt); None otherwise."""
    return _reusable(
        model_engine_path(name, options, out_dir),
        lambda meta: (
            meta.roles is not None
            and meta.metadata.get(OPTIONS_KEY) == options.to_json()
            and meta.metadata.get("config") == config.to_json()
        ),
    )


def build_model_engine(
    name: str,
    config: object,
    weights: object,
    *,
    out_dir: Path = ENGINES_DIR,
    source: str | None = None,
    **options: object,
) -> BuiltFile:
    """An engine for prefill and decode of any architecture trt_kv builds (by the type of
    ``config``: a LlamaConfig, a GPT2Config), written to ``out_dir`` under a name that covers
    every build option; the sidecar holds the decoder roles, the config and the options.

    ``options`` are :class:`BuildOptions` fields (``dtype``, ``max_seq_len``,
    ``max_batch``, ``max_step_tokens``, ...); an unknown one is an ArgumentError naming it
    and the known ones, raised (as every argument check) before anything is built.
    ``source``: the ``load_model`` spec the weights came from ("default" or a checkpoint
    folder); the sidecar then records a recipe (architecture, source and weights sha256)
    from which the same network can be rebuilt (:func:`network_from_recipe`), e.g. by the
    emulated TensorRT runtime.
    """
    known = [f.name for f in dataclasses.fields(BuildOptions)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ArgumentError(mismatch("options", "BuildOptions fields", known, unknown))
    arch = architecture_of(config)
    opts = BuildOptions(**options)
    path = model_engine_path(name, opts, out_dir)
    net = arch.build_network(config, weights, **opts.network_options())
    metadata = {**net.metadata(), OPTIONS_KEY: opts.to_json()}
    if source is not None:
        metadata["recipe"] = {
            "network": arch.name,
            "model": source,
            "weights_sha256": weights_digest(weights),
        }
    return build_to_file(net.builder, net.network, net.profiles, path, metadata, net.roles)


def network_from_recipe(recipe: dict, metadata: dict) -> object:
    """The network a model engine's sidecar recipe names, rebuilt from its source (a
    ``load_model`` spec) with the recorded build options.

    Raises:
        ArgumentError: a recipe of no known architecture.
        ConfigError: the source's weights (sha256) or config differ from the recorded ones.
    """
    from trt_kv.errors import ConfigError
    from trt_kv.examples import load_model

    arch = architecture_named(recipe.get("network"))
    model = load_model(recipe["model"], progress=False)
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


def weights_digest(weights: object) -> str:
    """sha256 over every weight array's dtype, shape and bytes, in a fixed order."""
    digest = hashlib.sha256()
    for a in architecture_of(weights).weight_arrays(weights):
        if a is not None:
            a = np.ascontiguousarray(a)
            digest.update(f"{a.dtype.str}{a.shape}".encode())
            digest.update(a.reshape(-1).view(np.uint8))
    return digest.hexdigest()


# The names before GPT-2 (Llama engines only), for code written against them.
build_llama_engine, find_llama_engine = build_model_engine, find_model_engine
