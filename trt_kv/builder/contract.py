"""The decoder contract: the roles of a network's I/O, which is all the runtime knows of it.

A network any trt_kv backend can drive declares, by tensor name, which input carries each
per-step tensor the runtime computes (:class:`~trt_kv.runtime.cache_state.StepPlan`), which
output holds the logits, and which (input, aliased output) pairs are its caches. Every role is
fed in one dtype, with the batch B on axis 0:

==================  =========================  ==========  =================================
role                default input name         dtype       shape
==================  =========================  ==========  =================================
token_ids **        ``input_ids``              int32       ``[B, S]`` (right-padded with 0)
embeddings **       ``inputs_embeds``          a float     ``[B, S, D]`` (``embed(token_ids)``)
positions           ``position_ids``           int64       ``[B, S]`` (cache row of a token)
write_indices       ``write_indices``          int32       ``[B]`` (first row written)
kv_lengths *        ``key_value_lengths``      int32       ``[B]`` (valid keys after a step)
last_token_rows *   ``last_token_rows``        int32       ``[B]`` (b * S + count_b - 1)
rope_lengths *      ``rope_lengths``           int32       ``[B]`` (length after the request)
update_lengths *    ``update_lengths``         int32       ``[B + 1]`` (packed updates)
logits (output)     ``logits``                 float32     ``[B, V]`` or ``[B, S, V]``
next_token (out) †  ``next_token``             int32       ``[B]`` (greedy: the best id)
top_ids (out) †     ``top_ids``                int32       ``[B, k]`` (the k best ids)
top_logits (out) †  ``top_logits``             float32     ``[B, k]`` (their logits)
==================  =========================  ==========  =================================

(* optional: fed when the network has the input. ** exactly one of the two: a network whose
first input is embeddings declares their float dtype and static D, and its backends turn each
step's ids into them with the ``embed`` function the user gives them.) Caches are
``[B, N, S_max, H]`` (layout ``"BNSH"``) inputs with an aliased output, found from the
cache-update layers. A network whose RoPE switches tables at a length (Phi-3's longrope) also
declares ``long_rope_after``: the runtime prefills a sequence again when it crosses that
length, and the network must then have ``rope_lengths``. Every other input is an error: the
runtime could not feed it.

(† optional sampling outputs, built with ``device_top_k`` = k: ``next_token`` when k = 1,
``top_ids`` and ``top_logits`` when k > 1, never with all-position logits; the roles record
k as ``device_top_k``, 0 without them. A backend can then run a step that downloads the
candidates instead of the logits ``[B, V]``: see :class:`~trt_kv.runtime.backend.Backend`.)

:func:`decoder_roles` builds and checks the role map of a network; ``trt_kv.engine_file``
writes it into the sidecar (``"roles"``) and the GPU backends check it against the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from trt_kv import _trt, dtypes
from trt_kv.builder.engine import Profile
from trt_kv.builder.kv_cache import cache_aliases
from trt_kv.errors import ArgumentError, DTypeError, NetworkError, ShapeError, check_int, mismatch

LAYOUT = "BNSH"  # every cache: [B, N, S_max, H]


@dataclass(frozen=True)
class RoleSpec:
    """How the runtime feeds one input role: the :class:`StepPlan` attribute, dtype, rank."""

    plan_attr: str
    default_name: str
    dtype: str | tuple[str, ...]  # one dtype, or those allowed
    rank: int
    required: bool


FLOAT_DTYPES = ("float32", "float16", "bfloat16")
TOKEN_ROLES = ("token_ids", "embeddings")  # exactly one: what carries a step's tokens
INPUT_ROLES = {
    "token_ids": RoleSpec("input_ids", "input_ids", "int32", 2, False),
    "embeddings": RoleSpec("input_ids", "inputs_embeds", FLOAT_DTYPES, 3, False),
    "positions": RoleSpec("position_ids", "position_ids", "int64", 2, True),
    "write_indices": RoleSpec("write_indices", "write_indices", "int32", 1, True),
    "kv_lengths": RoleSpec("kv_lengths", "key_value_lengths", "int32", 1, False),
    "last_token_rows": RoleSpec("last_token_rows", "last_token_rows", "int32", 1, False),
    "rope_lengths": RoleSpec("rope_lengths", "rope_lengths", "int32", 1, False),
    "update_lengths": RoleSpec("update_lengths", "update_lengths", "int32", 1, False),
}
LOGITS_ROLE = "logits"
NEXT_TOKEN, TOP_IDS, TOP_LOGITS = "next_token", "top_ids", "top_logits"  # sampling outputs

Spec = tuple[tuple[int, ...], str]  # (declared shape, dtype name)


@dataclass(frozen=True)
class CacheRole:
    """One cache: its input, the output aliasing it, and its layout (``"BNSH"``)."""

    input: str
    output: str
    layout: str = LAYOUT


@dataclass(frozen=True)
class DecoderRoles:
    """The role map of a decoder network, and the sizes the runtime reads from it.

    ``inputs`` maps each role the network has to its input name; ``max_batch`` and
    ``max_step_tokens`` are the largest B and S of the token role (``token_ids`` or
    ``embeddings``) over the profiles; ``embedding_dim`` and ``embedding_dtype`` are D and
    the dtype of ``embeddings`` (None for a network of ``token_ids``)."""

    inputs: dict[str, str]
    logits: str
    caches: tuple[CacheRole, ...]
    vocab_size: int
    max_seq_len: int
    max_batch: int
    max_step_tokens: int
    all_logits: bool  # logits [B, S, V] rather than [B, V]
    long_rope_after: int | None = None
    embedding_dim: int | None = None
    embedding_dtype: str | None = None
    device_top_k: int = 0  # k of the sampling outputs (0: none; 1: next_token)

    @property
    def token_role(self) -> str:
        """``"embeddings"`` or ``"token_ids"``: the role that carries a step's tokens."""
        return "embeddings" if "embeddings" in self.inputs else "token_ids"

    def to_json(self) -> dict:
        return {**asdict(self), "caches": [asdict(c) for c in self.caches]}

    @classmethod
    def from_json(cls, d: dict) -> DecoderRoles:
        """Raises ArgumentError for a record that is not a role map (a missing key, say)."""
        try:
            caches = tuple(CacheRole(**c) for c in d["caches"])
            return cls(**{**d, "inputs": dict(d["inputs"]), "caches": caches})
        except (KeyError, TypeError, ValueError) as err:
            raise ArgumentError(mismatch("roles", "a decoder role map", "", repr(err))) from err

    def feed_names(self) -> dict[str, str]:
        """Input name -> the :class:`StepPlan` attribute fed to it (caches excluded)."""
        return {name: INPUT_ROLES[role].plan_attr for role, name in self.inputs.items()}

    def sampling_outputs(self) -> tuple[str, ...]:
        """The sampling outputs' names: ``()``, ``("next_token",)`` (k = 1) or
        ``("top_ids", "top_logits")``."""
        k = self.device_top_k
        return () if k == 0 else (NEXT_TOKEN,) if k == 1 else (TOP_IDS, TOP_LOGITS)


