"""Engine files: ``NAME.engine`` plus a JSON sidecar ``NAME.engine.json``.

The sidecar records what the runtime needs without deserializing the engine (which takes a
GPU): TensorRT module and version, alias pairs, each cache's name/shape/dtype, the
write-index tensor, every network input and output, optimization profiles, the sha256 of the
engine bytes, and free-form metadata (a model config, say). Loading checks checksum and
versions; :func:`check_engine_aliases` checks a deserialized engine against the sidecar.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from trt_kv import dtypes
from trt_kv._trt import FEATURES
from trt_kv.builder.contract import DecoderRoles
from trt_kv.builder.engine import BuiltEngine, Profile, cache_update_method
from trt_kv.builder.kv_cache import CacheAlias, cache_aliases, cache_update_layers, source_input
from trt_kv.errors import EngineFileError, mismatch

FORMAT = 1
REQUIRED_FIELDS = (
    "format",
    "trt_module",
    "trt_version",
    "sha256",
    "bytes",
    "alias_pairs",
    "write_indices",
    "inputs",
    "outputs",
    "profiles",
)


@dataclass(frozen=True)
class TensorSpec:
    """A network input or output: name, declared shape (-1 = dynamic), dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class EngineMeta:
    """Everything the sidecar holds."""

    trt_module: str
    trt_version: str
    sha256: str
    nbytes: int
    aliases: tuple[CacheAlias, ...]
    write_indices: str | None
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    profiles: tuple[Profile, ...]
    build_seconds: float = 0.0
    metadata: dict = field(default_factory=dict)
    cache_update: str | None = "layer"  # "layer" or "plugin"
    roles: DecoderRoles | None = None  # the decoder contract (trt_kv.builder.contract)

    def to_json(self) -> dict:
        spec = lambda t: {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}  # noqa: E731
        return {
            "format": FORMAT,
            "trt_module": self.trt_module,
            "trt_version": self.trt_version,
            "sha256": self.sha256,
            "bytes": self.nbytes,
            "alias_pairs": [a.to_json() for a in self.aliases],
            "write_indices": self.write_indices,
            "inputs": [spec(t) for t in self.inputs],
            "outputs": [spec(t) for t in self.outputs],
            "profiles": [p.to_json() for p in self.profiles],
            "build_seconds": self.build_seconds,
            "cache_update": self.cache_update,
            "metadata": self.metadata,
            **({} if self.roles is None else {"roles": self.roles.to_json()}),
        }

    @classmethod
    def from_json(cls, d: dict) -> EngineMeta:
        """Parse a sidecar dict.

        Raises:
            EngineFileError: a missing field, a field of the wrong type, or a ``format``
                other than this trt_kv's.
        """
        if not isinstance(d, dict):
            raise EngineFileError(mismatch("sidecar", "a JSON object", "", type(d).__name__))
        missing = [k for k in REQUIRED_FIELDS if k not in d]
        if missing:
            raise EngineFileError(
                mismatch("sidecar", "fields", list(REQUIRED_FIELDS), f"no {missing}")
            )
        if d["format"] != FORMAT:
            raise EngineFileError(mismatch("sidecar", "format", FORMAT, repr(d["format"])))
        spec = lambda t: TensorSpec(t["name"], tuple(t["shape"]), t["dtype"])  # noqa: E731
        try:
            meta = cls(
                trt_module=_typed(d, "trt_module", str),
                trt_version=_typed(d, "trt_version", str),
                sha256=_typed(d, "sha256", str),
                nbytes=_typed(d, "bytes", int),
                aliases=tuple(CacheAlias.from_json(a) for a in _typed(d, "alias_pairs", list)),
                write_indices=d["write_indices"],
                inputs=tuple(spec(t) for t in _typed(d, "inputs", list)),
                outputs=tuple(spec(t) for t in _typed(d, "outputs", list)),
                profiles=tuple(Profile.from_json(p) for p in _typed(d, "profiles", list)),
                build_seconds=d.get("build_seconds", 0.0),
                metadata=_typed(d, "metadata", dict) if "metadata" in d else {},
                cache_update=d.get("cache_update", "layer"),
                roles=DecoderRoles.from_json(d["roles"]) if d.get("roles") else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise EngineFileError(
                mismatch("sidecar", "well-formed alias, tensor and profile records", "", repr(err))
            ) from err
        return meta

    def input(self, name: str) -> TensorSpec:
        for t in self.inputs:
            if t.name == name:
                return t
        raise EngineFileError(
            mismatch("engine input", "one of", [t.name for t in self.inputs], name)
        )


def _typed(d: dict, key: str, kind: type) -> object:
    value = d[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise EngineFileError(
            mismatch(f"sidecar field {key!r}", "type", kind.__name__, repr(value))
        )
    return value


def sidecar_path(engine_path: Path) -> Path:
    return engine_path.with_name(engine_path.name + ".json")


def _specs(tensors: list) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t.name, tuple(t.shape), dtypes.name_of(t.dtype)) for t in tensors)


def _write_indices_name(network: object) -> str | None:
    updates = cache_update_layers(network)
    return source_input(network, updates[0][1].get_input(2)).name if updates else None


