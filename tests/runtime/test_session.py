"""Session API: every cache operation gives the same logits as recomputing from scratch."""

import numpy as np
import pytest

from tests.support.tiny_models import TINY_GQA_V97
from trt_kv.errors import CacheOverflowError, ShapeError, SlotError
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Sampler, Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

CFG = TINY_GQA_V97
WEIGHTS = random_weights(CFG, seed=1, std=0.3)
S_MAX = 24
PROMPT, OTHER = [5, 17, 42, 8], [61, 3]


def session(capacity=4, max_seq_len=S_MAX):
    return Session(ReferenceBackend(CFG, WEIGHTS, capacity=capacity, max_seq_len=max_seq_len))


def fresh_logits(tokens):
    """Logits after feeding ``tokens`` to an empty cache in one step."""
    return session(1).prefill([tokens])[0]


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_decode_after_prefill_equals_one_long_prefill():
    s = session()
    s.prefill([PROMPT])
    close(s.decode([9])[0], fresh_logits([*PROMPT, 9]))


def test_ragged_batch_equals_each_prompt_alone():
    s = session()
    logits = s.prefill([PROMPT, OTHER])
    close(logits[0], fresh_logits(PROMPT))
    close(logits[1], fresh_logits(OTHER))
    step = s.decode([1, 2])
    close(step[0], fresh_logits([*PROMPT, 1]))
    close(step[1], fresh_logits([*OTHER, 2]))


def test_fork_shares_a_prefix():
    s = session()
    s.prefill([PROMPT])
    s.fork(0, 1)
    out = s.decode([7, 8])
    close(out[0], fresh_logits([*PROMPT, 7]))
    close(out[1], fresh_logits([*PROMPT, 8]))
    assert s.length(1) == len(PROMPT) + 1


def test_crop_rewinds_to_a_prefix():
    s = session()
    s.prefill([[*PROMPT, 30, 31, 32]])
    s.crop(0, len(PROMPT))
    close(s.decode([9])[0], fresh_logits([*PROMPT, 9]))


def test_reorder_moves_sequences_between_slots():
    s = session()
    s.prefill([PROMPT, OTHER])
    s.reorder([1, 0])
    out = s.decode([4, 4])
    close(out[0], fresh_logits([*OTHER, 4]))
    close(out[1], fresh_logits([*PROMPT, 4]))


def test_reorder_can_duplicate_a_beam():
    s = session()
    s.prefill([PROMPT, OTHER])
    s.reorder([0, 0])
    out = s.decode([4, 5])
    close(out[1], fresh_logits([*PROMPT, 5]))


def test_snapshot_and_restore_round_trip():
    s = session()
    s.prefill([PROMPT])
    snap = s.snapshot(0)
    assert snap["past_key.0"].shape == (CFG.num_key_value_heads, len(PROMPT), CFG.head_dim)
    s.prefill([OTHER])
    s.restore(2, snap)
    assert s.length(2) == len(PROMPT)
    close(s.decode([9], lo=2)[0], fresh_logits([*PROMPT, 9]))


def test_frozen_steps_leave_the_cache_as_it_was():
    s = session()
    s.prefill([PROMPT])
    with s.frozen():
        s.decode([50])
        s.decode([51])
    assert s.length(0) == len(PROMPT)
    close(s.decode([9])[0], fresh_logits([*PROMPT, 9]))


def test_freeze_and_unfreeze():
    s = session()
    s.prefill([PROMPT])
    s.freeze()
    s.decode([50])
    s.unfreeze()
    assert s.length(0) == len(PROMPT)


def test_legacy_export_import_round_trip_between_sessions():
    a = session()
    a.prefill([PROMPT, PROMPT[::-1]])
    past = a.export_legacy([0, 1])
    assert len(past) == CFG.num_hidden_layers
    assert past[0][0].shape == (2, CFG.num_key_value_heads, len(PROMPT), CFG.head_dim)
    b = session()
    b.import_legacy(past, [0, 1])
    close(b.decode([9, 9]), a.decode([9, 9]))


def test_legacy_export_needs_equal_lengths():
    s = session()
    s.prefill([PROMPT, OTHER])
    with pytest.raises(ShapeError, match=r"slots: expected one common length"):
        s.export_legacy([0, 1])


def test_reset_zeroes_one_slot_and_its_buffers():
    s = session()
    s.prefill([PROMPT, OTHER])
    s.reset(1)
    assert s.length(1) == 0 and s.length(0) == len(PROMPT)
    assert not s.storage.arrays["past_key.0"][1].any()
    assert s.storage.arrays["past_key.0"][0].any()


def test_memory_reports_bytes_per_cache_and_total():
    mem = session(capacity=3).memory()
    per_cache = 3 * CFG.num_key_value_heads * S_MAX * CFG.head_dim * 4
    assert mem["past_key.0"] == per_cache
    assert mem["total"] == per_cache * 2 * CFG.num_hidden_layers


