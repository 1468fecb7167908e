"""The real default model against Hugging Face: transformers loads the same GGUF (its own
dequantizer and Q/K un-permutation) and is the oracle for the tensors and the greedy ids.

The ids are goldens in ``real_model.py``; the first test checks them with transformers,
the others check trt_kv's backends against them: the reference (float32) and the interpreter
of the built network (float32 and float16), each on both prompts in one batch and on each
prompt alone. 24 new tokens, end-of-text ignored, greedy.
"""

import numpy as np
import pytest
import torch

from tests.support.real_model import CHAT_IDS, CHAT_PROMPT_IDS, PLAIN_IDS, PLAIN_PROMPT_IDS
from trt_kv.models.llama import LlamaConfig, build_llama_network, to_hf_tensors
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

PROMPTS = [CHAT_PROMPT_IDS, PLAIN_PROMPT_IDS]
EXPECTED = [CHAT_IDS, PLAIN_IDS]
NEW = 24
S_MAX = 64


def test_each_golden_id_is_hugging_faces_greedy_choice(hf_smollm2):
    """Teacher-forced through transformers' model (whatever release is installed): at every
    step the golden id has the largest logit, up to float32 noise (1e-4 of the largest
    |logit|), so a release that only rounds differently cannot fail this, a changed model or
    dequantizer would."""
    for prompt, expected in zip(PROMPTS, EXPECTED):
        with torch.no_grad():
            logits = hf_smollm2(torch.tensor([prompt + expected])).logits[0].numpy()
        steps = logits[len(prompt) - 1 : -1]  # [NEW, V]: the logits each new id came from
        chosen = steps[np.arange(NEW), expected]
        assert np.all(chosen >= steps.max(axis=-1) - 1e-4 * np.abs(steps).max())
        assert (steps.argmax(axis=-1) == expected).mean() > 0.9  # not a tie everywhere


def test_config_from_gguf_metadata_is_smollm2_135m(smollm2):
    assert smollm2.config == LlamaConfig(rms_norm_eps=float(np.float32(1e-5)))
    assert smollm2.checkpoint.eos_token_ids == (2,)


def test_gguf_tensors_equal_the_ones_transformers_dequantizes(smollm2, hf_smollm2):
    ours = to_hf_tensors(smollm2.weights)
    theirs = {k: v.numpy() for k, v in hf_smollm2.state_dict().items() if k != "lm_head.weight"}
    assert sorted(ours) == sorted(theirs)  # tied head: the embedding
    for name, value in theirs.items():
        assert ours[name].dtype == np.float32
        np.testing.assert_allclose(ours[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def _reference_session(model, dtype, batch):
    assert dtype == "float32"  # the reference computes in float32 only
    return Session(ReferenceBackend(model.config, model.weights, capacity=batch, max_seq_len=S_MAX))


def _interpreter_session(model, dtype, batch):
    net = build_llama_network(
        model.config,
        model.weights,
        max_seq_len=S_MAX,
        max_batch=batch,
        max_step_tokens=40,
        dtype=dtype,
    )
    return Session(InterpreterBackend(net))


SESSIONS = {"reference": _reference_session, "interpreter": _interpreter_session}
CASES = [("reference", "float32"), ("interpreter", "float32"), ("interpreter", "float16")]


@pytest.mark.parametrize(("backend", "dtype"), CASES)
def test_greedy_ids_equal_hugging_face_batched(smollm2, backend, dtype):
    session = SESSIONS[backend](smollm2, dtype, 2)
    assert generate(session, PROMPTS, NEW).ids == EXPECTED


@pytest.mark.parametrize(("backend", "dtype"), CASES)
def test_greedy_ids_equal_hugging_face_alone(smollm2, backend, dtype):
    session = SESSIONS[backend](smollm2, dtype, 1)
    for prompt, expected in zip(PROMPTS, EXPECTED):
        assert generate(session, [prompt], NEW).ids == [expected]
