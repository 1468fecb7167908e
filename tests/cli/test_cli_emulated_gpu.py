"""``trt-kv generate/demo --emulate-gpu``: the GPU backends on the emulated device reproduce
the reference ids (tiny checkpoint in every dtype; the default model in float32 against the
reference, in float16 and bfloat16 against the interpreter on the same network)."""

import json

import pytest

from tests.support.cli_user import run_json
from tests.support.cli_user import tiny_model as tiny_model  # the fixture
from trt_kv.cli import main
from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason

GPU_RUNS = {
    "tensorrt": ["--backend", "tensorrt"],
    "tensorrt-graph": ["--backend", "tensorrt", "--cuda-graph"],
    "polygraphy": ["--backend", "polygraphy"],
}
SHAPES = ["--max-seq-len", "24", "--max-batch", "2", "--max-step-tokens", "8"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_backends_on_the_emulated_gpu_give_reference_ids(tiny_model, tmp_path, capsys, dtype):
    # Expected: the float32 reference's ids. In bfloat16 the network itself (run on the host
    # by the interpreter) picks other tokens than the float32 reference for the second
    # prompt, so there the expected ids are the interpreter's on the same bfloat16 network.
    common = ["--model", str(tiny_model), "--max-new-tokens", "5", *SHAPES]
    for prompts in ("5,17,42,8;61,3", "9,1,30"):  # batch 2 and batch 1
        ask = [*common, "--prompt-ids", prompts]
        host = run_json(capsys, *ask, "--backend", "interpreter", "--dtype", dtype)["ids"]
        if dtype != "bfloat16":
            assert host == run_json(capsys, *ask, "--backend", "reference")["ids"]
        for name, flags in GPU_RUNS.items():
            out = run_json(
                capsys, *ask, *flags, "--dtype", dtype, "--out", str(tmp_path), "--emulate-gpu"
            )
            assert (name, out["ids"], out["emulated_gpu"]) == (name, host, True)


def test_default_model_on_the_emulated_gpu_gives_reference_ids(tmp_path, capsys):
    # one prompt (batch > 1 runs on the tiny checkpoint above): the test stays under a minute
    ask = ["--model", "default", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]
    ask += ["--max-seq-len", "32", "--max-batch", "2", "--max-step-tokens", "4"]
    expected = run_json(capsys, *ask, "--backend", "reference")["ids"]
    for flags in GPU_RUNS.values():
        out = run_json(
            capsys, *ask, *flags, "--dtype", "float32", "--out", str(tmp_path), "--emulate-gpu"
        )
        assert out["ids"] == expected


def test_demo_on_the_emulated_gpu_says_so(tiny_model, tmp_path, capsys):
    argv = ["demo", "--model", str(tiny_model), "--out", str(tmp_path), *SHAPES]
    assert main([*argv, "--emulate-gpu", "--max-new-tokens", "2"]) == 0
    out = capsys.readouterr()
    assert "backend=tensorrt (emulated GPU)" in out.out
    assert "tensorrt (emulated GPU): prefill" in out.err  # the speed line


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this machine has a GPU")
def test_generate_picks_tensorrt_on_a_usable_gpu_and_the_interpreter_without(
    tiny_model, tmp_path, capsys
):
    """``--backend auto`` (the default) runs the engine where a GPU is usable, as a TensorRT
    user expects of ``generate``; this machine has none unless emulated."""
    ask = ["--model", str(tiny_model), "--prompt-ids", "5,17,42", "--max-new-tokens", "3"]
    ask += [*SHAPES, "--dtype", "float32", "--out", str(tmp_path)]
    gpu = run_json(capsys, *ask, "--emulate-gpu")
    host = run_json(capsys, *ask)
    assert (gpu["backend"], gpu["emulated_gpu"]) == ("tensorrt", True)
    assert (host["backend"], host["emulated_gpu"]) == ("interpreter", False)
    assert gpu["ids"] == host["ids"]


def test_emulate_gpu_with_a_cpu_backend_is_refused(capsys):
    argv = ["generate", "--backend", "interpreter", "--emulate-gpu", "--prompt-ids", "1,2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("trt-kv: error: --emulate-gpu: expected --backend tensorrt or ")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_default_model_in_half_precision_on_the_emulated_gpu(tmp_path, capsys, dtype):
    # Expected: the interpreter's ids on the same half-precision network (the float32
    # reference may pick other tokens at near ties once weights and activations are rounded).
    ask = ["--model", "default", "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]
    ask += ["--max-seq-len", "32", "--max-batch", "2", "--max-step-tokens", "4", "--dtype", dtype]
    expected = run_json(capsys, *ask, "--backend", "interpreter")["ids"]
    for name, flags in GPU_RUNS.items():
        out = run_json(capsys, *ask, *flags, "--out", str(tmp_path), "--emulate-gpu")
        assert (name, out["ids"], out["emulated_gpu"]) == (name, expected, True)


def test_an_engine_of_another_model_or_no_decoder_is_refused_by_name(tiny_model, tmp_path, capsys):
    """Both ran before: another config's engine silently (its ids read with --model's
    tokenizer), the doc example's with a KeyError traceback."""
    import json
    import shutil

    assert main(["build", "--model", str(tiny_model), "--out", str(tmp_path), *SHAPES, "-q"]) == 0
    (engine,) = tmp_path.glob(f"{tiny_model.name}-*.engine")
    other = tmp_path / "other"
    shutil.copytree(tiny_model, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    capsys.readouterr()
    for model, path, message in (
        (
            other,
            engine,
            f"--engine: expected an engine of --model other (same config), got {engine}, "
            "whose config differs in ['rms_norm_eps']",
        ),
        (
            tiny_model,
            tmp_path / "kv_cache_doc_example.engine",
            f"--engine: {tmp_path / 'kv_cache_doc_example.engine'}: expected a decoder engine "
            "(sidecar with roles), got no roles",
        ),
    ):
        argv = ["generate", "--model", str(model), "--engine", str(path), "--emulate-gpu"]
        assert main([*argv, "--backend", "tensorrt", "-q"]) == 2
        assert capsys.readouterr().err == f"trt-kv: error: {message}\n"


def test_an_engine_s_sizes_are_the_ones_prompts_are_judged_by(tiny_model, tmp_path, capsys):
    """With --model and --engine, prompts were judged against --max-seq-len's default 512, not
    the engine's S_max 24: a prompt that fits 512 but not 24 reached the engine (review)."""
    assert main(["build", "--model", str(tiny_model), "--out", str(tmp_path), *SHAPES, "-q"]) == 0
    (engine,) = tmp_path.glob(f"{tiny_model.name}-*.engine")
    base = ["generate", "--model", str(tiny_model), "--engine", str(engine), "--emulate-gpu"]
    base += ["--backend", "tensorrt", "-q"]
    capsys.readouterr()
    ids = ",".join(["3"] * 20)
    assert main([*base, "--prompt-ids", ids, "--max-new-tokens", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trt-kv: error: ") and "24" in err and "Traceback" not in err
    assert main([*base, "--prompt-ids", ids, "--max-seq-len", "64"]) == 2
    assert capsys.readouterr().err == (
        "trt-kv: error: --max-seq-len: expected the --engine's 24 (or leave it out), got 64\n"
    )
    assert main([*base, "--prompt-ids", ids, "--device-top-k", "2"]) == 2  # built with 1
    assert capsys.readouterr().err == (
        "trt-kv: error: --device-top-k: expected the --engine's 1 (or leave it out), got 2\n"
    )
    assert main([*base, "--prompt-ids", ids, "--max-new-tokens", "4", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["ids"][0]) == 4


# --max-batch 8: the batch demo opens its backend with, so that it too reuses the engine
DEFAULT_SHAPES = ["--max-seq-len", "32", "--max-batch", "8", "--max-step-tokens", "4"]


@pytest.fixture(scope="module")
def default_engine_dir(tmp_path_factory):
    """An engine folder holding the default model's engines for ``DEFAULT_SHAPES``: float16,
    and its GGUF's quantized weights kept as stored (``--weights keep``)."""
    out = tmp_path_factory.mktemp("default-engines")
    build = ["build", "--model", "default", "--out", str(out), *DEFAULT_SHAPES, "-q"]
    assert main(build) == 0
    assert main([*build, "--weights", "keep"]) == 0
    return out


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--backend", "tensorrt", "--prompt-ids", "1,2", "--max-new-tokens", "1"],
        ["generate", "--backend", "tensorrt", "--cuda-graph", "--prompt-ids", "1,2"],
        ["chat", "--backend", "tensorrt", "--max-new-tokens", "1"],
        ["demo", "--prompt-ids", "1,2", "--max-new-tokens", "1"],
        ["generate", "--backend", "tensorrt", "--weights", "keep", "--prompt-ids", "1,2"],
    ],
    ids=["generate", "generate-cuda-graph", "chat", "demo", "generate-weights-keep"],
)
def test_emulated_gpu_reuses_the_default_models_engine_without_model(
    default_engine_dir, capsys, monkeypatch, argv
):
    """Without --model, the default model reaches the emulated GPU too, which rebuilds the
    network of an engine found (reused) from it."""
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))  # chat's one turn
    capsys.readouterr()
    code = main([*argv, "--out", str(default_engine_dir), *DEFAULT_SHAPES, "--emulate-gpu"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "smollm2-135m-instruct" in err and ": reused (built " in err


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "--emulate-gpu", "ENGINE"],
        ["generate", "--backend", "tensorrt", "--emulate-gpu", "--engine", "ENGINE"],
    ],
    ids=["inspect", "generate-engine"],
)
def test_an_engine_of_the_default_model_runs_emulated_without_model(
    default_engine_dir, capsys, argv
):
    """An engine file without --model: its sidecar names the default model, which the
    emulated GPU then rebuilds the network from. Before: "got no models given" (inspect:
    "layers: not shown")."""
    (engine,) = default_engine_dir.glob("smollm2-135m-instruct-*-float16-s32-b8-t4-k1.engine")
    capsys.readouterr()
    code = main([str(engine) if a == "ENGINE" else a for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "no models given" not in out + err and "layers: not shown" not in out