def _network_specs(network: object) -> tuple[dict[str, Spec], dict[str, Spec]]:
    def spec(t: object) -> Spec:
        return tuple(t.shape), dtypes.name_of(t.dtype)

    ins = {t.name: spec(t) for t in map(network.get_input, range(network.num_inputs))}
    outs = {t.name: spec(t) for t in map(network.get_output, range(network.num_outputs))}
    return ins, outs


def _check_tensor(
    role: str, name: str, spec: Spec | None, dtype: str | tuple[str, ...], ranks: tuple
) -> None:
    if spec is None:
        raise NetworkError(mismatch(f"role {role}", "a network tensor named", name, "none"))
    shape, actual = spec
    allowed = (dtype,) if isinstance(dtype, str) else dtype
    if actual not in allowed:
        raise DTypeError(mismatch(f"{name} (role {role})", "dtype", " or ".join(allowed), actual))
    if len(shape) not in ranks:
        raise ShapeError(
            mismatch(f"{name} (role {role})", "rank", " or ".join(map(str, ranks)), len(shape))
        )


def _check_token_role(roles_of: object, where: str) -> str:
    """The one token role among ``roles_of``. Raises NetworkError: both, or neither."""
    found = [r for r in TOKEN_ROLES if r in roles_of]
    if len(found) != 1:
        raise NetworkError(
            mismatch(where, "exactly one of the roles", " or ".join(TOKEN_ROLES), found or "none")
        )
    return found[0]


