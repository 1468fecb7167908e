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

:func:`~trt_kv.builder.contract.decoder_roles` builds and checks the role map of a network;
``trt_kv.engine_file`` writes it into the sidecar (``"roles"``) and the GPU backends check it
against the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from trt_kv.errors import ArgumentError, DTypeError, NetworkError, ShapeError, mismatch

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
