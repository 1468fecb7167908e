"""The engine store: engine names, the reuse rule, and builds (network -> engine bytes ->
engine file with sidecar, as one call each), by default in :data:`trt_kv.engine.ENGINES_DIR`.

A model engine's file name comes from the model's name, a short digest of its weights and
:class:`BuildOptions` (every option that changes the built engine), so engines of other
shapes or of other weights never overwrite each other. :func:`find_model_engine` reuses an
engine only when everything that decides its bytes matches (weights sha256, config, every
build option, routes, TensorRT module and version, compute-capability targets, decoder
roles) and says otherwise why it must be rebuilt. A new build option is a new field of
:class:`BuildOptions` (and a keyword of every architecture's network builder, e.g.
``build_llama_network``, of the same name, unless its metadata says ``"network": False``:
an engine-build option such as the compute-capability targets): it joins the file name, the
sidecar key and the build call without further edits. The architecture comes from the config's type
(:mod:`trt_kv.models.architectures`); the sidecar records the network's decoder roles.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trt_kv import build_defaults as defaults
from trt_kv._trt import FEATURES
from trt_kv.builder import DecoderRoles, Profile, Routes, build_engine
from trt_kv.builder.doc_example import doc_example_network
from trt_kv.engine import ENGINES_DIR
from trt_kv.engine.digest import weights_digest
from trt_kv.engine.file import (
    EngineMeta,
    describe,
    load_engine_file,
    read_sidecar,
    save_engine,
    sidecar_path,
)
from trt_kv.errors import ArgumentError, EngineFileError, mismatch
from trt_kv.gpu_targets import PORTABLE, parse_targets
from trt_kv.interrupts import held_sigint, step
from trt_kv.models.architectures import architecture_of

OPTIONS_KEY = "build_options"  # sidecar metadata: the BuildOptions an engine was built with
BUILT_AT_KEY = "built_at"  # sidecar metadata: UTC time the build finished (ISO 8601)
DIGEST_CHARS = 8  # hex digits of the weights sha256 in an engine's file name


@dataclass(frozen=True)
class BuildOptions:
    """Every option of a model engine build (keywords of ``build_llama_network``).

    File-name parts: ``float16-s512-b8-t128`` and ``k1`` always; other fields only off
    their default, as ``name_value`` (``name`` for True). The defaults are
    :mod:`trt_kv.build_defaults`'s; ``max_step_tokens`` None is
    :func:`~trt_kv.build_defaults.default_step_tokens`, ``device_top_k`` None
    :func:`~trt_kv.build_defaults.default_device_top_k` (1; 0 with ``all_logits``).

    Each field's metadata, every key optional: ``"tag"``, its name in the file name (default:
    the field's name); ``"always"``: True to name it at its default value too; ``"network"``:
    False for an option of the engine build, not a keyword of the network builder.
    """

    dtype: str = field(default=defaults.DTYPE, metadata={"tag": "", "always": True})
    max_seq_len: int = field(default=defaults.MAX_SEQ_LEN, metadata={"tag": "s", "always": True})
    max_batch: int = field(default=defaults.MAX_BATCH, metadata={"tag": "b", "always": True})
    max_step_tokens: int | None = field(default=None, metadata={"tag": "t", "always": True})
    all_logits: bool = False
    # the route of each network part ("auto": the best available)
    routes: Routes = field(default_factory=Routes)
    # None: weights in ``dtype``; "int8" / "int4" / "keep" (see build_llama_network)
    weight_format: str | None = field(default=None, metadata={"tag": "weights"})
    # k of the network's own next-token candidates (0: off; see build_llama_network); None:
    # the default for all_logits (build_defaults.default_device_top_k). Always in the file
    # name ("-k1"): an engine named before the default became 1 (no "-k") is never reused
    device_top_k: int | None = field(default=None, metadata={"tag": "k", "always": True})
    # GPU targets: "portable" (TensorRT-RTX's default), or "8.9" / "8.0,12.0"
    # (IBuilderConfig.set_compute_capability; see trt_kv.gpu_targets)
    compute_capability: str = field(default=PORTABLE, metadata={"tag": "cc", "network": False})

    def __post_init__(self) -> None:
        if self.max_step_tokens is None and isinstance(self.max_seq_len, int):
            step = defaults.default_step_tokens(self.max_seq_len)
            object.__setattr__(self, "max_step_tokens", step)
        if self.device_top_k is None:
            k = defaults.default_device_top_k(self.all_logits)
            object.__setattr__(self, "device_top_k", k)
        if isinstance(self.routes, dict):  # from to_json(): a sidecar or a CLI round trip
            object.__setattr__(self, "routes", Routes.from_json(self.routes))
        if self.weight_format == self.dtype:  # weights in the activation dtype: the default
            object.__setattr__(self, "weight_format", None)
        if isinstance(self.compute_capability, str) and self.compute_capability != PORTABLE:
            parts = sorted({p.strip() for p in self.compute_capability.split(",")})
            object.__setattr__(self, "compute_capability", ",".join(parts))  # one name each

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def network_options(self) -> dict:
        """The keywords of ``build_llama_network``."""
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if f.metadata.get("network", True)}

    def targets(self, option: str = "compute_capability") -> tuple[tuple[int, int], ...]:
        """The compute capabilities to build for (``()``: portable).

        Raises:
            ArgumentError: naming ``option``, for a target the installed TensorRT cannot
                build for.
        """
        return parse_targets(self.compute_capability, FEATURES.module, FEATURES.version, option)

    def key(self) -> str:
        """The file-name part naming these options, e.g. ``"float16-s512-b8-t128"``."""
        parts = []
        for f in dataclasses.fields(self):
            value, tag = getattr(self, f.name), f.metadata.get("tag", f.name)
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            if value == default and not f.metadata.get("always", False):
                continue
            if value is True:
                parts.append(tag)
            elif hasattr(value, "key"):  # a structured option that names itself (Routes)
                parts.append(value.key())
            elif isinstance(value, (bool, int, float, str)):
                parts.append(tag + ("_" if tag and isinstance(value, str) else ""))
                parts[-1] += re.sub(r"[^A-Za-z0-9.]+", "_", str(value))
            else:  # anything structured: a short digest of its JSON
                text = json.dumps(value, sort_keys=True, default=str)
                parts.append(f"{tag}_{hashlib.sha256(text.encode()).hexdigest()[:8]}")
        return "-".join(parts)


@dataclass(frozen=True)
class BuiltFile:
    """One engine on disk and its sidecar content; ``reused`` when found, not built;
    ``rebuilt``: why an engine found for it, or for its model's other weights
    (:data:`NO_ENGINE_FOR_WEIGHTS`), could not be reused ("" when none was found)."""

    path: Path
    meta: EngineMeta
    reused: bool = False
    rebuilt: str = ""

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
    targets: tuple[tuple[int, int], ...] = (),
) -> BuiltFile:
    """Compile ``network`` for ``targets`` (``()``: portable) and write ``path`` plus its
    sidecar (with the build time and ``roles``, the decoder contract a session backend
    reads: None for a network that is not a decoder, such as the doc example); nothing is
    written when the build fails or is interrupted before the renames, and both when
    Ctrl-C comes during them: KeyboardInterrupt then, never before the sidecar is in place
    (:func:`trt_kv.interrupts.held_sigint`)."""
    with held_sigint():
        built = build_engine(builder, network, profiles, targets=targets)
        step("engine built")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        md = {**(metadata or {}), BUILT_AT_KEY: stamp}
        meta = describe(network, built, profiles, md, roles, targets)
        return BuiltFile(save_engine(path, built, meta), meta)


def _write_beside(path: Path, data: bytes) -> None:
    """``data`` to ``path`` through a temporary file renamed over it."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_bytes(data)
    os.replace(temp, path)


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


