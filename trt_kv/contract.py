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
``trt_kv.engine.file`` writes it into the sidecar (``"roles"``) and the GPU backends check it
against the engine. Every rule of a role map on its own is :meth:`DecoderRoles.check` (the
builder, :func:`check_roles` and the sidecar's reader call it); this module imports nothing of
trt_kv but its errors, so every layer can read the contract.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields

from trt_kv.errors import (
    ArgumentError,
    DTypeError,
    NetworkError,
    ShapeError,
    TrtKvError,
    check_int,
    mismatch,
)

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
Error = type[TrtKvError]  # the exception a check raises, for its caller's kind of input
# a member added after the first sidecars: a role map's JSON may lack it (its default then)
_ADDED_LATER = {"added_later": True}


@dataclass(frozen=True)
class CacheRole:
    """One cache: its input, the output aliasing it, and its layout (``"BNSH"``)."""

    input: str
    output: str
    layout: str = LAYOUT

    def check(self, where: str = "cache") -> None:
        """Raises ArgumentError: a name that is not a non-empty string, a layout other than
        ``"BNSH"``; naming the member (``<where>.layout``)."""
        _name(f"{where}.input", self.input)
        _name(f"{where}.output", self.output)
        if self.layout != LAYOUT:
            raise _fail(f"{where}.layout", repr(LAYOUT), self.layout)


@dataclass(frozen=True)
class DecoderRoles:
    """The role map of a decoder network, and the sizes the runtime reads from it.

    ``inputs`` maps each role the network has to its input name; ``max_batch`` and
    ``max_step_tokens`` are the largest B and S of the token role (``token_ids`` or
    ``embeddings``) over the profiles; ``embedding_dim`` and ``embedding_dtype`` are D and
    the dtype of ``embeddings`` (None for a network of ``token_ids``).

    :meth:`check` holds every rule of a role map on its own (the builder's
    :func:`check_roles` and the sidecar's reader, :meth:`from_json`, call it)."""

    inputs: dict[str, str]
    logits: str
    caches: tuple[CacheRole, ...]
    vocab_size: int
    max_seq_len: int
    max_batch: int
    max_step_tokens: int
    all_logits: bool  # logits [B, S, V] rather than [B, V]
    long_rope_after: int | None = None
    embedding_dim: int | None = field(default=None, metadata=_ADDED_LATER)
    embedding_dtype: str | None = field(default=None, metadata=_ADDED_LATER)
    device_top_k: int = field(
        default=0, metadata=_ADDED_LATER
    )  # k of the sampling outputs (0: none)

    @property
    def token_role(self) -> str:
        """``"embeddings"`` or ``"token_ids"``: the role that carries a step's tokens."""
        return "embeddings" if "embeddings" in self.inputs else "token_ids"

    def to_json(self) -> dict:
        return {**asdict(self), "caches": [asdict(c) for c in self.caches]}

    @classmethod
    def from_json(
        cls, d: object, where: str = "roles", error: Error = ArgumentError
    ) -> DecoderRoles:
        """The role map of a :meth:`to_json` record, checked by :meth:`check`. A member added
        after the first sidecars (``embedding_dim``, ``embedding_dtype``, ``device_top_k``)
        may be absent: its default.

        Raises:
            ``error`` (ArgumentError unless given), naming the member (``<where>.max_batch:
            expected an integer >= 1, got 0``): not an object with the members' keys, caches
            not a list of ``{input, output, layout}`` objects, or as :meth:`check`.
        """
        with _raising(error):
            record = _members(cls, d, where)
            caches = record["caches"]
            if not isinstance(caches, (list, tuple)):
                raise _fail(f"{where}.caches", "a list", caches)
            caches = tuple(
                CacheRole(**_members(CacheRole, c, f"{where}.caches[{i}]"))
                for i, c in enumerate(caches)
            )
            inputs = record["inputs"]
            inputs = dict(inputs) if isinstance(inputs, Mapping) else inputs
            roles = cls(**{**record, "inputs": inputs, "caches": caches})
        roles.check(where, error)
        return roles

    def check(self, where: str = "roles", error: Error = ArgumentError) -> None:
        """Every member by type and range, and the rules between members: ``inputs`` maps
        known roles to names, with exactly one token role and every required role;
        ``vocab_size``, ``max_seq_len``, ``max_batch``, ``max_step_tokens`` integers >= 1,
        ``max_step_tokens`` <= ``max_seq_len``; no tensor named by two roles (an input role
        or a cache); ``long_rope_after`` None or >= 1 (and then the ``rope_lengths`` role);
        ``embedding_dim`` >= 1 and ``embedding_dtype`` a float dtype with ``embeddings``;
        ``device_top_k`` as :func:`check_device_top_k`.

        Raises:
            ``error`` (ArgumentError unless given), naming the member: ``<where>.max_batch:
            expected an integer >= 1, got 0``.
        """
        with _raising(error):
            _check_members(self, where)

    def feed_names(self) -> dict[str, str]:
        """Input name -> the :class:`StepPlan` attribute fed to it (caches excluded)."""
        return {name: INPUT_ROLES[role].plan_attr for role, name in self.inputs.items()}

    def sampling_outputs(self) -> tuple[str, ...]:
        """The sampling outputs' names: ``()``, ``("next_token",)`` (k = 1) or
        ``("top_ids", "top_logits")``."""
        k = self.device_top_k
        return () if k == 0 else (NEXT_TOKEN,) if k == 1 else (TOP_IDS, TOP_LOGITS)


def check_device_top_k(
    k: object,
    vocab_size: int,
    all_logits: bool,
    most: int | None = None,
    where: str = "device_top_k",
) -> int:
    """``k`` as a ``device_top_k``: an integer in ``[0, vocab_size]`` (and <= ``most`` when
    given: the largest a builder makes), 0 with all-position logits.

    Raises:
        ArgumentError: another value, naming ``where``.
    """
    k = check_int(where, k, 0, vocab_size if most is None else min(vocab_size, most))
    if k and all_logits:
        raise _fail(where, "0 with all_logits (logits of every position)", k)
    return k


@contextmanager
def _raising(error: Error) -> Iterator[None]:
    """The rules' ArgumentError raised as ``error``, the exception of the caller's kind of
    input (a sidecar's EngineFileError, a network's NetworkError)."""
    try:
        yield
    except ArgumentError as err:
        if error is ArgumentError:
            raise
        raise error(str(err)) from err


def _fail(where: str, what: str, value: object) -> ArgumentError:
    return ArgumentError(mismatch(where, what, "", repr(value)))


def _name(where: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(where, "a non-empty string", value)
    return value


def _members(cls: type, value: object, where: str) -> dict:
    """``value`` as the keyword arguments of the dataclass ``cls``: an object with a key per
    member (those marked later may be absent). Raises ArgumentError."""
    later = [f.name for f in fields(cls) if f.metadata.get("added_later")]
    needed = [f.name for f in fields(cls) if f.name not in later]
    if not isinstance(value, Mapping) or not set(needed) <= set(value) <= {*needed, *later}:
        optional = f" (and optionally {later})" if later else ""
        raise _fail(where, f"an object with keys {needed}{optional}", value)
    return dict(value)


def _check_members(r: DecoderRoles, where: str) -> None:
    """The rules of :meth:`DecoderRoles.check`. Raises ArgumentError."""
    if not isinstance(r.inputs, Mapping) or not r.inputs:
        raise _fail(f"{where}.inputs", "an object: role -> input name", r.inputs)
    for role, name in r.inputs.items():
        if role not in INPUT_ROLES:
            raise _fail(f"{where}.inputs", f"roles among {sorted(INPUT_ROLES)}", role)
        _name(f"{where}.inputs.{role}", name)
    check_token_role(r.inputs, where, ArgumentError)
    for role, spec in INPUT_ROLES.items():
        if spec.required and role not in r.inputs:
            raise ArgumentError(mismatch(where, "the required role", role, "missing"))
    _name(f"{where}.logits", r.logits)
    if not isinstance(r.caches, tuple) or not all(isinstance(c, CacheRole) for c in r.caches):
        raise _fail(f"{where}.caches", "a tuple of CacheRole", r.caches)
    for i, cache in enumerate(r.caches):
        cache.check(f"{where}.caches[{i}]")
    _check_one_role_each(r, where)
    for key in ("vocab_size", "max_seq_len", "max_batch", "max_step_tokens"):
        check_int(f"{where}.{key}", getattr(r, key), 1)
    if r.max_step_tokens > r.max_seq_len:
        raise _fail(
            f"{where}.max_step_tokens", f"<= max_seq_len = {r.max_seq_len}", r.max_step_tokens
        )
    if not isinstance(r.all_logits, bool):
        raise _fail(f"{where}.all_logits", "true or false", r.all_logits)
    if r.long_rope_after is not None:
        check_int(f"{where}.long_rope_after", r.long_rope_after, 1)
        if "rope_lengths" not in r.inputs:
            raise ArgumentError(
                mismatch(where, "with long_rope_after, the role", "rope_lengths", "missing")
            )
    if r.embedding_dim is not None or "embeddings" in r.inputs:
        check_int(f"{where}.embedding_dim", r.embedding_dim, 1)
        if r.embedding_dtype not in FLOAT_DTYPES:
            raise _fail(
                f"{where}.embedding_dtype", f"one of {list(FLOAT_DTYPES)}", r.embedding_dtype
            )
    check_device_top_k(r.device_top_k, r.vocab_size, r.all_logits, where=f"{where}.device_top_k")


def _check_one_role_each(r: DecoderRoles, where: str) -> None:
    """Raises ArgumentError for a tensor that two roles (an input role or a cache) name: the
    runtime would feed it twice, one value overwriting the other."""
    named = [*r.inputs.items(), *((f"cache {c.input}", c.input) for c in r.caches)]
    by_tensor: dict[str, list[str]] = {}
    for role, name in named:
        by_tensor.setdefault(name, []).append(role)
    for name, of in by_tensor.items():
        if len(of) > 1:
            got = f"{name} named by the roles {' and '.join(of)}"
            raise ArgumentError(mismatch(where, "one role per tensor", "", got))


def check_tensor(
    role: str, name: str, spec: Spec | None, dtype: str | tuple[str, ...], ranks: tuple
) -> None:
    """The tensor ``name`` of ``role``, ``spec`` = (declared shape, dtype name), has one of
    the dtypes ``dtype`` and a rank among ``ranks``.

    Raises:
        NetworkError: no such tensor (``spec`` None). DTypeError, ShapeError: another dtype,
            another rank.
    """
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


def check_token_role(roles_of: object, where: str, error: Error = NetworkError) -> str:
    """The one token role among ``roles_of``. Raises ``error``: both, or neither."""
    found = [r for r in TOKEN_ROLES if r in roles_of]
    if len(found) != 1:
        raise error(
            mismatch(where, "exactly one of the roles", " or ".join(TOKEN_ROLES), found or "none")
        )
    return found[0]


def check_roles(
    roles: DecoderRoles, inputs: Mapping[str, Spec], outputs: Mapping[str, Spec]
) -> None:
    """Check ``roles`` against a network's (or an engine sidecar's) declared I/O.

    Raises:
        NetworkError: ``roles`` that fail :meth:`DecoderRoles.check` (a required role
            missing, both or neither of ``token_ids`` and ``embeddings``...), a role naming
            no tensor, an input that has no role (the runtime could not feed it), a cache pair
            that is not one.
        DTypeError, ShapeError: a role's tensor of another dtype or rank than the contract's
            (or logits whose V differs from ``vocab_size``, embeddings whose D or dtype
            differ from ``embedding_dim`` / ``embedding_dtype``).
    """
    roles.check("decoder roles", NetworkError)
    for role, name in roles.inputs.items():
        spec = INPUT_ROLES[role]
        check_tensor(role, name, inputs.get(name), spec.dtype, (spec.rank,))
    if "embeddings" in roles.inputs:
        name = roles.inputs["embeddings"]
        shape, dtype = inputs[name]
        if (shape[2], dtype) != (roles.embedding_dim, roles.embedding_dtype):
            want = f"[B, S, {roles.embedding_dim}] {roles.embedding_dtype}"
            raise ShapeError(mismatch(f"{name} (role embeddings)", "", want, f"{shape} {dtype}"))
    check_tensor(LOGITS_ROLE, roles.logits, outputs.get(roles.logits), "float32", (2, 3))
    shape = outputs[roles.logits][0]
    if shape[-1] != roles.vocab_size or (len(shape) == 3) != roles.all_logits:
        want = f"[B, {'S, ' if roles.all_logits else ''}{roles.vocab_size}]"
        raise ShapeError(mismatch(f"{roles.logits} (role logits)", "shape", want, list(shape)))
    _check_sampling(roles, outputs)
    for cache in roles.caches:
        for name, found in ((cache.input, inputs), (cache.output, outputs)):
            if name not in found:
                raise NetworkError(mismatch(f"cache {cache.input}", "a tensor named", name, "none"))
        if len(inputs[cache.input][0]) != 4:
            raise ShapeError(mismatch(f"cache {cache.input}", "layout", LAYOUT, cache.layout))
    fed = set(roles.inputs.values()) | {c.input for c in roles.caches}
    unfed = sorted(set(inputs) - fed)
    if unfed:
        raise NetworkError(
            mismatch("network inputs", "each with a decoder role", "", f"{unfed} without one")
        )


def _check_sampling(roles: DecoderRoles, outputs: Mapping[str, Spec]) -> None:
    """The sampling outputs of ``roles.device_top_k`` (see the module's table)."""
    k = roles.device_top_k
    wanted = {NEXT_TOKEN: ("int32", 1), TOP_IDS: ("int32", 2), TOP_LOGITS: ("float32", 2)}
    for name in roles.sampling_outputs():
        dtype, rank = wanted[name]
        check_tensor(name, name, outputs.get(name), dtype, (rank,))
        if rank == 2 and outputs[name][0][-1] != k:
            raise ShapeError(
                mismatch(f"{name} (role {name})", "shape", f"[B, {k}]", outputs[name][0])
            )
