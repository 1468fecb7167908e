"""The JSON sidecar of an engine file: what it holds, and every field checked when read.

One table, :data:`FIELDS`, lists each JSON key with its :class:`EngineMeta` attribute, the
reader that checks its type and range, and the writer; a new field is one row there and one
attribute of :class:`EngineMeta`. After the fields, :func:`check_consistent` checks the
sidecar against itself (alias pairs naming declared tensors of their shape and dtype, the
write-index input declared, profiles covering every dynamic input with shapes of its rank,
min <= opt <= max). Any failure is an :class:`~trt_kv.errors.EngineFileError` naming the
field (``sidecar field alias_pairs[0].dtype: expected ..., got ...``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real

from trt_kv import dtypes
from trt_kv.builder.engine import Profile
from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.contract import DecoderRoles
from trt_kv.errors import EngineFileError, mismatch

FORMAT = 2  # 2: compute_capabilities; the recipe names its model, never a path
CC = tuple[int, int]


@dataclass(frozen=True)
class TensorSpec:
    """A network input or output: name, declared shape (-1 = dynamic), dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class EngineMeta:
    """Everything the sidecar holds. ``targets``: the compute capabilities the engine was
    built for, ``()`` for a portable engine."""

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
    targets: tuple[CC, ...] = ()
    roles: DecoderRoles | None = None  # the decoder contract (trt_kv.contract)

    def to_json(self) -> dict:
        out: dict = {"format": FORMAT}
        for f in FIELDS:
            value = getattr(self, f.attr)
            if value is not None or not f.optional:
                out[f.key] = f.write(value)
        return out

    @classmethod
    def from_json(cls, d: object) -> EngineMeta:
        """Parse and check a sidecar dict.

        Raises:
            EngineFileError: not an object, another ``format``, a missing field, a field of
                the wrong type or out of range, or fields that disagree with each other;
                naming the field.
        """
        if not isinstance(d, dict):
            raise EngineFileError(mismatch("sidecar", "a JSON object", "", type(d).__name__))
        if d.get("format") != FORMAT:
            raise EngineFileError(mismatch("sidecar", "format", FORMAT, repr(d.get("format"))))
        missing = [f.key for f in FIELDS if f.key not in d and not f.optional]
        if missing:
            raise EngineFileError(
                mismatch("sidecar", "fields", [f.key for f in FIELDS], f"no {missing}")
            )
        meta = cls(**{f.attr: f.read(f"sidecar field {f.key}", d.get(f.key)) for f in FIELDS})
        check_consistent(meta)
        return meta

    def input(self, name: str) -> TensorSpec:
        for t in self.inputs:
            if t.name == name:
                return t
        raise EngineFileError(
            mismatch("engine input", "one of", [t.name for t in self.inputs], name)
        )


# -- readers: (where, value) -> the value, or EngineFileError naming ``where`` ---------------
def _fail(where: str, what: str, value: object) -> EngineFileError:
    return EngineFileError(mismatch(where, what, "", repr(value)))


def _typed(kind: type, what: str) -> Callable[[str, object], object]:
    def read(where: str, value: object) -> object:
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise _fail(where, what, value)
        return value

    return read


_flag = _typed(bool, "true or false")


def _text(where: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(where, "a non-empty string", value)
    return value


def _sha256(where: str, value: object) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value):
        raise _fail(where, "64 lower-case hex digits", value)
    return value