def describe(
    network: object,
    built: BuiltEngine,
    profiles: list[Profile],
    metadata: dict | None = None,
    roles: DecoderRoles | None = None,
) -> EngineMeta:
    """The sidecar content of an engine built from ``network`` (``roles``: its decoder
    contract, :func:`~trt_kv.builder.contract.decoder_roles`, for an engine a session runs)."""
    return EngineMeta(
        trt_module=FEATURES.module,
        trt_version=FEATURES.version,
        sha256=hashlib.sha256(built.data).hexdigest(),
        nbytes=len(built.data),
        aliases=tuple(cache_aliases(network)),
        write_indices=_write_indices_name(network),
        inputs=_specs([network.get_input(i) for i in range(network.num_inputs)]),
        outputs=_specs([network.get_output(i) for i in range(network.num_outputs)]),
        profiles=tuple(profiles),
        build_seconds=round(built.build_seconds, 3),
        metadata=metadata or {},
        cache_update=cache_update_method(network),
        roles=roles,
    )


def save_engine(path: Path | str, built: BuiltEngine, meta: EngineMeta) -> Path:
    """Write the engine bytes and the sidecar; returns the engine path.

    Raises:
        EngineFileError: the folder cannot be made or the files cannot be written (a parent
            that is a file, no permission...); the OSError is the cause.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(built.data)
        sidecar_path(path).write_text(json.dumps(meta.to_json(), indent=2) + "\n")
    except OSError as err:
        raise EngineFileError(
            mismatch(str(path), "a writable location", "", f"{type(err).__name__}: {err}")
        ) from err
    return path


def read_sidecar(path: Path) -> EngineMeta:
    """The sidecar at ``path``, parsed and checked.

    Raises:
        EngineFileError: unreadable, not UTF-8, not JSON, or not a trt_kv sidecar (see
            :meth:`EngineMeta.from_json`); library errors are the cause.
    """
    try:
        text = path.read_bytes().decode("utf-8")
        d = json.loads(text)
    except OSError as err:
        raise EngineFileError(mismatch(str(path), "a readable file", "", err)) from err
    except UnicodeDecodeError as err:
        raise EngineFileError(mismatch(str(path), "UTF-8 text", "", err.reason)) from err
    except json.JSONDecodeError as err:
        raise EngineFileError(mismatch(str(path), "a JSON sidecar", "", err)) from err
    try:
        return EngineMeta.from_json(d)
    except EngineFileError as err:
        raise EngineFileError(f"{path}: {err}") from err


def _state(path: Path) -> str:
    """What stands at ``path`` instead of a file: ``"a folder"`` or ``"missing"``."""
    return "a folder" if path.is_dir() else "missing"


def check_engine_files(path: Path) -> Path:
    """The sidecar path of ``path`` once both files exist.

    Raises:
        EngineFileError: the engine missing (or a folder), naming it; its sidecar missing,
            naming the engine and the sidecar's file name (a file trt_kv did not build, say).
    """
    if not path.is_file():
        raise EngineFileError(mismatch(str(path), "an existing file", "", _state(path)))
    side = sidecar_path(path)
    if not side.is_file():
        what = "an engine built by trt_kv, with its JSON sidecar beside it:"
        raise EngineFileError(mismatch(str(path), what, side.name, _state(side)))
    return side


def load_engine_file(path: Path | str, *, check_version: bool = True) -> tuple[bytes, EngineMeta]:
    """Read an engine and its sidecar; verify size, sha256 and the TensorRT module/version.

    Raises:
        EngineFileError: missing or unreadable file or sidecar; a malformed sidecar (not
            UTF-8, not JSON, missing or mistyped fields, another ``format``); size or checksum
            mismatch (tampered or truncated engine); an engine built by another TensorRT
            module or version.
    """
    path = Path(path)
    meta = read_sidecar(check_engine_files(path))
    try:
        data = path.read_bytes()
    except OSError as err:
        raise EngineFileError(mismatch(str(path), "a readable file", "", err)) from err
    if len(data) != meta.nbytes:
        raise EngineFileError(
            mismatch(str(path), "size in bytes (from the sidecar)", meta.nbytes, len(data))
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != meta.sha256:
        raise EngineFileError(mismatch(str(path), "sha256 (from the sidecar)", meta.sha256, digest))
    if check_version:
        built_with = (meta.trt_module, meta.trt_version)
        running = (FEATURES.module, FEATURES.version)
        if built_with != running:
            raise EngineFileError(
                mismatch(str(path), "built by the running TensorRT", running, built_with)
            )
    return data, meta


def check_engine_aliases(engine: object, meta: EngineMeta) -> None:
    """Check a deserialized ``ICudaEngine`` aliases each cache output to its sidecar input.

    Plugin engines are exempt: TensorRT may not report plugin aliasing through
    ``get_aliased_input_tensor``, so their pairs come from the sidecar alone.
    """
    if meta.cache_update == "plugin":
        return
    for alias in meta.aliases:
        actual = engine.get_aliased_input_tensor(alias.output)
        if actual != alias.input:
            raise EngineFileError(
                mismatch(f"engine output {alias.output}", "aliased input", alias.input, actual)
            )
