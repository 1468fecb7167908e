"""``--weights`` on the command line: build-time INT8/INT4 quantization of a float
checkpoint, run by the interpreter and by TensorRT on the emulated device (which executes the
engine's network through the interpreter: the same ids), and shown by ``trt-kv inspect``."""

import pytest

from tests.support.cli_user import run_cli, run_json
from tests.support.cli_user import tiny_model as tiny_model  # the fixture
from trt_kv.cli import main

SHAPES = ["--max-seq-len", "24", "--max-batch", "2", "--max-step-tokens", "8"]


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_quantized_engines_on_the_emulated_gpu_give_the_interpreters_ids(
    tiny_model, tmp_path, capsys, weights
):
    ask = ["--model", str(tiny_model), "--max-new-tokens", "5", *SHAPES, "--weights", weights]
    ask += ["--prompt-ids", "5,17,42,8;61,3"]
    host = run_json(capsys, *ask, "--backend", "interpreter")["ids"]
    out = run_json(capsys, *ask, "--backend", "tensorrt", "--out", str(tmp_path), "--emulate-gpu")
    assert out["ids"] == host and out["emulated_gpu"]
    [engine] = tmp_path.glob(f"*-weights_{weights}-k1.engine")
    text = run_cli("inspect", engine).stdout
    line = next(s for s in text.splitlines() if s.startswith("weights "))
    assert line.split(None, 1)[1].startswith(f"{weights}: 14 {weights} -> {weights} block 32; ")
    assert "in float16: model.embed_tokens.weight, 5 vectors" in line


def test_weights_are_refused_on_the_reference_and_when_unknown(tiny_model, capsys):
    argv = ["generate", "--model", str(tiny_model), "--prompt-ids", "1,2", "--weights"]
    assert main([*argv, "int4", "--backend", "reference"]) == 2
    assert "--weights" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "int3"])
    err = capsys.readouterr().err
    assert "--weights" in err and "int3" in err
