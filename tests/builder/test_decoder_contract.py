"""The decoder contract: one function builds and checks a network's role map, the sidecar
records it, the GPU backends refuse an engine without one, and a custom network (neither
Llama nor GPT-2) decodes on every backend (scripts/bring_your_own_decoder.py)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trt_kv._trt import trt
from trt_kv.builder import add_model_caches, create_network, decoder_roles
from trt_kv.builder.contract import decoder_profiles
from trt_kv.contract import DecoderRoles
from trt_kv.engine.file import EngineMeta
from trt_kv.errors import DTypeError, EngineFileError, NetworkError

ROOT = Path(__file__).resolve().parents[2]


def network(positions_dtype=trt.int64, extra_input=None, logits_dtype="float32"):
    """Inputs input_ids, position_ids, write_indices and one layer's caches; logits [B, 7]."""
    builder, net = create_network()
    ids = net.add_input("input_ids", trt.int32, (-1, -1))
    net.add_input("position_ids", positions_dtype, (-1, -1))
    caches = add_model_caches(
        net, num_layers=1, num_kv_heads=1, head_dim=4, max_seq_len=8, dtype="float32"
    )
    if extra_input:
        net.add_input(extra_input, trt.int32, (-1,))
    table = np.ones((7, 4), np.float32)
    w = net.add_constant(table.shape, trt.Weights(table)).get_output(0)
    x = net.add_gather(w, ids, 0).get_output(0)  # [B, S, 4]
    shuffle = net.add_shuffle(x)
    shuffle.reshape_dims = (0, 1, -1, 4)  # [B, 1, S, 4]
    k, _ = caches.update(0, shuffle.get_output(0), shuffle.get_output(0))
    reduce = net.add_reduce(k, trt.ReduceOperation.SUM, (1 << 1) | (1 << 2), False)  # [B, 4]
    logits = net.add_matrix_multiply(
        reduce.get_output(0), trt.MatrixOperation.NONE, w, trt.MatrixOperation.TRANSPOSE
    ).get_output(0)  # [B, 7]
    if logits_dtype != "float32":
        logits = net.add_cast(logits, trt.float16).get_output(0)
    logits.name = "logits"
    net.mark_output(logits)
    return builder, net, table


def test_a_network_that_honours_the_contract_gets_its_role_map():
    _, net, _ = network()
    profiles = decoder_profiles(net, max_batch=3, max_step_tokens=5)
    roles = decoder_roles(net, profiles)
    assert roles.inputs == {
        "token_ids": "input_ids",
        "positions": "position_ids",
        "write_indices": "write_indices",
    }
    assert (roles.vocab_size, roles.max_seq_len, roles.max_batch, roles.max_step_tokens) == (
        7,
        8,
        3,
        5,
    )
    assert [(c.input, c.output, c.layout) for c in roles.caches] == [
        ("past_key.0", "present_key.0", "BNSH"),
        ("past_value.0", "present_value.0", "BNSH"),
    ]
    assert DecoderRoles.from_json(json.loads(json.dumps(roles.to_json()))) == roles


def test_a_missing_role_is_named():
    _, net, _ = network()
    profiles = decoder_profiles(net, max_batch=1, max_step_tokens=1)
    with pytest.raises(
        NetworkError, match=r"^role positions: expected a network tensor named pos, got none$"
    ):
        decoder_roles(net, profiles, names={"positions": "pos"})


def test_a_role_of_another_dtype_is_named():
    _, net, _ = network(positions_dtype=trt.int32)
    profiles = decoder_profiles(net, max_batch=1, max_step_tokens=1)
    with pytest.raises(
        DTypeError, match=r"^position_ids \(role positions\): expected dtype int64, got int32$"
    ):
        decoder_roles(net, profiles)


def test_logits_that_are_not_float32_are_refused():
    _, net, _ = network(logits_dtype="float16")
    profiles = decoder_profiles(net, max_batch=1, max_step_tokens=1)
    with pytest.raises(DTypeError, match=r"^logits \(role logits\): expected dtype float32"):
        decoder_roles(net, profiles)


def test_an_input_without_a_role_is_refused_by_name():
    _, net, _ = network(extra_input="temperature")
    profiles = decoder_profiles(net, max_batch=1, max_step_tokens=1)
    with pytest.raises(NetworkError, match=r"\['temperature'\] without one"):
        decoder_roles(net, profiles)


def test_long_rope_after_needs_the_rope_lengths_role():
    _, net, _ = network()
    profiles = decoder_profiles(net, max_batch=1, max_step_tokens=1)
    expected = r"^decoder roles: expected with long_rope_after, the role rope_lengths, got missing$"
    with pytest.raises(NetworkError, match=expected):
        decoder_roles(net, profiles, long_rope_after=4)