def check_roles(
    roles: DecoderRoles, inputs: Mapping[str, Spec], outputs: Mapping[str, Spec]
) -> None:
    """Check ``roles`` against a network's (or an engine sidecar's) declared I/O.

    Raises:
        NetworkError: a role naming no tensor, a required role missing, both or neither of
            ``token_ids`` and ``embeddings``, an input that has no role (the runtime could
            not feed it), a cache pair that is not one.
        DTypeError, ShapeError: a role's tensor of another dtype or rank than the contract's
            (or logits whose V differs from ``vocab_size``, embeddings whose D or dtype
            differ from ``embedding_dim`` / ``embedding_dtype``).
    """
    _check_token_role(roles.inputs, "decoder roles")
    for role, spec in INPUT_ROLES.items():
        if spec.required and role not in roles.inputs:
            raise NetworkError(mismatch("decoder roles", "the required role", role, "missing"))
    unknown = sorted(set(roles.inputs) - set(INPUT_ROLES))
    if unknown:
        raise NetworkError(mismatch("decoder roles", "roles among", list(INPUT_ROLES), unknown))
    for role, name in roles.inputs.items():
        spec = INPUT_ROLES[role]
        _check_tensor(role, name, inputs.get(name), spec.dtype, (spec.rank,))
    if "embeddings" in roles.inputs:
        name = roles.inputs["embeddings"]
        shape, dtype = inputs[name]
        if (shape[2], dtype) != (roles.embedding_dim, roles.embedding_dtype):
            want = f"[B, S, {roles.embedding_dim}] {roles.embedding_dtype}"
            raise ShapeError(mismatch(f"{name} (role embeddings)", "", want, f"{shape} {dtype}"))
    _check_tensor(LOGITS_ROLE, roles.logits, outputs.get(roles.logits), "float32", (2, 3))
    shape = outputs[roles.logits][0]
    if shape[-1] != roles.vocab_size or (len(shape) == 3) != roles.all_logits:
        want = f"[B, {'S, ' if roles.all_logits else ''}{roles.vocab_size}]"
        raise ShapeError(mismatch(f"{roles.logits} (role logits)", "shape", want, list(shape)))
    _check_sampling(roles, outputs)
    for cache in roles.caches:
        for name, found in ((cache.input, inputs), (cache.output, outputs)):
            if name not in found:
                raise NetworkError(mismatch(f"cache {cache.input}", "a tensor named", name, "none"))
        if cache.layout != LAYOUT or len(inputs[cache.input][0]) != 4:
            raise ShapeError(mismatch(f"cache {cache.input}", "layout", LAYOUT, cache.layout))
    if roles.long_rope_after is not None and "rope_lengths" not in roles.inputs:
        raise NetworkError(
            mismatch("decoder roles", "with long_rope_after, the role", "rope_lengths", "missing")
        )
    fed = set(roles.inputs.values()) | {c.input for c in roles.caches}
    unfed = sorted(set(inputs) - fed)
    if unfed:
        raise NetworkError(
            mismatch("network inputs", "each with a decoder role", "", f"{unfed} without one")
        )


def _check_sampling(roles: DecoderRoles, outputs: Mapping[str, Spec]) -> None:
    """The sampling outputs of ``roles.device_top_k`` (see the module's table)."""
    k = roles.device_top_k
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= roles.vocab_size:
        raise NetworkError(mismatch("device_top_k", f"an int in [0, {roles.vocab_size}]", "", k))
    if k and roles.all_logits:
        raise NetworkError(mismatch("device_top_k", "0 with all-position logits", "", k))
    wanted = {NEXT_TOKEN: ("int32", 1), TOP_IDS: ("int32", 2), TOP_LOGITS: ("float32", 2)}
    for name in roles.sampling_outputs():
        dtype, rank = wanted[name]
        _check_tensor(name, name, outputs.get(name), dtype, (rank,))
        if rank == 2 and outputs[name][0][-1] != k:
            raise ShapeError(
                mismatch(f"{name} (role {name})", "shape", f"[B, {k}]", outputs[name][0])
            )