def _count(where: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(where, "an integer >= 1", value)
    return value


def _seconds(where: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 <= value < float("inf"):
        raise _fail(where, "a number of seconds >= 0", value)
    return float(value)


def _dtype(where: str, value: object) -> str:
    if value not in dtypes.NAMES:
        raise EngineFileError(mismatch(where, "one of", list(dtypes.NAMES), repr(value)))
    return value


def _shape(where: str, value: object, rank: int | None = None) -> tuple[int, ...]:
    ok = isinstance(value, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and (d >= 1 or d == -1) for d in value
    )
    if not ok or (rank is not None and len(value) != rank):
        what = "a list of dims, each >= 1 or -1 (dynamic)"
        raise _fail(where, what if rank is None else f"{what}, {rank} of them", value)
    return tuple(value)


def _record(where: str, value: object, keys: tuple[str, ...]) -> dict:
    if not isinstance(value, dict) or sorted(value) != sorted(keys):
        raise _fail(where, f"an object with keys {list(keys)}", value)
    return value


def _listed(read_one: Callable[[str, object], object]) -> Callable[[str, object], tuple]:
    def read(where: str, value: object) -> tuple:
        if not isinstance(value, list):
            raise _fail(where, "a list", value)
        return tuple(read_one(f"{where}[{i}]", v) for i, v in enumerate(value))

    return read


def _tensor(where: str, value: object) -> TensorSpec:
    d = _record(where, value, ("name", "shape", "dtype"))
    return TensorSpec(
        _text(f"{where}.name", d["name"]),
        _shape(f"{where}.shape", d["shape"]),
        _dtype(f"{where}.dtype", d["dtype"]),
    )


def _alias(where: str, value: object) -> CacheAlias:
    d = _record(where, value, ("input", "output", "shape", "dtype"))
    shape = _shape(f"{where}.shape", d["shape"], rank=4)
    if min(shape[1:]) < 1:  # only the batch axis is dynamic: [B, N, S_max, H]
        raise _fail(f"{where}.shape", "[B, N, S_max, H] with N, S_max and H >= 1", d["shape"])
    return CacheAlias(
        _text(f"{where}.input", d["input"]),
        _text(f"{where}.output", d["output"]),
        shape,
        _dtype(f"{where}.dtype", d["dtype"]),
    )


def _profile(where: str, value: object) -> Profile:
    d = _record(where, value, ("name", "shapes"))
    name = _text(f"{where}.name", d["name"])
    if not isinstance(d["shapes"], dict):
        raise _fail(f"{where}.shapes", "an object: input -> [min, opt, max]", d["shapes"])
    shapes = {}
    for tensor, triple in d["shapes"].items():
        at = f"{where}.shapes.{tensor}"
        ok = isinstance(triple, list) and len(triple) == 3
        ok = ok and all(
            isinstance(s, list)
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in s)
            for s in triple
        )
        if not ok:
            raise _fail(at, "[min, opt, max], three lists of sizes >= 0", triple)
        shapes[tensor] = tuple(tuple(s) for s in triple)
    return Profile(name, shapes)


def _optional_text(where: str, value: object) -> str | None:
    return None if value is None else _text(where, value)


def _cache_update(where: str, value: object) -> str | None:
    if value not in ("layer", "plugin", None):
        raise EngineFileError(mismatch(where, "one of", ["layer", "plugin", None], repr(value)))
    return value


def _targets(where: str, value: object) -> tuple[CC, ...]:
    if value == "portable":
        return ()
    texts = value if isinstance(value, list) and value else [None]
    if not all(isinstance(t, str) and re.fullmatch(r"\d+\.\d", t) for t in texts):
        raise _fail(where, "'portable' or a non-empty list of 'major.minor'", value)
    return tuple(sorted((int(t.split(".")[0]), int(t.split(".")[1])) for t in texts))


def targets_json(targets: tuple[CC, ...]) -> str | list[str]:
    """``()`` -> ``"portable"``; ``((8, 9),)`` -> ``["8.9"]``."""
    return [f"{a}.{b}" for a, b in targets] if targets else "portable"


def _roles(where: str, value: object) -> DecoderRoles | None:
    """The decoder role map, checked by the contract (:meth:`DecoderRoles.from_json`: the
    runtime sizes its buffers and steps from it)."""
    return None if value is None else DecoderRoles.from_json(value, where, EngineFileError)


# metadata keys a model's network writes (LlamaNetwork.metadata), each read where present
_METADATA_KEYS: dict[str, Callable[[str, object], object]] = {
    "max_seq_len": _count,
    "max_batch": _count,
    "max_step_tokens": _count,
    "all_logits": _flag,
}


def _metadata(where: str, value: object) -> dict:
    """The free-form metadata object; the sizes a model's network records are checked as
    the roles' are (an engine without them, the doc example, has none)."""
    _typed(dict, "an object")(where, value)
    for key, read in _METADATA_KEYS.items():
        if key in value:
            read(f"{where}.{key}", value[key])
    return value


@dataclass(frozen=True)
class Field:
    """One sidecar field: JSON ``key``, :class:`EngineMeta` ``attr``, its reader and writer;
    an ``optional`` one may be absent (read as None) and is not written when None."""

    key: str
    attr: str
    read: Callable[[str, object], object]
    write: Callable[[object], object] = lambda v: v
    optional: bool = False


def _jsons(items: tuple) -> list:
    return [x.to_json() for x in items]


FIELDS: tuple[Field, ...] = (
    Field("trt_module", "trt_module", _text),
    Field("trt_version", "trt_version", _text),
    Field("compute_capabilities", "targets", _targets, targets_json),
    Field("sha256", "sha256", _sha256),
    Field("bytes", "nbytes", _count),
    Field("alias_pairs", "aliases", _listed(_alias), _jsons),
    Field("write_indices", "write_indices", _optional_text),
    Field("inputs", "inputs", _listed(_tensor), _jsons),
    Field("outputs", "outputs", _listed(_tensor), _jsons),
    Field("profiles", "profiles", _listed(_profile), _jsons),
    Field("build_seconds", "build_seconds", _seconds),
    Field("cache_update", "cache_update", _cache_update),
    Field("metadata", "metadata", _metadata),
    Field("roles", "roles", _roles, lambda r: None if r is None else r.to_json(), optional=True),
)


def check_consistent(meta: EngineMeta) -> None:
    """The sidecar against itself (see the module docstring).

    Raises:
        EngineFileError: naming the field that disagrees, what it should be and what it is.
    """
    tensors: dict[str, tuple[str, TensorSpec]] = {}
    for kind, group in (("inputs", meta.inputs), ("outputs", meta.outputs)):
        for i, t in enumerate(group):
            if t.name in tensors:
                raise _fail(f"sidecar field {kind}[{i}].name", "a name used once", t.name)
            tensors[t.name] = (kind, t)
    for i, a in enumerate(meta.aliases):
        for role, name in (("input", a.input), ("output", a.output)):
            where = f"sidecar field alias_pairs[{i}]"
            kind, t = tensors.get(name, (None, None))
            if kind != f"{role}s":
                raise _fail(f"{where}.{role}", f"a declared network {role}", name)
            if (t.shape, t.dtype) != (a.shape, a.dtype):
                raise EngineFileError(
                    mismatch(
                        where,
                        f"the shape and dtype of {role} {name}",
                        (t.shape, t.dtype),
                        (a.shape, a.dtype),
                    )
                )
    if meta.roles is not None:
        s_max = {a.shape[2] for a in meta.aliases}
        if s_max != {meta.roles.max_seq_len}:
            raise EngineFileError(
                mismatch(
                    "sidecar field roles.max_seq_len",
                    "the S_max of every alias pair",
                    sorted(s_max),
                    meta.roles.max_seq_len,
                )
            )
    if meta.write_indices is not None and tensors.get(meta.write_indices, ("",))[0] != "inputs":
        raise _fail("sidecar field write_indices", "a declared network input", meta.write_indices)
    dynamic = [t.name for t in meta.inputs if -1 in t.shape]
    for i, p in enumerate(meta.profiles):
        where = f"sidecar field profiles[{i}]"
        absent = [n for n in dynamic if n not in p.shapes]
        if absent:
            raise EngineFileError(
                mismatch(where, "shapes for every dynamic input", "", f"none for {absent}")
            )
        for name, triple in p.shapes.items():
            kind, t = tensors.get(name, (None, None))
            if kind != "inputs":
                raise _fail(f"{where}.shapes", "declared network inputs", name)
            for s in triple:
                if len(s) != len(t.shape) or any(d not in (-1, x) for d, x in zip(t.shape, s)):
                    raise EngineFileError(
                        mismatch(f"{where}.shapes.{name}", "shapes matching", t.shape, list(s))
                    )
            lo, opt, hi = triple
            if any(a > b for a, b in zip(lo, opt)) or any(a > b for a, b in zip(opt, hi)):
                raise _fail(f"{where}.shapes.{name}", "min <= opt <= max on every axis", triple)
