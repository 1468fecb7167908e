"""``trt-kv bench``: prefill and decode timed apart, per batch and context, table and JSON."""

import json

import pytest

from tests.support.cli_user import run_cli, write_tiny_model
from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def bench(tiny, *argv):
    return run_cli("bench", "--model", tiny, "--decode-steps", "3", "--repeats", "3", *argv)


@pytest.mark.parametrize("backend", ["reference", "interpreter"])
def test_json_has_one_result_per_batch_and_context(tiny, backend):
    args = ("--backend", backend, "--batch", "1", "2", "--context", "4", "20", "--json")
    r = json.loads(bench(tiny, *args).stdout)
    dtype = "float32" if backend == "reference" else "float16"  # the reference's only one
    assert (r["backend"], r["model"], r["dtype"]) == (backend, "tiny", dtype)
    assert [(x["batch"], x["context"]) for x in r["results"]] == [(1, 4), (2, 4), (1, 20), (2, 20)]
    for x in r["results"]:
        assert x["max_seq_len"] == x["context"] + 3  # context + decode steps
        for key in ("prefill_ms", "decode_ms_per_step"):
            s = x[key]
            assert len(s["samples"]) == 3
            assert s["min"] <= s["median"] <= s["max"]
            assert s["min"] > 0
        assert x["decode_tokens_per_s"] == pytest.approx(
            x["batch"] / x["decode_ms_per_step"]["median"] * 1e3
        )
        # 2 layers x (K, V) of [N_kv=2, S_max, H=8] float32: the reference's, and the
        # interpreter's float16 caches held as float32 (wide_float16_caches, its default)
        assert x["cache_bytes"] == x["batch"] * 4 * 2 * x["max_seq_len"] * 8 * 4


def test_a_context_longer_than_a_step_is_prefilled_in_steps(tiny):
    r = json.loads(bench(tiny, "--context", "20", "--max-step-tokens", "8", "--json").stdout)
    (x,) = r["results"]
    # the backend was built for steps of 8 tokens: Session.prefill fed the 20 in steps
    # (tests/runtime/test_session.py::test_step_longer_than_max_step_tokens_is_fed_in_chunks)
    assert (x["context"], x["max_step_tokens"]) == (20, 8) and x["prefill_ms"]["median"] > 0


def test_table_names_model_and_dtype_and_has_prefill_and_decode_columns(tiny):
    out = bench(tiny, "--backend", "interpreter", "--batch", "2", "--context", "6")
    out = out.stdout.splitlines()
    assert out[0].split()[0:6] == ["model", "dtype", "backend", "batch", "context", "S_max"]
    for col in ("prefill ms (min-max)", "prefill tok/s", "decode ms/step (min-max)", "cache MiB"):
        assert col in out[0]
    assert out[2].split()[:6] == ["tiny", "float16", "interpreter", "2", "6", "9"]
    ref = bench(tiny, "--backend", "reference", "--context", "6").stdout.splitlines()
    assert ref[2].split()[:3] == ["tiny", "float32", "reference"]


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this machine has a GPU")
def test_auto_times_the_interpreter_without_a_gpu_and_says_why_cuda_graph_does_not_apply(tiny):
    """As generate and demo pick: TensorRT where a GPU is usable, else the interpreter."""
    r = json.loads(bench(tiny, "--context", "4", "--json").stdout)
    assert r["backend"] == "interpreter"
    out = run_cli("bench", "--model", tiny, "--cuda-graph", check=False)
    assert (out.returncode, out.stderr) == (
        2,
        "trt-kv: error: --cuda-graph: expected --backend tensorrt, got interpreter (auto's pick: "
        "no GPU)\n",
    )


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="this machine has a GPU")
def test_a_gpu_backend_without_a_gpu_is_one_error_line_before_any_weights_load():
    out = run_cli("bench", "--backend", "tensorrt", check=False)
    assert out.returncode == 2
    assert out.stderr.startswith("trt-kv: error: --backend tensorrt: expected a CUDA GPU, got ")
    assert len(out.stderr.splitlines()) == 1