def _most(profiles: Sequence[Profile], name: str, declared: tuple[int, ...], axis: int) -> int:
    """The largest size of ``name`` on ``axis`` over the profiles (or its static size)."""
    sizes = [p.shapes[name][2][axis] for p in profiles if name in p.shapes]
    if not sizes and declared[axis] == -1:
        raise ShapeError(mismatch(name, f"a profile range for axis {axis}", "", "none"))
    return max(sizes) if sizes else declared[axis]


def decoder_roles(
    network: object,
    profiles: Sequence[Profile],
    *,
    names: Mapping[str, str] | None = None,
    long_rope_after: int | None = None,
) -> DecoderRoles:
    """The checked role map of ``network`` (every input and output already added).

    Args:
        profiles: the optimization profiles it is built with (B and S bounds come from the
            ranges of ``token_ids``, or of ``embeddings``).
        names: role -> tensor name where it is not the default (:data:`INPUT_ROLES`,
            ``"logits"``); an optional role is taken when the network has its input.
        long_rope_after: the length past which a sequence must be prefilled again (longrope's
            ``original_max_position_embeddings`` when S_max passes it), else None.

    Raises:
        ArgumentError: ``names`` naming an unknown role, ``long_rope_after`` not an int >= 1.
        NetworkError, DTypeError, ShapeError: as :func:`check_roles`; caches of different
            S_max; no cache at all; embeddings whose D (axis 2) is not static.
    """
    names = dict(names or {})
    unknown = sorted(set(names) - {*INPUT_ROLES, LOGITS_ROLE})
    if unknown:
        raise ArgumentError(mismatch("names", "roles among", [*INPUT_ROLES, LOGITS_ROLE], unknown))
    if long_rope_after is not None:
        check_int("long_rope_after", long_rope_after, 1)
    inputs, outputs = _network_specs(network)
    chosen = {}
    for role, spec in INPUT_ROLES.items():
        name = names.get(role, spec.default_name)
        if spec.required or role in names or name in inputs:
            chosen[role] = name
    aliases = cache_aliases(network)
    if not aliases:
        raise NetworkError(mismatch("network", "at least one cache update", "", "none"))
    s_max = {a.shape[2] for a in aliases}
    if len(s_max) != 1:
        raise ShapeError(mismatch("caches", "one S_max (axis 2)", "", sorted(s_max)))
    logits = names.get(LOGITS_ROLE, LOGITS_ROLE)
    _check_tensor(LOGITS_ROLE, logits, outputs.get(logits), "float32", (2, 3))
    token_role = _check_token_role(chosen, "network inputs")
    token, spec = chosen[token_role], INPUT_ROLES[token_role]
    _check_tensor(token_role, token, inputs.get(token), spec.dtype, (spec.rank,))
    (tokens, token_dtype), vocab = inputs[token], outputs[logits][0][-1]
    if vocab < 1:
        raise ShapeError(mismatch(f"{logits} (role logits)", "a static V (last axis)", "", vocab))
    embedded = token_role == "embeddings"
    if embedded and tokens[2] < 1:
        raise ShapeError(mismatch(f"{token} (role embeddings)", "a static D (axis 2)", "", -1))
    roles = DecoderRoles(
        inputs=chosen,
        logits=logits,
        caches=tuple(CacheRole(a.input, a.output) for a in aliases),
        vocab_size=vocab,
        max_seq_len=s_max.pop(),
        max_batch=_most(profiles, token, tokens, 0),
        max_step_tokens=_most(profiles, token, tokens, 1),
        all_logits=len(outputs[logits][0]) == 3,
        long_rope_after=long_rope_after,
        embedding_dim=tokens[2] if embedded else None,
        embedding_dtype=token_dtype if embedded else None,
        device_top_k=1 if NEXT_TOKEN in outputs else outputs.get(TOP_IDS, ((0,), ""))[0][-1],
    )
    check_roles(roles, inputs, outputs)
    return roles


