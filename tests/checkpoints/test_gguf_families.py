"""Every decoder family read from a GGUF file as llama.cpp's converter writes it.

Each case (``gguf_family_cases``) is a random-weight Hugging Face model of odd sizes, saved
with ``save_pretrained`` and written to GGUF by test scaffolding that follows the converter.
The oracle is independent of trt_kv's reader: transformers' own GGUF loader
(``from_pretrained(folder, gguf_file=...)``) for the architectures and keys it reads, else the
Hugging Face model the file was written from. trt_kv's reference runs both prompts as one
ragged batch through its cache; the interpreter runs the built network.

Tolerance: float32 on both sides, ``1e-4 * max|logit|`` absolute (as the family oracle).
"""

import dataclasses

import numpy as np
import pytest
import torch
import transformers

from tests.support.family_cases import PROMPTS
from tests.support.gguf_family_cases import CASES, HF_GGUF, written_case
from tests.support.hf_models import greedy_ids
from trt_kv.checkpoints import read_gguf
from trt_kv.models.llama import LlamaConfig, build_llama_network, llama_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

S_MAX, NEW_TOKENS = 32, 16
# phi3_longrope's original_max_position_embeddings is 48: S_max 64 stacks the long table and
# 48 new tokens take both prompts (7 and 3 tokens) past 48, onto its long rows.
LONG = {"phi3_longrope": (64, 48)}
# llama.cpp writes MistralForCausalLM as arch llama and runs it as a Llama (no window key).
MODEL_TYPE = {"mistral": "llama"}


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request, tmp_path_factory):
    """``(name, folder, source model, gguf path, checkpoint, config, weights)``."""
    name = request.param
    folder = tmp_path_factory.mktemp(name)
    model, path = written_case(name, folder)
    checkpoint = read_gguf(path)
    config = LlamaConfig.from_hf(checkpoint.config)
    return name, folder, model, path, checkpoint, config, llama_weights(checkpoint.tensors, config)


def _oracle(name, model, path):
    """transformers' model loaded from the GGUF file where it reads it whole, else the source."""
    if name not in HF_GGUF:
        return model
    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()


def test_config_is_the_saved_folders(case):
    name, folder, _, _, _, config, _ = case
    saved = LlamaConfig.from_hf(folder)
    eps = float(np.float32(saved.rms_norm_eps))  # GGUF stores float32
    expected = dataclasses.replace(
        saved, rms_norm_eps=eps, model_type=MODEL_TYPE.get(name, saved.model_type)
    )
    assert config == expected


def test_tensors_are_the_hugging_face_ones(case):
    name, _, model, _, checkpoint, _, _ = case
    dtype = CASES[name][4].get("dtype", np.float32)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]
    assert sorted(checkpoint.tensors) == sorted(state)
    for key, value in state.items():
        stored = value.numpy().astype(dtype if value.ndim == 2 else np.float32)
        ours = checkpoint.tensors[key]
        if name == "gemma" and key.endswith("norm.weight"):
            # stored as float32(1 + w) and read back minus 1: the scale Gemma's RMSNorm
            # computes, float32(1 + w), is the same bits (w itself may differ in its last bit)
            ours, stored = np.float32(1) + ours, np.float32(1) + stored
        np.testing.assert_array_equal(ours, stored, err_msg=key)


@pytest.mark.parametrize("name", HF_GGUF)
def test_transformers_loads_the_same_tensors_from_the_file(name, tmp_path):
    _, path = written_case(name, tmp_path)
    hf = _oracle(name, None, path)
    tensors = read_gguf(path).tensors
    for key, value in hf.state_dict().items():
        if key == "lm_head.weight" and hf.config.tie_word_embeddings:
            continue
        np.testing.assert_array_equal(tensors[key], value.numpy(), err_msg=key)


def test_reference_logits_and_greedy_ids_match_the_oracle(case):
    name, _, model, path, _, config, weights = case
    s_max, new_tokens = LONG.get(name, (S_MAX, NEW_TOKENS))
    oracle = _oracle(name, model, path)
    session = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=s_max))
    logits = session.prefill(PROMPTS)  # [2, V], each prompt's last position
    for b, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            expected = oracle(torch.tensor([prompt])).logits[0, -1].numpy()
        atol = 1e-4 * float(np.abs(expected).max())
        np.testing.assert_allclose(logits[b], expected, rtol=0, atol=atol)
    fresh = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=s_max))
    assert generate(fresh, PROMPTS, new_tokens).ids == greedy_ids(oracle, PROMPTS, new_tokens)


def test_interpreter_on_the_built_network_equals_the_reference(case):
    _, _, _, _, _, config, weights = case
    net = build_llama_network(
        config, weights, max_seq_len=S_MAX, max_batch=2, max_step_tokens=8, dtype="float32"
    )
    reference = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=S_MAX))
    ref_logits = reference.prefill(PROMPTS)
    logits = Session(InterpreterBackend(net)).prefill(PROMPTS)
    np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=1e-4 * np.abs(ref_logits).max())
    fresh = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=S_MAX))
    ours = generate(Session(InterpreterBackend(net)), PROMPTS, 6).ids
    assert ours == generate(fresh, PROMPTS, 6).ids


def test_gemma_norms_read_as_float16_are_w_rounded_once(tmp_path):
    """The file stores float32(1 + w); read as float16 each norm weight is float16(w) (within
    one float16 step of w), not float16(1 + w) - 1, whose error is 1's step (2**-11) even for
    a small w (this model's w are 0.2 * randn, many below 0.05)."""
    model, path = written_case("gemma", tmp_path)
    tensors = read_gguf(path, np.float16).tensors
    norms = [k for k in tensors if k.endswith("norm.weight")]
    assert len(norms) == 5  # 2 layers x (input, post-attention) + final
    for key in norms:
        w = model.state_dict()[key].numpy()
        assert tensors[key].dtype == np.float16
        np.testing.assert_allclose(tensors[key], w, rtol=2**-10, atol=0, err_msg=key)
