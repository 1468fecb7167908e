"""SmolLM2-135M (the default GGUF, dequantized to float32 by transformers) exported to ONNX
with a growing cache: onnxruntime on the export equals transformers, and trt_kv's interpreter
and emulated TensorRT equal onnxruntime, 32 new tokens for 3 prompts in one batch."""

from __future__ import annotations

import pytest

from tests.support.hf_models import greedy_ids
from tests.support.onnx_models import NEW_TOKENS, export, ort_greedy
from tests.support.real_model import CHAT_PROMPT_IDS, PLAIN_IDS, PLAIN_PROMPT_IDS
from trt_kv.onnx.decoder import load_onnx_decoder
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

PROMPTS = [PLAIN_PROMPT_IDS, CHAT_PROMPT_IDS, [1, 9690, 198]]  # 5, 40 and 3 tokens


@pytest.fixture(scope="module")
def exported(hf_smollm2, tmp_path_factory):
    """(the .onnx path, transformers' greedy ids, onnxruntime's on the export). The shared
    model is exported with the eager attention (the rewrite reads its matmul, mask, softmax),
    then given back its own."""
    model, own = hf_smollm2, hf_smollm2.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        path = export(model, tmp_path_factory.mktemp("smollm2_onnx") / "smollm2.onnx")
    finally:
        model.set_attn_implementation(own)
    hf = greedy_ids(model, PROMPTS, NEW_TOKENS)
    return path, hf, [ort_greedy(path, p, NEW_TOKENS) for p in PROMPTS]


def _decoder(path):
    return load_onnx_decoder(path, max_seq_len=128, max_batch=3, max_step_tokens=64).decoder


def test_onnxruntime_on_the_export_equals_transformers(exported):
    _, hf, ort = exported
    assert ort == hf
    assert ort[0][: len(PLAIN_IDS)] == PLAIN_IDS  # transformers' ids, recorded


def test_interpreter_ids_equal_onnxruntimes_in_one_batch(exported):
    path, _, ort = exported
    got = generate(Session(InterpreterBackend(_decoder(path))), PROMPTS, NEW_TOKENS).ids
    assert got == ort


@pytest.mark.gpu
def test_emulated_tensorrt_ids_equal_onnxruntimes(exported, tmp_path):
    from trt_kv.engine.store import build_to_file
    from trt_kv.runtime.gpu.trt_backend import TrtBackend

    path, _, ort = exported
    n = _decoder(path)
    engine = build_to_file(
        n.builder, n.network, n.profiles, tmp_path / "smollm2.engine", {"model": "x"}, n.roles
    ).path
    backend = TrtBackend(engine)
    try:
        assert generate(Session(backend), PROMPTS, NEW_TOKENS).ids == ort
    finally:
        backend.close()