def _role_of_inputs(network: object, names: Mapping[str, str]) -> dict[str, tuple[str, tuple]]:
    """Input name -> (role, declared shape) of every input of ``network`` (role ``"cache"``
    for a cache input, ``""`` for an input with no role)."""
    by_name = {names.get(r, spec.default_name): r for r, spec in INPUT_ROLES.items()}
    caches = {a.input for a in cache_aliases(network)}
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    return {
        t.name: ("cache" if t.name in caches else by_name.get(t.name, ""), tuple(t.shape))
        for t in inputs
    }


def decoder_profiles(
    network: object,
    *,
    max_batch: int,
    max_step_tokens: int,
    names: Mapping[str, str] | None = None,
    one_profile: bool = False,
) -> list[Profile]:
    """The two optimization profiles of a decoder: ``decode`` (S = 1) and ``prefill``
    (S = 1..``max_step_tokens``), B in [1, ``max_batch``] (optimized for ``max_batch``):
    ``[B, S]`` for ``token_ids`` / ``positions``, ``[B, S, D]`` for ``embeddings``, ``[B]``
    for the other per-sequence roles (``[B + 1]`` for ``update_lengths``), ``[B, N, S_max, H]``
    for each cache. With ``one_profile``: one, ``steps`` (S = 1..``max_step_tokens``, optimized
    for S = 1), for networks whose constants TensorRT would store once per profile (INT4
    weights).

    Raises:
        ArgumentError: ``max_batch`` or ``max_step_tokens`` not an integer >= 1.
    """
    check_int("max_batch", max_batch, 1)
    check_int("max_step_tokens", max_step_tokens, 1)
    b, roles = max_batch, _role_of_inputs(network, dict(names or {}))
    profiles = []
    t = max_step_tokens  # (name, S it is optimized for, largest S)
    steps = [("steps", 1, t)] if one_profile else [("decode", 1, 1), ("prefill", t, t)]
    for name, s_opt, s in steps:
        shapes = {}
        for tensor, (role, shape) in roles.items():
            if role in (*TOKEN_ROLES, "positions"):  # [B, S] (embeddings: [B, S, D])
                shapes[tensor] = tuple((n, m, *shape[2:]) for n, m in ((1, 1), (b, s_opt), (b, s)))
            elif role == "cache":
                shapes[tensor] = tuple((n, *shape[1:]) for n in (1, b, b))
            elif role == "update_lengths":
                shapes[tensor] = ((2,), (b + 1,), (b + 1,))
            else:
                shapes[tensor] = ((1,), (b,), (b,))
        profiles.append(Profile(name, shapes))
    return profiles


def name_dimensions(network: object, names: Mapping[str, str] | None = None) -> None:
    """Name axis 0 of every input ``B`` and axis 1 of the token roles (``token_ids``,
    ``embeddings``, ``positions``) ``S``
    (``ITensor.set_dimension_name``: dimensions named alike are equal at run time, so the
    builder compiles the kernels that read every layer's caches once); nothing on a TensorRT
    without dimension names."""
    if not _trt.FEATURES.dimension_names:
        return
    roles = _role_of_inputs(network, dict(names or {}))
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        tensor.set_dimension_name(0, "B")
        if roles[tensor.name][0] in (*TOKEN_ROLES, "positions"):
            tensor.set_dimension_name(1, "S")


@dataclass
class DecoderNetwork:
    """A network that honours the contract, ready to build or interpret: what
    :class:`~trt_kv.runtime.interpreter_backend.InterpreterBackend` and
    :func:`trt_kv.jobs.build_to_file` take (a model's own network class has the same fields)."""

    builder: object
    network: object
    profiles: list[Profile]
    roles: DecoderRoles
    keep: object = None  # what keeps the constants' arrays alive
