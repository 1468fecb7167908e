"""Host-side cache state: per-step tensors derived from slot lengths, and every error."""

import numpy as np
import pytest

from trt_kv.errors import ArgumentError, CacheOverflowError, ShapeError, SlotError
from trt_kv.runtime.cache_state import CacheState


def test_prefill_plan_pads_right_and_derives_every_index():
    state = CacheState(capacity=4, max_seq_len=16)
    plan = state.plan([0, 1], [[11, 12, 13], [21]])
    np.testing.assert_array_equal(plan.input_ids, [[11, 12, 13], [21, 0, 0]])
    np.testing.assert_array_equal(plan.position_ids, [[0, 1, 2], [0, 1, 2]])
    np.testing.assert_array_equal(plan.write_indices, [0, 0])
    np.testing.assert_array_equal(plan.kv_lengths, [3, 1])
    np.testing.assert_array_equal(plan.last_token_rows, [2, 3])  # rows of [B * S] tokens
    np.testing.assert_array_equal(plan.update_lengths, [0, 3, 4])
    assert plan.input_ids.dtype == np.int32 and plan.position_ids.dtype == np.int64


def test_commit_advances_each_slot_by_its_own_count():
    state = CacheState(4, 16)
    state.commit(state.plan([0, 1], [[1, 2, 3], [4]]))
    plan = state.plan([0, 1], [[5], [6]])
    np.testing.assert_array_equal(plan.write_indices, [3, 1])
    np.testing.assert_array_equal(plan.position_ids, [[3], [1]])
    np.testing.assert_array_equal(plan.kv_lengths, [4, 2])
    np.testing.assert_array_equal(plan.last_token_rows, [0, 1])


def test_plan_does_not_change_lengths():
    state = CacheState(2, 8)
    state.plan([0], [[1, 2]])
    assert state.length(0) == 0


def test_window_may_start_at_any_slot():
    state = CacheState(4, 8)
    plan = state.plan([2, 3], [[1], [2]])
    assert plan.slots == range(2, 4)
    state.commit(plan)
    np.testing.assert_array_equal(state.lengths, [0, 0, 1, 1])


def test_overflow_names_slot_length_and_s_max_and_changes_nothing():
    state = CacheState(2, 8)
    state.commit(state.plan([0, 1], [[1] * 6, [1]]))
    with pytest.raises(
        CacheOverflowError,
        match=r"slot 0: expected length \+ S <= S_max = 8, "
        r"got 6 \+ 3 = 9",
    ):
        state.plan([0, 1], [[1, 2, 3], [1]])
    np.testing.assert_array_equal(state.lengths, [6, 1])


def test_padded_width_counts_for_overflow_of_a_shorter_sequence():
    state = CacheState(2, 8)
    state.commit(state.plan([0, 1], [[1], [1] * 7]))
    with pytest.raises(CacheOverflowError, match="slot 1"):
        state.plan([0, 1], [[1, 2], [3]])  # slot 1 gets 1 token but the step writes S = 2 rows


def test_batch_past_capacity_raises():
    with pytest.raises(SlotError, match="batch: expected at most capacity = 2, got 3"):
        CacheState(2, 8).plan([0, 1, 2], [[1], [1], [1]])


def test_unknown_slot_raises():
    with pytest.raises(SlotError, match=r"slot: expected an integer in \[0, 2\), got 5"):
        CacheState(2, 8).length(5)


def test_slot_window_past_capacity_raises():
    with pytest.raises(SlotError, match="got 2"):
        CacheState(2, 8).plan([1, 2], [[1], [1]])


def test_non_consecutive_slots_raise():
    with pytest.raises(
        SlotError, match=r"slots: expected consecutive slots \[0, 1\], got \[0, 2\]"
    ):
        CacheState(4, 8).plan([0, 2], [[1], [1]])


def test_sequence_without_tokens_raises():
    with pytest.raises(SlotError, match="slot 1: expected at least one new token"):
        CacheState(4, 8).plan([0, 1], [[1], []])


