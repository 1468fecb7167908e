"""Engines you can trust, as a user meets them on the command line (emulated GPU): the
weights decide reuse, two models sharing a folder name never share an engine, ``--engine``
with another model's weights is refused, and a sidecar that disagrees with its engine is
refused before any buffer is sized from it."""

import json
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.support.cli_user import write_tiny_model
from tests.support.tiny_models import TINY_GQA, TINY_HF_CONFIG
from trt_kv.cli import main
from trt_kv.emulator import emulated_gpu
from trt_kv.engine.file import sidecar_path
from trt_kv.engine.store import build_model_engine
from trt_kv.errors import EngineFileError
from trt_kv.models.llama import LlamaConfig, random_weights, to_hf_tensors
from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason
from trt_kv.runtime.gpu.engine_loader import load_cuda_engine

SHAPES = ["--max-seq-len", "24", "--max-batch", "2", "--max-step-tokens", "8"]
ASK = ["--prompt-ids", "5,17,42;9,1", "--max-new-tokens", "4", "--dtype", "float32", *SHAPES]
EMULATED = pytest.mark.skipif(
    gpu_unavailable_reason() is None, reason="runs the emulated GPU; this machine has a real one"
)


def _resave(folder, seed):
    """Other weights, saved in place as save_pretrained would (same names, same config)."""
    weights = random_weights(LlamaConfig.from_hf(TINY_HF_CONFIG), seed=seed, std=0.3)
    tensors = {k: np.ascontiguousarray(v) for k, v in to_hf_tensors(weights).items()}
    save_file(tensors, str(folder / "model.safetensors"))


def _generate(capsys, model, out, *backend):
    argv = ["generate", "--json", "--model", str(model), *ASK, "--out", str(out), *backend]
    assert main(argv) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out.splitlines()[-1])["ids"], captured.err


GPU = ("--backend", "tensorrt", "--emulate-gpu")


@EMULATED
def test_weights_resaved_in_place_are_built_anew_and_the_reason_said(tmp_path, capsys):
    """Before: "reused", and the stale engine's ids; then "rebuilt: weights changed", though
    no engine of the new file's name existed and the old one stays."""
    model = write_tiny_model(tmp_path / "model")
    out = tmp_path / "engines"
    first, err = _generate(capsys, model, out, *GPU)
    assert re.search(r"engine .*: built now\n", err), err
    _resave(model, seed=5)
    host, _ = _generate(capsys, model, out, "--backend", "interpreter")
    second, err = _generate(capsys, model, out, *GPU)
    status = re.search(r"engine \S+: (.*)\n", err)[1]
    assert re.fullmatch(
        r"built: no engine for these weights \(sha256 [0-9a-f]{8}\.\.\.; the one for sha256 "
        r"[0-9a-f]{8}\.\.\. stays\)",
        status,
    ), status
    assert second == host != first
    assert re.search(r"engine .*: reused \(built ", _generate(capsys, model, out, *GPU)[1])


@EMULATED
def test_two_models_whose_folders_share_a_name_never_share_an_engine(tmp_path, capsys):
    """runs/a/model and runs/b/model, one --out: before, the second printed the first
    model's ids after "reused"."""
    a = write_tiny_model(tmp_path / "runs" / "a" / "model")
    b = shutil.copytree(a, tmp_path / "runs" / "b" / "model")
    _resave(b, seed=6)
    out = tmp_path / "engines"
    ids_a, _ = _generate(capsys, a, out, *GPU)
    ids_b, err = _generate(capsys, b, out, *GPU)
    assert "built: no engine for these weights" in err
    assert ids_b == _generate(capsys, b, out, "--backend", "interpreter")[0] != ids_a
    assert len(list(out.glob("model-*.engine"))) == 2  # neither overwrote the other
    assert _generate(capsys, a, out, *GPU)[0] == ids_a  # a's engine is still a's


@EMULATED
def test_an_engine_of_other_weights_is_refused_by_name(tmp_path, capsys):
    """Before: ``--model A --engine <built from B>`` ran B's weights silently."""
    a = write_tiny_model(tmp_path / "a")
    b = shutil.copytree(a, tmp_path / "b")
    _resave(b, seed=7)
    assert main(["build", "--model", str(b), "--out", str(tmp_path / "e"), *SHAPES, "-q"]) == 0
    (engine,) = (tmp_path / "e").glob("b-*.engine")
    capsys.readouterr()
    argv = ["generate", "--model", str(a), "--engine", str(engine), *GPU, "-q"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"trt-kv: error: --engine: expected an engine of --model a's weights \(sha256 "
        rf"[0-9a-f]{{8}}\.\.\.\), got {re.escape(str(engine))}, built from weights sha256 "
        rf"{engine.name.split('-')[1]}\.\.\.\n",
        err,
    ), err


def _edit_sidecar(path, edit):
    side = json.loads(sidecar_path(path).read_text())
    edit(side)
    sidecar_path(path).write_text(json.dumps(side))


def _all_caches_float32(side):
    caches = {name for a in side["alias_pairs"] for name in (a["input"], a["output"])}
    for t in side["alias_pairs"] + side["inputs"] + side["outputs"]:
        if t.get("name", t.get("input")) in caches:
            t["dtype"] = "float32"


def test_a_sidecar_that_disagrees_with_its_engine_is_refused_before_allocating(tmp_path):
    """The sidecar is consistent with itself (every cache float32), the engine's caches are
    float16: before, the caches were sized from the sidecar and ``snapshot`` read zeros."""
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    with emulated_gpu():
        built = build_model_engine(
            "io", TINY_GQA, random_weights(TINY_GQA), out_dir=tmp_path, dtype="float16",
            max_seq_len=8, max_batch=1, max_step_tokens=2,
        )  # fmt: skip
        _edit_sidecar(built.path, _all_caches_float32)
        before = _device_bytes_in_use()
        with pytest.raises(EngineFileError) as info:
            TrtBackend(built.path)
        assert _device_bytes_in_use() == before  # nothing allocated
    assert re.fullmatch(
        r"engine tensor past_key\.0: expected \(mode, dtype, shape\) of the sidecar "
        r"\('INPUT', 'float32', \(-1, 2, 8, 8\)\), got \('INPUT', 'float16', \(-1, 2, 8, 8\)\)",
        str(info.value),
    ), info.value


def _device_bytes_in_use():
    from trt_kv.emulator.device import device

    return device().memory.used


def test_a_truncated_engine_re_signed_is_refused_on_the_emulated_gpu(tmp_path):
    """Before: the emulator rebuilt the recipe's network and ran the truncated bytes."""
    import hashlib

    from trt_kv.engine.recipes import recipe_rebuilder
    from trt_kv.engine.store import build_doc_example

    built = build_doc_example(tmp_path)  # outside the emulator: rebuilt from its recipe
    data = built.path.read_bytes()[:-4096]
    built.path.write_bytes(data)
    _edit_sidecar(
        built.path, lambda d: d.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    )
    with (
        emulated_gpu(engines=[built.path], rebuild=recipe_rebuilder()),
        pytest.raises(EngineFileError) as info,
    ):
        load_cuda_engine(built.path)
    assert str(info.value) == (
        f"{built.path}: expected an engine valid on this GPU (get_engine_validity), got "
        "INVALID (MALFORMED_ENGINE)"
    )
