"""``Session.step_slots``: one step over slots that need not be consecutive (continuous
batching), each sequence where it stands: idle slots inside the window take a pad token
that is never counted, nothing is copied between slots."""

import numpy as np
import pytest

from tests.support.serve_sessions import host_session
from trt_kv.errors import SlotError


def test_a_step_over_slots_0_and_2_equals_each_slot_decoded_alone():
    s = host_session("float16")
    s.prefill([[5, 17, 42], [9, 9], [61, 3, 9, 2]])
    idle = s.snapshot(1)
    got = s.step_slots({2: [7], 0: [8]})  # rows in slot order: 0, then 2
    assert [s.length(k) for k in range(3)] == [4, 2, 5]
    after = s.snapshot(1)  # its two cached rows, unchanged (the pad went to row 2)
    assert all(np.array_equal(after[name], idle[name]) for name in idle)
    alone = host_session("float16")
    alone.prefill([[5, 17, 42]])
    np.testing.assert_array_equal(got[0], alone.decode([8])[0])
    alone.prefill([[61, 3, 9, 2]])
    np.testing.assert_array_equal(got[1], alone.decode([7])[0])


def test_ragged_tokens_per_slot_are_one_step():
    s = host_session("float16")
    s.prefill([[5, 17], [1], [2], [3]])
    s.step_slots({1: [4, 5, 6], 3: [7]})
    assert [s.length(k) for k in range(4)] == [2, 4, 1, 2]
    plan = s.state.plan_window({1: [4, 5, 6], 3: [7]})
    assert plan.active.tolist() == [True, False, True] and list(plan.slots) == [1, 2, 3]


def test_an_idle_slot_at_s_max_is_cropped_to_make_room_for_its_pad_row():
    s = host_session("float16")
    s.prefill([[1], [2] * 8])
    for _ in range(5):
        s.step([[3] * 8], lo=1)  # slot 1 at 48 = S_max
    s.prefill([[4], [5]], lo=2)
    s.step_slots({0: [6], 2: [7]})
    assert [s.length(k) for k in range(3)] == [2, 47, 2]


def test_bad_slots_are_refused_before_anything_changes():
    s = host_session("float16")
    with pytest.raises(SlotError, match="tokens: expected a non-empty mapping"):
        s.step_slots({})
    with pytest.raises(SlotError, match="slot: expected an integer in"):
        s.step_slots({9: [1]})
    assert s.state.lengths.tolist() == [0, 0, 0, 0]