def test_step_longer_than_max_step_tokens_is_fed_in_chunks():
    s = Session(ReferenceBackend(CFG, WEIGHTS, capacity=1, max_seq_len=S_MAX, max_step_tokens=2))
    close(s.prefill([PROMPT])[0], fresh_logits(PROMPT))  # 4 tokens: two chunks of 2
    assert s.length(0) == len(PROMPT)


def test_overflow_is_refused_before_anything_runs():
    s = session(max_seq_len=6)
    s.prefill([PROMPT])
    before = s.snapshot(0)
    with pytest.raises(CacheOverflowError, match="slot 0"):
        s.step([[1, 2, 3]])
    assert s.length(0) == len(PROMPT)
    for name, rows in s.snapshot(0).items():
        np.testing.assert_array_equal(rows, before[name])


def test_generate_refuses_a_request_that_cannot_fit():
    with pytest.raises(CacheOverflowError, match="prompt 0"):
        generate(session(max_seq_len=6), [PROMPT], max_new_tokens=4)


def test_unknown_slot_in_a_cache_operation_raises():
    with pytest.raises(SlotError):
        session().fork(0, 9)


def test_seeded_sampling_repeats_and_top_k_1_is_greedy():
    prompts = [PROMPT, OTHER]
    greedy = generate(session(), prompts, 6).ids
    assert generate(session(), prompts, 6, Sampler(1.0, top_k=1, seed=3)).ids == greedy
    a = generate(session(), prompts, 6, Sampler(1.5, top_k=20, seed=7)).ids
    assert a == generate(session(), prompts, 6, Sampler(1.5, top_k=20, seed=7)).ids


@pytest.fixture(scope="module")
def interpreter_session():
    net = build_llama_network(
        CFG, WEIGHTS, max_seq_len=S_MAX, max_batch=4, max_step_tokens=8, dtype="float32"
    )
    return Session(InterpreterBackend(net))


def test_interpreter_loop_reproduces_reference_generation(interpreter_session):
    prompts = [PROMPT, OTHER, [1, 2, 3, 4, 5, 6, 7]]
    ref = generate(session(), prompts, 10)
    got = generate(interpreter_session, prompts, 10)
    assert got.ids == ref.ids


def test_interpreter_cache_operations_match_reference(interpreter_session):
    s, r = interpreter_session, session()
    for x in (s, r):
        x.prefill([PROMPT, OTHER])
        x.fork(0, 2)
        x.reorder([2, 1, 0])
        x.crop(0, 2)
    close(s.decode([3, 4, 5]), r.decode([3, 4, 5]))


def test_nan_outside_the_written_window_stays_untouched(interpreter_session):
    s = interpreter_session
    s.reset()
    for arr in s.storage.arrays.values():
        arr[...] = np.nan
    s.step([PROMPT, OTHER])  # a step on empty slots, without prefill's zeroing
    s.decode([1, 2])
    for arr in s.storage.arrays.values():
        assert not np.isnan(arr[0, :, : len(PROMPT) + 1]).any()
        assert np.isnan(arr[0, :, len(PROMPT) + 1 :]).all()
        # slot 1 was written for the padded width S = 4 of the prefill, then at row 2
        assert not np.isnan(arr[1, :, :4]).any()
        assert np.isnan(arr[1, :, 4:]).all()
        assert np.isnan(arr[2:]).all()
    s.reset()


def test_malformed_restore_writes_nothing():
    s = session()
    s.prefill([PROMPT])
    before = s.snapshot(0)
    snap = s.snapshot(0)
    snap["past_value.1"] = snap["past_value.1"][:, :, :-1]  # last cache malformed (wrong H)
    with pytest.raises(ShapeError):
        s.restore(0, {k: np.zeros_like(v) if k != "past_value.1" else v for k, v in snap.items()})
    for name, rows in s.snapshot(0).items():
        np.testing.assert_array_equal(rows, before[name])


def test_malformed_legacy_import_writes_nothing():
    s = session()
    s.prefill([PROMPT, PROMPT])
    before = s.export_legacy([0, 1])
    past = [tuple(np.zeros_like(a) for a in layer) for layer in before]
    past[-1] = (past[-1][0], past[-1][1][:, :, :, :-1])  # last layer's V malformed
    with pytest.raises(ShapeError):
        s.import_legacy(past, [0, 1])
    for got, want in zip(s.export_legacy([0, 1]), before):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_legacy_import_with_unequal_layer_lengths_raises():
    s = session()
    s.prefill([PROMPT])
    past = list(s.export_legacy([0]))
    past[0] = tuple(a[:, :, :-1] for a in past[0])
    with pytest.raises(ShapeError, match="one length L for every layer"):
        s.import_legacy(past, [1])
    assert s.length(1) == 0
