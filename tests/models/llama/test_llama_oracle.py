"""The NumPy reference model against Hugging Face ``transformers.LlamaForCausalLM``.

Each case is a randomly initialized Hugging Face model written with ``save_pretrained``
(config.json + safetensors) and read back through ``LlamaConfig.from_hf`` and
``load_hf_weights``, so the whole path from a checkpoint folder to logits is checked. The
expected values all come from PyTorch: Hugging Face runs each prompt alone (no padding) and
recomputes the whole sequence for every decode position (no cache), while the reference runs
both prompts as one right-padded batch through its in-place KV cache.

Tolerance: both sides compute in float32, so logits agree to float32 rounding accumulated
over a few layers; we allow ``1e-4 * max|logit|`` absolute.
"""

import numpy as np
import pytest
import torch
import transformers

from trt_kv.models.llama import LlamaConfig, load_hf_weights
from trt_kv.models.llama.reference import empty_caches, forward
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate

RTOL_OF_SCALE = 1e-4

# Hugging Face LlamaConfig arguments per case (all 2 layers unless said otherwise).
CASES = {
    # MHA, untied head, odd sizes: D=40 with 5 heads of 8, V=97, F=72.
    "mha_untied_odd_sizes": dict(
        vocab_size=97,
        hidden_size=40,
        intermediate_size=72,
        num_attention_heads=5,
        num_key_value_heads=5,
        head_dim=8,
        tie_word_embeddings=False,
        rope_theta=10000.0,
    ),
    # GQA 6:2, tied head, SmolLM2's theta and eps; query width 6 * 16 = 96 != D = 48.
    "gqa_tied_theta_1e5": dict(
        vocab_size=128,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
    ),
    # MQA 4:1 with Llama-3.1 rope scaling; original_max_position_embeddings=16 puts the 8
    # frequencies in all three llama3 bands (kept, smoothed, divided by factor).
    "mqa_llama3_rope": dict(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=112,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=False,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
}

PROMPTS = [[5, 17, 3, 88, 42, 7, 9], [60, 1, 33]]  # lengths 7 and 3: the second is padded
CONTINUATIONS = [[11, 64, 0, 96], [23, 2, 50, 8]]  # fed one token per decode step
S_MAX = 32


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request, tmp_path_factory):
    """``(hf_model, config, weights)``: a saved and reloaded random Hugging Face model."""
    args = {"num_hidden_layers": 2, "initializer_range": 0.2, **CASES[request.param]}
    hf_config = transformers.LlamaConfig(**args)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(hf_config).eval()
    with torch.no_grad():  # Hugging Face initializes RMSNorm weights to 1; make them matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    config = LlamaConfig.from_hf(folder)
    return model, config, load_hf_weights(folder, config)


def _hf_logits(model, ids):
    """Hugging Face logits ``[L, V]`` of one unpadded sequence, recomputed from scratch."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def _assert_close(actual, expected):
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(actual, expected, rtol=0, atol=RTOL_OF_SCALE * scale)


def _reference_prefill(config, weights):
    """Both prompts as one right-padded batch; returns ``(logits [2, 7, V], caches)``."""
    lengths = np.array([len(p) for p in PROMPTS])
    s = int(lengths.max())
    ids = np.zeros((2, s), np.int32)
    for b, p in enumerate(PROMPTS):
        ids[b, : len(p)] = p
    caches = empty_caches(config, 2, S_MAX)
    positions = np.broadcast_to(np.arange(s), (2, s))
    logits = forward(
        config, weights, ids, positions, caches, np.zeros(2, np.int32), lengths.astype(np.int32)
    )
    return logits, caches


def test_saved_config_reads_back_with_the_hugging_face_shape(case):
    model, config, weights = case
    hf = model.config
    assert (config.hidden_size, config.intermediate_size, config.vocab_size) == (
        hf.hidden_size,
        hf.intermediate_size,
        hf.vocab_size,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        hf.num_attention_heads,
        hf.num_key_value_heads,
        hf.head_dim,
    )
    assert config.rope_theta == hf.rope_parameters["rope_theta"]
    assert (config.rope_scaling is None) == (hf.rope_parameters["rope_type"] == "default")
    assert config.tie_word_embeddings == (weights.lm_head is None) == hf.tie_word_embeddings


def test_prefill_logits_of_a_padded_batch_match_hugging_face_per_prompt(case):
    model, config, weights = case
    logits, _ = _reference_prefill(config, weights)
    for b, prompt in enumerate(PROMPTS):
        _assert_close(logits[b, : len(prompt)], _hf_logits(model, prompt))


def test_decode_step_logits_match_hugging_face_recompute(case):
    model, config, weights = case
    _, caches = _reference_prefill(config, weights)
    lengths = np.array([len(p) for p in PROMPTS], np.int32)
    expected = [_hf_logits(model, p + c) for p, c in zip(PROMPTS, CONTINUATIONS)]
    for t in range(len(CONTINUATIONS[0])):
        ids = np.array([[c[t]] for c in CONTINUATIONS], np.int32)
        step = forward(config, weights, ids, lengths[:, None], caches, lengths, lengths + 1)
        for b in range(2):
            _assert_close(step[b, 0], expected[b][lengths[b]])
        lengths = lengths + 1


def test_greedy_generation_matches_hugging_face_generate(case):
    model, config, weights = case
    session = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=S_MAX))
    ours = generate(session, PROMPTS, 16).ids
    theirs = []
    for p in PROMPTS:  # one prompt at a time: no padding on the Hugging Face side
        out = model.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            do_sample=False,
            max_new_tokens=16,
            eos_token_id=None,  # never stop early: compare all 16 tokens
            pad_token_id=0,
        )
        theirs.append(out[0, len(p) :].tolist())
    assert [len(t) for t in theirs] == [16, 16]
    assert ours == theirs