def model_engine_path(
    name: str,
    options: BuildOptions,
    out_dir: Path | str = ENGINES_DIR,
    weights_sha256: str | None = None,
) -> Path:
    """``out_dir / "<name>-<weights_sha256[:8]>-<options.key()>.engine"`` (without the
    digest part when ``weights_sha256`` is None).

    Raises:
        ArgumentError: ``name`` not a non-empty file-name part (no path separator).
    """
    if not isinstance(name, str) or not name or "/" in name or "\\" in name:
        raise ArgumentError(
            mismatch("name", "a file-name part (no path separator)", "", repr(name))
        )
    digest = "" if weights_sha256 is None else f"-{weights_sha256[:DIGEST_CHARS]}"
    return Path(out_dir) / f"{name}{digest}-{options.key()}.engine"


def weights_of(metadata: dict) -> str | None:
    """The weights sha256 an engine's sidecar metadata records (its recipe), if any."""
    recipe = metadata.get("recipe")
    return recipe.get("weights_sha256") if isinstance(recipe, dict) else None


# find_model_engine's reason when only engines of the model's other weights were found: a
# new file is built beside them (its name holds the weights' digest), none is replaced
NO_ENGINE_FOR_WEIGHTS = "no engine for these weights"


def _changed(what: str, old: object, new: object) -> str:
    return f"{what} changed ({old} -> {new})"


def _targets_text(targets: tuple[tuple[int, int], ...]) -> str:
    return " ".join(f"{a}.{b}" for a, b in targets) or PORTABLE


def _short(sha: str | None) -> str:
    return f"sha256 {sha[:DIGEST_CHARS]}..." if sha else "sha256 unrecorded"


