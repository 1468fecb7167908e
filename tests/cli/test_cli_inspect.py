"""``trt-kv inspect ENGINE`` as a user runs it: read from the sidecar, no GPU needed."""

import json
import shutil
from pathlib import Path

import pytest

from tests.support.cli_user import run_cli, write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="module")
def engine(tmp_path_factory, model):
    out = tmp_path_factory.mktemp("engines")
    args = ("--max-seq-len", "32", "--max-batch", "2", "--max-step-tokens", "8", "-q")
    run_cli("build", "--model", model, "--out", out, *args)
    (path,) = out.glob("tiny-*-float16-s32-b2-t8-k1.engine")  # the weights' digest in the name
    return path


def test_text_shows_tensors_with_profiles_aliases_recipe_and_checksum(engine):
    out = run_cli("inspect", engine).stdout
    assert f"{engine.name}  ({engine.stat().st_size:,} bytes, checksum ok)" in out
    assert "GPU targets  portable" in out
    assert "routes       cache_update: layer" in out
    assert "build        dtype=float16 max_seq_len=32 max_batch=2 max_step_tokens=8" in out
    rows = {
        line.split()[0]: line.split(None, 3)[3] for line in out.splitlines() if "  input  " in line
    }
    # [B, N_kv, S_max, H] = [-1, 2, 32, 8]; profiles decode (S = 1) then prefill (S <= 8),
    # B in 1..2 in both (min, opt, max each)
    cache = "[1, 2, 32, 8]  [2, 2, 32, 8]  [2, 2, 32, 8]"
    assert rows["past_key.0"] == f"[-1, 2, 32, 8]  {cache}  {cache}"
    assert " ".join(rows["input_ids"].split()) == (
        "[-1, -1] [1, 1] [2, 1] [2, 1] [1, 1] [2, 8] [2, 8]"
    )
    assert "past_value.1  present_value.1  [-1, 2, 32, 8]  float16" in out
    assert "layers: not shown, needs a GPU to deserialize the engine" in out


def test_text_names_the_model_and_the_sizes_its_architecture_shows(engine):
    out = run_cli("inspect", engine).stdout
    assert (
        "\nmodel        llama num_hidden_layers=2 hidden_size=32 num_attention_heads=4 "
        "num_key_value_heads=2\n"
    ) in out


def test_the_model_line_shows_the_keys_of_the_recipes_architecture_or_of_every_one():
    from trt_kv.models.architectures import describe_recipe

    gpt2 = {"model_type": "gpt2", "vocab_size": 101, "n_positions": 40, "n_embd": 60}
    gpt2 |= {"n_layer": 2, "n_head": 5, "n_inner": 97, "layer_norm_epsilon": 1e-5}
    assert describe_recipe("gpt2", gpt2) == [
        ("model_type", "gpt2"),
        ("n_layer", "2"),
        ("n_embd", "60"),
        ("n_head", "5"),
        ("n_positions", "40"),
    ]
    mixed = {**gpt2, "num_hidden_layers": 2, "hidden_size": 32}  # an edited sidecar
    assert describe_recipe("llama", mixed) == [
        ("model_type", "gpt2"),
        ("num_hidden_layers", "2"),
        ("hidden_size", "32"),
    ]
    # a model not in the table (or none): every architecture's keys, each once
    for model in ("?", None, ["llama"]):
        assert [key for key, _ in describe_recipe(model, mixed)] == [
            "model_type",
            "num_hidden_layers",
            "hidden_size",
            "n_layer",
            "n_embd",
            "n_head",
            "n_positions",
        ]


def test_cache_memory_per_slot_per_token_and_for_a_batch(engine):
    # 2 layers x (K, V) = 4 caches of [N_kv=2, S_max=32, H=8] float16 (2 bytes):
    per_slot = 4 * 2 * 32 * 8 * 2  # 4096 bytes
    per_token = per_slot // 32  # 128 bytes
    mem = json.loads(run_cli("inspect", engine, "--json").stdout)["cache_memory"]
    assert mem == {
        "caches": 4,
        "engine_max_seq_len": 32,
        "bytes_per_slot": per_slot,
        "bytes_per_token": per_token,
        "batch": 2,  # the profile's max batch
        "max_seq_len": 32,
        "bytes": 2 * per_slot,
    }
    mem = json.loads(
        run_cli("inspect", engine, "--json", "--batch", "8", "--max-seq-len", "100").stdout
    )
    assert mem["cache_memory"]["bytes"] == 8 * 100 * per_token


