"""Every decoder family's NumPy reference against its Hugging Face class.

Each case is a random-weight Hugging Face model of odd sizes written with ``save_pretrained``
and read back through ``LlamaConfig.from_hf`` and ``load_hf_weights`` (Phi-3's fused
projections split on load). Expected values come from PyTorch: each prompt alone, unpadded,
recomputed from scratch; the reference runs both prompts as one right-padded batch through its
KV cache. Windowed cases use a window shorter than the longer prompt (7 tokens), so keys drop
out of the window in prefill and in every decode step.

Tolerance: float32 on both sides, ``1e-4 * max|logit|`` absolute (as the Llama oracle).
"""

import numpy as np
import pytest
import torch

from tests.support.family_cases import CASES, PROMPTS, WINDOWS, saved_family
from tests.support.hf_models import greedy_ids
from trt_kv.models.llama import LlamaConfig
from trt_kv.models.llama.reference import empty_caches, forward
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate

RTOL_OF_SCALE = 1e-4
S_MAX = 32


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request, tmp_path_factory):
    """``(hf_model, config, weights)``: a saved and reloaded random Hugging Face model."""
    return saved_family(request.param, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("name", list(CASES))
def test_windows_read_from_the_saved_config(name, tmp_path):
    config_class, _, args = CASES[name]
    config_class(num_hidden_layers=2, **args).save_pretrained(tmp_path)
    config = LlamaConfig.from_hf(tmp_path)
    assert config.model_type == config_class.model_type
    assert [config.window(i) for i in range(2)] == WINDOWS[name]


def test_prefill_logits_of_a_ragged_batch_match_hugging_face_per_prompt(case):
    model, config, weights = case
    lengths = np.array([len(p) for p in PROMPTS], np.int32)
    ids = np.zeros((2, lengths.max()), np.int32)
    for b, p in enumerate(PROMPTS):
        ids[b, : len(p)] = p
    positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    caches = empty_caches(config, 2, S_MAX)
    logits = forward(config, weights, ids, positions, caches, np.zeros(2, np.int32), lengths)
    for b, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            expected = model(torch.tensor([prompt])).logits[0].numpy()
        scale = float(np.abs(expected).max())
        np.testing.assert_allclose(
            logits[b, : len(prompt)], expected, rtol=0, atol=RTOL_OF_SCALE * scale
        )


def test_16_greedy_ids_of_a_ragged_batch_match_hugging_face_generate(case):
    model, config, weights = case
    session = Session(ReferenceBackend(config, weights, capacity=2, max_seq_len=S_MAX))
    ours = generate(session, PROMPTS, 16).ids
    theirs = greedy_ids(model, PROMPTS, 16)
    assert [len(t) for t in theirs] == [16, 16]
    assert ours == theirs
