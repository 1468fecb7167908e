"""The decoder contract's value rules are written once (trt_kv/contract.py): a role map the
contract refuses, the sidecar reader refuses with the same message (behind its field name),
and check_roles with the same message as a NetworkError. The contract imports nothing of
trt_kv but its errors."""

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest

from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.contract import CacheRole, DecoderRoles, check_device_top_k, check_roles
from trt_kv.engine.file import read_sidecar
from trt_kv.engine.sidecar import EngineMeta, TensorSpec
from trt_kv.errors import ArgumentError, EngineFileError, NetworkError

CACHE = (-1, 1, 8, 4)  # [B, N, S_max, H]
ROLES = DecoderRoles(
    inputs={"token_ids": "input_ids", "positions": "position_ids", "write_indices": "write"},
    logits="logits",
    caches=(CacheRole("past", "present"),),
    vocab_size=7,
    max_seq_len=8,
    max_batch=2,
    max_step_tokens=4,
    all_logits=False,
)
META = EngineMeta(
    trt_module="tensorrt_rtx",
    trt_version="1.2.0",
    sha256="0" * 64,
    nbytes=1,
    aliases=(CacheAlias("past", "present", CACHE, "float32"),),
    write_indices="write",
    inputs=(
        TensorSpec("input_ids", (-1, -1), "int32"),
        TensorSpec("position_ids", (-1, -1), "int64"),
        TensorSpec("write", (-1,), "int32"),
        TensorSpec("past", CACHE, "float32"),
    ),
    outputs=(TensorSpec("logits", (-1, 7), "float32"), TensorSpec("present", CACHE, "float32")),
    profiles=(),
    roles=ROLES,
)


def _set(key, value):
    return lambda d: d.update({key: value})


def _inputs(**edit):
    return lambda d: d["inputs"].update(edit)


# (edit of ROLES.to_json(), the contract's message)
REFUSED = [
    (_set("max_batch", 0), "roles.max_batch: expected an integer >= 1, got 0"),
    (_set("max_seq_len", "x"), "roles.max_seq_len: expected an integer >= 1, got 'x'"),
    (_set("vocab_size", 7.0), "roles.vocab_size: expected an integer >= 1, got 7.0"),
    (_set("max_step_tokens", 9), "roles.max_step_tokens: expected <= max_seq_len = 8, got 9"),
    (_set("logits", ""), "roles.logits: expected a non-empty string, got ''"),
    (_set("all_logits", 1), "roles.all_logits: expected true or false, got 1"),
    (_set("long_rope_after", 0), "roles.long_rope_after: expected an integer >= 1, got 0"),
    (
        _set("long_rope_after", 4),
        "roles: expected with long_rope_after, the role rope_lengths, got missing",
    ),
    (_set("device_top_k", -1), r"roles.device_top_k: expected an integer in [0, 7], got -1"),
    (_set("device_top_k", 8), r"roles.device_top_k: expected an integer in [0, 7], got 8"),
    (_set("device_top_k", True), r"roles.device_top_k: expected an integer in [0, 7], got True"),
    (
        lambda d: d.update(device_top_k=2, all_logits=True),
        "roles.device_top_k: expected 0 with all_logits (logits of every position), got 2",
    ),
    (_set("inputs", {}), "roles.inputs: expected an object: role -> input name, got {}"),
    (
        _inputs(ids="x"),
        "roles.inputs: expected roles among ['embeddings', 'kv_lengths', 'last_token_rows', "
        "'positions', 'rope_lengths', 'token_ids', 'update_lengths', 'write_indices'], "
        "got 'ids'",
    ),
    (_inputs(token_ids=3), "roles.inputs.token_ids: expected a non-empty string, got 3"),
    (
        _inputs(embeddings="e"),
        "roles: expected exactly one of the roles token_ids or embeddings, "
        "got ['token_ids', 'embeddings']",
    ),
    (
        lambda d: d["inputs"].pop("positions"),
        "roles: expected the required role positions, got missing",
    ),
    (_set("embedding_dim", 0), "roles.embedding_dim: expected an integer >= 1, got 0"),
    (
        lambda d: d.update(embedding_dim=4, embedding_dtype="int32"),
        "roles.embedding_dtype: expected one of ['float32', 'float16', 'bfloat16'], got 'int32'",
    ),
    (
        lambda d: d["caches"][0].update(layout="BSNH"),
        "roles.caches[0].layout: expected 'BNSH', got 'BSNH'",
    ),
    (
        lambda d: d["caches"][0].update(input=""),
        "roles.caches[0].input: expected a non-empty string, got ''",
    ),
]


