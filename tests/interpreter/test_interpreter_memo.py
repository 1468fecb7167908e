"""trt_kv/interpreter/memo.py: a step's derivation shared by its layers, keyed by its inputs'
bytes (never their identity alone), and the attention layers' use of it: a mask changed in place
between two runs of one plan is read anew."""

from __future__ import annotations

import numpy as np

from tests.interpreter.test_interpreter_attention import softmax_attention
from tests.support.interpreter_support import Net, rand
from trt_kv._trt import trt
from trt_kv.interpreter import compile_network
from trt_kv.interpreter.memo import Memo, frozen

NONE = trt.CausalMaskKind.NONE


def _counting() -> tuple[Memo, list[int], object]:
    memo, calls = Memo(), []

    def get(a: np.ndarray | None, extra: tuple = ()) -> int:
        return memo.get((a,), extra, lambda: calls.append(1) or len(calls))

    return memo, calls, get


def test_the_same_bytes_give_the_last_value_and_other_bytes_derive_again():
    _, calls, get = _counting()
    a = np.arange(6, dtype=np.int64)
    assert get(a) == get(a) == get(a.copy()) == 1  # another array, the same values
    a[2] = 7  # changed in place: the same object, other bytes
    assert get(a) == 2
    assert get(a.reshape(2, 3)) == 3  # the same bytes in another shape
    assert get(a.astype(np.uint64)) == 4  # ... or dtype
    assert get(a.reshape(2, 3), extra=("x",)) == 5  # the extra values are part of the key
    assert get(None) == get(None) == 6
    assert len(calls) == 6
    b = np.arange(6, dtype=np.int64)  # the last call's object itself, reshaped or retyped
    assert get(b) == get(b) == 7
    b.shape = (3, 2)
    assert get(b) == 8
    b.dtype = np.uint64
    assert get(b) == 9
    assert len(calls) == 9


def test_frozen_is_a_read_only_copy_that_leaves_the_callers_array_alone():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1:3]  # a strided view
    f = frozen(a)
    assert f.flags.c_contiguous and not f.flags.writeable
    assert a.base.flags.writeable and not np.shares_memory(a, f)
    np.testing.assert_array_equal(f, a)


def test_a_decode_steps_mask_changed_in_place_is_read_anew():
    """Query heads 4, KV heads 2, one query row, 9 keys (the native decode attention, its
    keys and keep mask derived once a step): the plan run again after the caller changed
    its mask array in place attends as the new mask says; a copy of it, alike (the
    reference scales scores by 1/sqrt(H), the layer does not: q times sqrt(H) undoes it)."""
    net = Net()
    shapes = {"q": (1, 4, 1, 8), "k": (1, 2, 9, 8), "v": (1, 2, 9, 8)}
    q, k, v = (net.input(name, "float32", shape) for name, shape in shapes.items())
    att = net.network.add_attention_v2(q, k, v, trt.AttentionNormalizationOp.SOFTMAX, NONE)
    att.decomposable = True
    att.mask = net.input("mask", "bool", (1, 1, 1, 9))
    net.mark(att.get_output(0))
    plan = compile_network(net.network)
    feed = {name: rand(*shape, seed=i) for i, (name, shape) in enumerate(shapes.items())}
    mask = np.zeros((1, 1, 1, 9), bool)
    mask[..., :6] = True
    for keys in (6, 3, 9):
        mask[...] = np.arange(9) < keys  # the same array, other values
        for m in (mask, mask.copy()):
            out = plan.run(feed | {"mask": m})["out"]
            expected = softmax_attention(feed["q"] * 8**0.5, feed["k"], feed["v"], keep=m)
            np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_up_to_size_keys_are_kept_then_it_starts_again():
    """Keys alternating (a step's Q and K RoPE layers: one positions array, two shapes) stay
    derived once each; past ``size`` keys the entries start again."""
    memo, calls = Memo(size=2), []
    a = np.arange(3)
    get = lambda extra: memo.get((a,), extra, lambda: calls.append(extra) or extra)  # noqa: E731
    for _ in range(3):
        assert (get("q"), get("k")) == ("q", "k")
    assert calls == ["q", "k"]
    get("v")  # a third key: the two before it are dropped
    get("q")
    assert calls == ["q", "k", "v", "q"]