def _why_not(
    path: Path, config: object, options: BuildOptions, weights_sha256: str
) -> tuple[EngineMeta | None, str]:
    """``(sidecar, "")`` when the engine at ``path`` may be reused, else ``(None, why)``."""
    if not sidecar_path(path).is_file():
        return None, f"{path.name} has no sidecar (treated as absent)"
    try:
        _, meta = load_engine_file(path, check_version=False)
    except EngineFileError as err:
        return None, f"{path.name} is unusable ({err})"
    if meta.roles is None:
        return None, f"{path.name} has no decoder roles (built before the decoder contract)"
    md = meta.metadata
    built, running = (meta.trt_module, meta.trt_version), (FEATURES.module, FEATURES.version)
    checks = (
        ("weights", _short(weights_of(md)), _short(weights_sha256)),
        ("TensorRT", " ".join(built), " ".join(running)),
        ("GPU targets", _targets_text(meta.targets), _targets_text(options.targets())),
        ("config", md.get("config"), config.to_json()),
        ("build options", md.get(OPTIONS_KEY), options.to_json()),
    )
    for what, old, new in checks:
        if old != new:
            if isinstance(old, dict) and isinstance(new, dict):  # name the keys that differ
                keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
                return None, f"{what} changed in {keys}"
            return None, _changed(what, old, new)
    return meta, ""


def find_model_engine(
    name: str,
    config: object,
    options: BuildOptions,
    out_dir: Path = ENGINES_DIR,
    weights_sha256: str = "",
) -> tuple[BuiltFile | None, str]:
    """``(the engine, "")`` when ``out_dir`` holds one built from these weights, config and
    exactly these options (routes and GPU targets included), by the running TensorRT, with
    an intact checksum and decoder roles; else ``(None, why)``: ``""`` when no engine of
    this name and these options was found, else the first difference in one line; for an
    engine of the same model name and options built from other weights, which stays on
    disk, ``no engine for these weights (sha256 9c01ab34...; the one for sha256
    3f2a9c01... stays)``."""
    path = model_engine_path(name, options, out_dir, weights_sha256)
    if path.is_file() or sidecar_path(path).is_file():
        meta, why = _why_not(path, config, options, weights_sha256)
        return (BuiltFile(path, meta, reused=True), "") if meta else (None, why)
    pattern = f"{name}-{'?' * DIGEST_CHARS}-{options.key()}.engine"
    for other in sorted(Path(out_dir).glob(pattern)):
        try:
            old = weights_of(read_sidecar(sidecar_path(other)).metadata)
        except EngineFileError:
            continue  # a file without a valid sidecar is treated as absent
        kept = f"the one for {_short(old)} stays"
        return None, f"{NO_ENGINE_FOR_WEIGHTS} ({_short(weights_sha256)}; {kept})"
    return None, ""


def build_model_engine(
    name: str,
    config: object,
    weights: object,
    *,
    out_dir: Path = ENGINES_DIR,
    weights_sha256: str | None = None,
    **options: object,
) -> BuiltFile:
    """An engine for prefill and decode of any architecture trt_kv builds (by the type of
    ``config``: a LlamaConfig, a GPT2Config), written to ``out_dir`` under a name that covers
    the weights and every build option; the sidecar holds the decoder roles, the config,
    the options and a recipe (architecture, the model's ``name`` and weights sha256, never
    a path) from which the same network can be rebuilt
    (:func:`trt_kv.engine.recipes.network_from_recipe`), e.g. by the emulated TensorRT runtime.

    ``options`` are :class:`BuildOptions` fields (``dtype``, ``max_seq_len``,
    ``max_batch``, ``max_step_tokens``, ``compute_capability``, ...; ``max_seq_len`` left
    out: the architecture's default for ``config``, e.g. GPT-2's ``n_positions`` when that is
    below :data:`trt_kv.build_defaults.MAX_SEQ_LEN`); an unknown one or a
    target the installed TensorRT cannot build for is an ArgumentError, raised (as every
    argument check) before anything is built. ``weights_sha256``: :func:`weights_digest`
    of ``weights`` when the caller has it already (computed here otherwise).
    """
    known = [f.name for f in dataclasses.fields(BuildOptions)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ArgumentError(mismatch("options", "BuildOptions fields", known, unknown))
    arch = architecture_of(config)
    if "max_seq_len" not in options:  # GPT-2: at most its position table
        options["max_seq_len"] = arch.default_max_seq_len(config)
    opts = BuildOptions(**options)
    targets = opts.targets()
    digest = weights_sha256 or weights_digest(weights)
    path = model_engine_path(name, opts, out_dir, digest)
    # Ctrl-C while TensorRT builds the network (it would swallow a KeyboardInterrupt raised
    # in its logger's callback) stops the job once the network is built
    with held_sigint() as held:
        net = arch.build_network(config, weights, **opts.network_options())
        step("network built")
        held.check()
        metadata = {
            **net.metadata(),
            OPTIONS_KEY: opts.to_json(),
            "recipe": {"network": arch.name, "model": name, "weights_sha256": digest},
        }
        built = build_to_file(
            net.builder, net.network, net.profiles, path, metadata, net.roles, targets
        )
        # files a network keeps next to its engine (an ONNX model's rewritten graph)
        for suffix, data in getattr(net, "beside_engine", dict)().items():
            _write_beside(path.with_name(path.name + suffix), data)
        return built