def test_reset_all_and_one():
    state = CacheState(3, 8)
    state.commit(state.plan([0, 1, 2], [[1, 2], [1], [1, 2, 3]]))
    state.reset(1)
    np.testing.assert_array_equal(state.lengths, [2, 0, 3])
    state.reset()
    np.testing.assert_array_equal(state.lengths, [0, 0, 0])


def test_crop_keeps_a_prefix_and_negative_crop_drops_a_suffix():
    state = CacheState(1, 8)
    state.commit(state.plan([0], [[1, 2, 3, 4, 5]]))
    state.crop(0, 4)
    assert state.length(0) == 4
    state.crop(0, -3)
    assert state.length(0) == 1


def test_crop_cannot_grow_a_slot():
    state = CacheState(1, 8)
    with pytest.raises(CacheOverflowError, match="crop length <= current length 0, got 2"):
        state.crop(0, 2)


def test_fork_copies_the_length():
    state = CacheState(3, 8)
    state.commit(state.plan([0], [[1, 2, 3]]))
    state.fork(0, 2)
    np.testing.assert_array_equal(state.lengths, [3, 0, 3])


def test_reorder_permutes_repeats_and_drops():
    state = CacheState(3, 8)
    state.commit(state.plan([0, 1, 2], [[1], [1, 2], [1, 2, 3]]))
    state.reorder([2, 2, 0])
    np.testing.assert_array_equal(state.lengths, [3, 3, 1])


def test_frozen_steps_do_not_commit():
    state = CacheState(1, 8)
    with state.frozen_steps():
        state.commit(state.plan([0], [[1, 2]]))
    assert state.length(0) == 0
    state.freeze()
    state.commit(state.plan([0], [[1]]))
    state.unfreeze()
    state.commit(state.plan([0], [[1]]))
    assert state.length(0) == 1


def test_set_length_past_s_max_raises():
    with pytest.raises(CacheOverflowError, match=r"slot 0: expected length in \[0, 8\]"):
        CacheState(1, 8).set_length(0, 9)


def test_token_array_plans_the_same_step_as_token_lists():
    state = CacheState(4, 16)
    state.commit(state.plan([0, 1, 2], [[1, 2, 3], [4], [5, 6]]))
    from_lists = state.plan(range(0, 3), [[7, 8], [9, 10], [11, 12]])
    from_array = state.plan(range(0, 3), np.array([[7, 8], [9, 10], [11, 12]]))
    for field in (
        "counts",
        "input_ids",
        "position_ids",
        "write_indices",
        "kv_lengths",
        "last_token_rows",
    ):
        got, want = getattr(from_array, field), getattr(from_lists, field)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


def test_empty_token_array_raises():
    with pytest.raises(SlotError, match=r"tokens: expected an array \[B, S\] with S >= 1"):
        CacheState(2, 8).plan(range(0, 2), np.zeros((2, 0), np.int64))


def test_step_wider_than_max_step_tokens_raises():
    with pytest.raises(
        ShapeError, match="tokens: expected at most max_step_tokens per step 2, got 3"
    ):
        CacheState(2, 8, max_step_tokens=2).plan([0], [[1, 2, 3]])


def test_a_prefill_plan_starts_from_empty_slots_and_changes_nothing():
    state = CacheState(2, 8)
    state.commit(state.plan([0, 1], [[1] * 6, [1] * 7]))
    plan = state.plan([0, 1], [[5, 6, 7], [8]], from_empty=True)  # 6 + 3 > 8 if not empty
    np.testing.assert_array_equal(plan.write_indices, [0, 0])
    np.testing.assert_array_equal(plan.position_ids, [[0, 1, 2], [0, 1, 2]])
    np.testing.assert_array_equal(state.lengths, [6, 7])


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 8), "capacity: expected an integer >= 1, got 0"),
        ((2, -1), "max_seq_len: expected an integer >= 1, got -1"),
        ((2, 8, 0), "max_step_tokens: expected an integer >= 1, got 0"),
        ((2, 8, None, 2.0), "vocab_size: expected an integer >= 1, got 2.0"),
    ],
)
def test_state_sizes_must_be_positive_integers(args, match):
    with pytest.raises(ArgumentError, match=match):
        CacheState(*args)