def test_an_optional_role_is_taken_when_the_network_has_its_input():
    _, net, _ = network(extra_input="key_value_lengths")
    roles = decoder_roles(net, decoder_profiles(net, max_batch=1, max_step_tokens=1))
    assert roles.inputs["kv_lengths"] == "key_value_lengths"


def test_a_tensor_named_by_two_roles_is_refused_naming_both():
    """kv_lengths fed to write_indices: the runtime would feed one tensor twice, wrongly."""
    from dataclasses import replace

    from trt_kv.builder.contract import _network_specs
    from trt_kv.contract import check_roles

    _, net, _ = network()
    roles = decoder_roles(net, decoder_profiles(net, max_batch=1, max_step_tokens=1))
    twice = replace(roles, inputs={**roles.inputs, "kv_lengths": "write_indices"})
    inputs, outputs = _network_specs(net)
    expected = (
        r"^decoder roles: expected one role per tensor, "
        r"got write_indices named by the roles write_indices and kv_lengths$"
    )
    with pytest.raises(NetworkError, match=expected):
        check_roles(twice, inputs, outputs)


def test_a_network_without_a_cache_update_is_refused():
    _, net = create_network()
    net.add_input("input_ids", trt.int32, (-1, -1))
    with pytest.raises(NetworkError, match=r"^network: expected at least one cache update"):
        decoder_roles(net, [])


def _sidecar(roles):
    from trt_kv.builder.engine import BuiltEngine
    from trt_kv.engine.file import describe

    _, net, _ = network()
    return describe(net, BuiltEngine(b"x", 0.0), [], {}, roles)


def test_the_sidecar_records_the_roles_and_reads_them_back():
    _, net, _ = network()
    roles = decoder_roles(net, decoder_profiles(net, max_batch=2, max_step_tokens=2))
    meta = _sidecar(roles)
    assert EngineMeta.from_json(json.loads(json.dumps(meta.to_json()))).roles == roles


def test_an_engine_without_roles_is_refused_by_name():
    from trt_kv.runtime.gpu.engine_loader import check_decoder_engine

    meta = _sidecar(None)
    with pytest.raises(EngineFileError, match=r"^x.engine: expected a decoder engine .*roles"):
        check_decoder_engine("x.engine", meta)


def test_roles_that_do_not_fit_the_engine_io_are_refused():
    from dataclasses import replace

    from trt_kv.runtime.gpu.engine_loader import check_decoder_engine

    _, net, _ = network()
    roles = decoder_roles(net, decoder_profiles(net, max_batch=2, max_step_tokens=2))
    meta = replace(_sidecar(roles), roles=replace(roles, logits="scores"))
    with pytest.raises(EngineFileError, match=r"decoder roles: role logits: expected"):
        check_decoder_engine("x.engine", meta)


def test_the_bring_your_own_decoder_script_decodes_on_every_backend():
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bring_your_own_decoder.py")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split("[[")[0].strip() for line in lines[:7]] == [
        "numpy",
        "interpreter",
        "tensorrt (emulated GPU)",
        "polygraphy (emulated GPU)",
        "interpreter (embeddings)",  # the embedding gather on the host: the same ids
        "tensorrt (emulated GPU, embeddings)",
        "polygraphy (emulated GPU, embeddings)",
    ]
    assert lines[-1] == "all backends agree with NumPy"


def test_no_runtime_module_imports_a_model():
    """The runtime knows roles, not models: nothing under trt_kv/runtime imports trt_kv.models
    (the reference backends live beside their models)."""
    import ast

    found = []
    for path in sorted((ROOT / "trt_kv" / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in getattr(node, "names", [])] if isinstance(node, ast.Import) else []
            )
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.name}: {n}" for n in names if n.startswith("trt_kv.models")]
    assert found == []


def test_a_cached_engine_without_roles_is_rebuilt_not_reused(tmp_path):
    """An engine built before the contract has a sidecar without roles: no backend could run
    it, so ``find_model_engine`` does not offer it for reuse."""
    from tests.support.tiny_models import TINY_GQA
    from trt_kv.engine.file import sidecar_path
    from trt_kv.engine.store import (
        BuildOptions,
        build_model_engine,
        find_model_engine,
        weights_digest,
    )
    from trt_kv.models.llama import random_weights

    options = BuildOptions(dtype="float32", max_seq_len=16, max_batch=1, max_step_tokens=4)
    weights = random_weights(TINY_GQA)
    built = build_model_engine("tiny", TINY_GQA, weights, out_dir=tmp_path, **options.to_json())
    digest = weights_digest(weights)
    assert find_model_engine("tiny", TINY_GQA, options, tmp_path, digest)[0] is not None
    side = sidecar_path(built.path)
    record = json.loads(side.read_text())
    del record["roles"]
    side.write_text(json.dumps(record))
    assert find_model_engine("tiny", TINY_GQA, options, tmp_path, digest) == (
        None,
        f"{built.path.name} has no decoder roles (built before the decoder contract)",
    )