@pytest.mark.parametrize(("edit", "message"), REFUSED)
def test_a_role_map_the_contract_refuses_the_sidecar_and_check_roles_refuse_alike(
    tmp_path, edit, message
):
    record = ROLES.to_json()
    edit(record)
    with pytest.raises(ArgumentError) as contract:
        DecoderRoles.from_json(record)
    assert str(contract.value) == message
    sidecar = {**META.to_json(), "roles": record}
    path = tmp_path / "x.engine.json"
    path.write_text(json.dumps(sidecar))
    with pytest.raises(EngineFileError) as read:
        read_sidecar(path)
    assert str(read.value) == f"{path}: sidecar field {message}"
    roles = replace(ROLES, **{k: v for k, v in record.items() if k != "caches"})
    roles = replace(roles, caches=tuple(CacheRole(**c) for c in record["caches"]))
    with pytest.raises(NetworkError) as checked:
        check_roles(roles, {}, {})
    assert str(checked.value) == f"decoder {message}"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("vocab_size"), "roles: expected an object with keys"),
        (_set("extra", 1), "roles: expected an object with keys"),
        (_set("caches", "past"), "roles.caches: expected a list, got 'past'"),
        (
            lambda d: d["caches"][0].pop("layout"),
            r"roles.caches\[0\]: expected an object with keys \['input', 'output', 'layout'\]",
        ),
    ],
)
def test_a_record_that_is_not_a_role_map_is_refused_by_both_readers(tmp_path, edit, message):
    record = ROLES.to_json()
    edit(record)
    with pytest.raises(ArgumentError, match=f"^{message}"):
        DecoderRoles.from_json(record)
    path = tmp_path / "x.engine.json"
    path.write_text(json.dumps({**META.to_json(), "roles": record}))
    with pytest.raises(EngineFileError, match=f"^{path}: sidecar field {message}"):
        read_sidecar(path)


def test_the_members_added_later_may_be_absent_and_read_as_their_defaults(tmp_path):
    record = ROLES.to_json()
    for key in ("embedding_dim", "embedding_dtype", "device_top_k"):
        record.pop(key)
    assert DecoderRoles.from_json(record) == ROLES
    path = tmp_path / "x.engine.json"
    path.write_text(json.dumps({**META.to_json(), "roles": record}))
    assert read_sidecar(path).roles == ROLES
    assert read_sidecar(path) == META


def test_a_good_role_map_passes_every_check():
    ROLES.check()
    specs = lambda ts: {t.name: (t.shape, t.dtype) for t in ts}  # noqa: E731
    check_roles(ROLES, specs(META.inputs), specs(META.outputs))
    assert DecoderRoles.from_json(json.loads(json.dumps(ROLES.to_json()))) == ROLES


@pytest.mark.parametrize(
    ("k", "message"),
    [
        (65, "device_top_k: expected an integer in [0, 64], got 65"),
        (1.0, "device_top_k: expected an integer in [0, 64], got 1.0"),
        (2, "device_top_k: expected 0 with all_logits (logits of every position), got 2"),
    ],
)
def test_the_network_builder_refuses_device_top_k_by_the_contracts_rule(k, message):
    from tests.support.tiny_models import TINY_GQA
    from trt_kv.models.layers.graph import check_device_top_k as builder_rule

    assert TINY_GQA.vocab_size == 64
    for rule in (check_device_top_k, builder_rule):
        with pytest.raises(ArgumentError) as err:
            rule(k, TINY_GQA.vocab_size, all_logits=k == 2)
        assert str(err.value) == message


def test_the_builder_adds_tensorrts_largest_k_to_the_contracts_bound():
    from trt_kv.models.layers.graph import TOP_K_MOST
    from trt_kv.models.layers.graph import check_device_top_k as builder_rule

    assert check_device_top_k(5000, 10_000, False) == 5000
    with pytest.raises(ArgumentError, match=rf"in \[0, {TOP_K_MOST}\], got 5000$"):
        builder_rule(5000, 10_000, False)


def test_the_contract_imports_nothing_of_trt_kv_but_its_errors():
    path = Path(__file__).resolve().parent.parent / "trt_kv" / "contract.py"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert {m for m in imported if m.startswith("trt_kv")} == {"trt_kv.errors"}