def test_json_has_the_recipe_versions_and_tensor_modes(engine):
    import trt_kv

    r = json.loads(run_cli("inspect", engine, "--json").stdout)
    assert r["checksum"] == "ok" and len(r["sha256"]) == 64
    assert r["built_with"] == {"module": trt_kv.FEATURES.module, "version": trt_kv.FEATURES.version}
    assert r["recipe"]["build_options"]["max_step_tokens"] == 8
    assert r["recipe"]["config"]["num_hidden_layers"] == 2
    assert r["built_at"].endswith("Z") and r["build_seconds"] > 0
    modes = {t["name"]: t["mode"] for t in r["tensors"]}
    assert modes["past_key.0"] == "input" and modes["present_key.0"] == "output"
    assert r["alias_pairs"][0] == {
        "input": "past_key.0",
        "output": "present_key.0",
        "shape": [-1, 2, 32, 8],
        "dtype": "float16",
    }
    assert r["layers"] is None


def test_a_tampered_engine_shows_a_checksum_mismatch(engine, tmp_path):
    copy = tmp_path / engine.name
    copy.write_bytes(engine.read_bytes()[:-1] + b"\x00")
    shutil.copy(f"{engine}.json", f"{copy}.json")
    out = run_cli("inspect", copy).stdout
    assert "checksum MISMATCH (sidecar: " in out


def test_a_missing_engine_is_one_error_line(tmp_path):
    out = run_cli("inspect", tmp_path / "none.engine", check=False)
    assert out.returncode == 2
    assert out.stderr == (
        f"trt-kv: error: {tmp_path / 'none.engine'}: expected an existing file, got missing\n"
    )


def _config_a_string(text: bytes) -> bytes:
    side = json.loads(text)
    side["metadata"]["config"] = "llama"
    return json.dumps(side).encode()


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (lambda text: text[:1], "expected a JSON sidecar, got Expecting property name"),
        (lambda text: b"\xff" + text, "expected UTF-8 text, got invalid start byte"),
        (_config_a_string, "metadata.config: expected a JSON object, got str"),
    ],
    ids=["not-json", "not-utf8", "config-not-an-object"],
)
def test_a_broken_sidecar_is_one_error_line_naming_it(engine, tmp_path, edit, error):
    copy = tmp_path / engine.name
    shutil.copy(engine, copy)
    (tmp_path / f"{engine.name}.json").write_bytes(edit(Path(f"{engine}.json").read_bytes()))
    out = run_cli("inspect", copy, check=False)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr.startswith(f"trt-kv: error: {copy}.json: {error}")
    assert out.stderr.count("\n") == 1  # one line, no traceback


def test_a_static_batch_is_the_default_batch_of_the_cache_total(tmp_path):
    run_cli("build", "--no-model", "--out", tmp_path, "-q")
    out = run_cli("inspect", tmp_path / "kv_cache_doc_example.engine", "--json").stdout
    # the doc example's cache [4, 2, 8, 1] float32: 2 * 8 * 1 * 4 = 64 bytes per slot
    assert json.loads(out)["cache_memory"] == {
        "caches": 1,
        "engine_max_seq_len": 8,
        "bytes_per_slot": 64,
        "bytes_per_token": 8,
        "batch": 4,
        "max_seq_len": 8,
        "bytes": 256,
    }


def test_emulated_gpu_adds_the_engine_inspectors_layer_names(engine, model):
    from trt_kv.engine.store import BuildOptions
    from trt_kv.models.llama import build_llama_network
    from trt_kv.models.loading import load_model

    r = json.loads(run_cli("inspect", engine, "--json", "--emulate-gpu", "--model", model).stdout)
    assert r["emulated_gpu"] is True
    assert r["layers_source"].startswith("emulated TensorRT engine inspector, LAYER_NAMES_ONLY")
    # the network of the engine's recipe, built here: its layers, one inspector entry each
    assert r["recipe"]["recipe"]["model"] == "tiny"  # a name, not a path
    loaded = load_model(model, progress=False)
    options = BuildOptions(**r["recipe"]["build_options"]).network_options()
    network = build_llama_network(loaded.config, loaded.weights, **options).network
    names = [network.get_layer(i).name for i in range(network.num_layers)]
    assert r["layers"] == names
    assert {"kv_cache_update:present_key.0", "kv_cache_update:present_value.1"} <= set(names)
    out = run_cli("inspect", engine, "--emulate-gpu", "--model", model).stdout
    assert f"\nlayers ({len(names)}, from emulated TensorRT engine inspector, " in out
    assert "\n  kv_cache_update:present_key.0\n" in out


def test_emulated_gpu_without_the_model_says_what_it_lacks(engine):
    out = run_cli("inspect", engine, "--emulate-gpu").stdout
    assert "layers: not shown, " in out and "None (see the TensorRT log)" in out
