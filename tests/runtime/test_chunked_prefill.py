"""Chunked prefill and profile selection: prompts longer than ``max_step_tokens`` are fed in
chunks with the ids (and, to float rounding, the logits) of one long prefill; every step runs
in the optimization profile an engine would pick (decode for S = 1, prefill otherwise).

"One long prefill" is the reference backend with ``max_step_tokens = S_max``: it feeds the
whole prompt in one step. Tolerance 1e-5 * max|logit|: float32 on both sides, only the order
of operations differs (chunks attend over cached rows instead of in-step rows).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv.builder import Profile
from trt_kv.errors import CacheOverflowError, ShapeError
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate
from trt_kv.runtime.chunking import plan_chunks
from trt_kv.runtime.interpreter_backend import InterpreterBackend
from trt_kv.runtime.profiles import select_profile

CONFIG = TINY_GQA
WEIGHTS = random_weights(CONFIG, seed=4, std=0.3)
S_MAX, WIDTH, BATCH = 24, 4, 3
LONG = [(7 * t + 3) % 60 + 1 for t in range(11)]  # 11 tokens: chunks of 4, 4, 3
SHORT = [9, 41, 2, 30, 17, 5]  # 6 tokens: chunks of 4, 2
TINY_PROMPT = [12, 8]  # 2 tokens: done in the first chunk


def _one_long_prefill() -> Session:
    return Session(ReferenceBackend(CONFIG, WEIGHTS, capacity=BATCH, max_seq_len=S_MAX))


def _chunked_reference() -> Session:
    backend = ReferenceBackend(
        CONFIG, WEIGHTS, capacity=BATCH, max_seq_len=S_MAX, max_step_tokens=WIDTH
    )
    return Session(backend)


@pytest.fixture(scope="module")
def interpreter():
    net = build_llama_network(
        CONFIG,
        WEIGHTS,
        max_seq_len=S_MAX,
        max_batch=BATCH,
        max_step_tokens=WIDTH,
        dtype="float32",
    )
    return InterpreterBackend(net)


def _close(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_chunks_cover_each_prompt_in_windows_of_consecutive_slots():
    """Chunk 2 feeds slots 0 and 2 (slot 1's prompt ended): two steps, one per run."""
    chunks = plan_chunks(_one_long_prefill().state, 0, [LONG, TINY_PROMPT, SHORT], WIDTH)
    assert [(list(c.plan.slots), c.plan.counts.tolist()) for c in chunks] == [
        ([0, 1, 2], [4, 2, 4]),
        ([0], [4]),
        ([2], [2]),
        ([0], [3]),
    ]
    assert [c.plan.write_indices.tolist() for c in chunks] == [[0, 0, 0], [4], [4], [8]]
    assert [c.last for c in chunks] == [((1, 1),), (), ((2, 0),), ((0, 0),)]


def test_chunked_reference_prefill_equals_one_long_prefill():
    prompts = [LONG, TINY_PROMPT, SHORT]
    _close(_chunked_reference().prefill(prompts), _one_long_prefill().prefill(prompts))


def test_interpreter_generates_the_ids_of_one_long_prefill(interpreter):
    prompts = [LONG, TINY_PROMPT, SHORT]
    ours = generate(Session(interpreter), prompts, 6).ids
    assert ours == generate(_one_long_prefill(), prompts, 6).ids


def test_interpreter_chunked_logits_equal_one_long_prefill(interpreter):
    prompts = [SHORT, LONG]
    _close(Session(interpreter).prefill(prompts), _one_long_prefill().prefill(prompts))


def test_a_prompt_of_s_max_tokens_is_prefilled(interpreter):
    prompt = [(5 * t) % 60 + 1 for t in range(S_MAX)]
    _close(Session(interpreter).prefill([prompt]), _one_long_prefill().prefill([prompt]))


def test_overflow_in_the_last_chunk_fails_before_the_first_runs():
    s = _chunked_reference()
    s.prefill([LONG[:5]])
    before = s.snapshot(0)
    with pytest.raises(CacheOverflowError, match="slot 0"):
        s.step([LONG + LONG[:9]])  # 5 + 20 > 24, found in the fifth chunk
    assert s.length(0) == 5
    for name, rows in s.snapshot(0).items():
        np.testing.assert_array_equal(rows, before[name])


def test_a_frozen_chunked_step_sees_its_own_chunks_and_keeps_the_lengths():
    s, fresh = _chunked_reference(), _one_long_prefill()
    s.prefill([SHORT])
    with s.frozen():
        _close(s.step([LONG]), fresh.prefill([SHORT + LONG])[0][None])
    assert s.length(0) == len(SHORT)


def test_decode_steps_take_the_decode_profile_and_prefill_chunks_the_prefill_one(interpreter):
    assert [p.name for p in interpreter.net.profiles] == ["decode", "prefill"]
    s = Session(interpreter)
    s.prefill([TINY_PROMPT])
    assert interpreter.profile == 1
    s.decode([3])
    assert interpreter.profile == 0
    s.prefill([LONG])  # three chunks, each S > 1
    assert interpreter.profile == 1


PROFILES = [
    Profile("decode", {"input_ids": ((1, 1), (4, 1), (4, 1))}),
    Profile("prefill", {"input_ids": ((1, 1), (4, 8), (4, 8))}),
]


def test_the_first_profile_that_holds_the_shapes_is_selected():
    assert select_profile(PROFILES, {"input_ids": (3, 1)}) == 0
    assert select_profile(PROFILES, {"input_ids": (3, 2)}) == 1
    assert select_profile(PROFILES, {"input_ids": (1, 8), "past_key.0": (1, 2, 16, 8)}) == 1


def test_shapes_no_profile_holds_name_each_range():
    expected = (
        "step shapes: expected a profile that holds them, got "
        "decode: input_ids in [1, 1]..[4, 1], got [5, 1]; "
        "prefill: input_ids in [1, 1]..[4, 8], got [5, 1]"
    )
    with pytest.raises(ShapeError, match=re.escape(expected)):
        select_profile(PROFILES, {"input_ids": (5, 1)})
