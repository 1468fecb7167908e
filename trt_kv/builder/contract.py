"""A network's decoder roles and optimization profiles, derived from its inputs, outputs and
cache updates (the contract itself, what every role means: :mod:`trt_kv.contract`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trt_kv import _trt, dtypes
from trt_kv.builder.engine import Profile
from trt_kv.builder.kv_cache import cache_aliases
from trt_kv.contract import (
    INPUT_ROLES,
    LOGITS_ROLE,
    NEXT_TOKEN,
    TOKEN_ROLES,
    TOP_IDS,
    CacheRole,
    DecoderRoles,
    Spec,
    check_roles,
    check_tensor,
    check_token_role,
)
from trt_kv.errors import ArgumentError, NetworkError, ShapeError, check_int, mismatch


def _network_specs(network: object) -> tuple[dict[str, Spec], dict[str, Spec]]:
    def spec(t: object) -> Spec:
        return tuple(t.shape), dtypes.name_of(t.dtype)

    ins = {t.name: spec(t) for t in map(network.get_input, range(network.num_inputs))}
    outs = {t.name: spec(t) for t in map(network.get_output, range(network.num_outputs))}
    return ins, outs


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
    check_tensor(LOGITS_ROLE, logits, outputs.get(logits), "float32", (2, 3))
    token_role = check_token_role(chosen, "network inputs")
    token, spec = chosen[token_role], INPUT_ROLES[token_role]
    check_tensor(token_role, token, inputs.get(token), spec.dtype, (spec.rank,))
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
    :func:`trt_kv.engine.store.build_to_file` take (a model's own network class has the same
    fields)."""

    builder: object
    network: object
    profiles: list[Profile]
    roles: DecoderRoles
    keep: object = None  # what keeps the constants' arrays alive
