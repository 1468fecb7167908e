"""The native helper's RoPE (``native_rope.rope``) against the reference's, bit for bit.

A fast float32 plan runs a rotary embedding layer in the helper: one pass over the rows
instead of NumPy's six, each product rounded and then their sum, as the reference's
``ops.apply_rope`` computes it, so the bits are the same.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.compiled_helper import require_compiled_helper
from tests.support.interpreter_support import Net, rand
from trt_kv.errors import DTypeError, ShapeError
from trt_kv.interpreter import compile_network, native_rope, transformer
from trt_kv.interpreter.program import identity
from trt_kv.reference import ops


@pytest.fixture(autouse=True)
def _compiled():
    """Every test here needs the compiled helper, which must be built wherever it can be."""
    require_compiled_helper()


# (B, N, S, H, rotary dim, interleaved): SmolLM2's heads, a partial rotary dim (the rest
# copied), halves not a multiple of 8 (the element-by-element tail), interleaved pairs
CASES = [
    (1, 9, 33, 64, None, False),
    (2, 3, 5, 64, 32, False),
    (2, 2, 4, 20, None, False),
    (2, 3, 5, 10, 6, True),
    (1, 4, 7, 64, None, True),
]


@pytest.mark.parametrize(("b", "n", "s", "h", "dim", "interleaved"), CASES)
def test_rope_is_the_reference_bit_for_bit(b, n, s, h, dim, interleaved):
    """Positions anywhere in the tables, negative ones counted from the end (as NumPy
    indexes them); values over a wide range, so a fused multiply-add would show."""
    x = rand(b, n, s, h, seed=1) * np.float32(1e3)
    half = (dim or h) // 2
    cos, sin = rand(40, half, seed=2), rand(40, half, seed=3)
    positions = np.random.default_rng(4).integers(-40, 40, (b, s))
    out = native_rope.rope(x, cos, sin, positions, dim, interleaved)
    expected = ops.apply_rope(x, cos, sin, positions, dim, interleaved)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("position", [-40, -1, 0, 39])
def test_one_position_a_decode_step_is_the_reference_bit_for_bit(position):
    """A decode step's one position (read, not reduced), at each end of the tables."""
    x = rand(1, 9, 1, 64, seed=5) * np.float32(1e3)
    cos, sin = rand(40, 32, seed=6), rand(40, 32, seed=7)
    positions = np.array([[position]], np.int64)
    assert transformer.native_rows(x, cos, sin, positions, None) is not None
    out = native_rope.rope(x, cos, sin, positions)
    expected = ops.apply_rope(x, cos, sin, positions)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


def test_strided_rows_are_read_as_their_values():
    x = rand(1, 6, 8, 16, seed=5)
    strided = np.ascontiguousarray(x.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    cos, sin, positions = rand(8, 8, seed=6), rand(8, 8, seed=7), np.arange(8)[None]
    np.testing.assert_array_equal(
        native_rope.rope(strided, cos, sin, positions), ops.apply_rope(x, cos, sin, positions)
    )


@pytest.mark.parametrize(
    ("x", "tables", "positions", "error", "names"),
    [
        (rand(1, 2, 3, 8, dtype="float16"), (4, 4), [[0, 1, 2]], DTypeError, "x"),
        (rand(1, 2, 3, 8), (4, 3), [[0, 1, 2]], ShapeError, "x, cos, sin"),
        (rand(1, 2, 3, 8), (4, 4), [[0, 1]], ShapeError, "positions"),
        (rand(1, 2, 3, 8), (4, 4), [[0, 1, 4]], ShapeError, "positions"),
        (rand(1, 2, 3, 8), (4, 4), [[0, 1, -5]], ShapeError, "positions"),
        (rand(1, 2, 1, 8), (4, 4), [[4]], ShapeError, "positions"),  # one position
        (rand(1, 2, 1, 8), (4, 4), [[-5]], ShapeError, "positions"),
    ],
    ids=[
        "x float16",
        "table width",
        "positions shape",
        "past the table",
        "before it",
        "one past",
        "one before",
    ],
)
def test_rope_refuses_other_dtypes_shapes_and_positions(x, tables, positions, error, names):
    cos = sin = np.zeros(tables, np.float32)
    with pytest.raises(error, match=f"^{names}: expected"):
        native_rope.rope(x, cos, sin, np.array(positions))


def test_the_fast_plan_leaves_positions_past_the_table_to_the_reference():
    """Out-of-range positions fail as the reference fails (NumPy's IndexError), not in C."""
    x, cos = rand(1, 2, 3, 8), rand(4, 4)
    assert transformer.native_rows(x, cos, cos, np.array([[0, 1, 3]]), None) is not None
    assert transformer.native_rows(x, cos, cos, np.array([[0, 1, 4]]), None) is None
    assert transformer.native_rows(x.astype(np.float64), cos, cos, np.array([[0]]), None) is None


def test_a_float16_layer_is_rounded_in_the_helpers_call_and_reads_changed_positions():
    """A float16 RoPE layer: the fast plan runs its kernel's rounding variant (no finisher),
    the bits of the float32 reference rounded to float16; a positions array the caller
    changes in place between runs is read anew (the table rows derived once a step are
    keyed by the positions' bytes)."""
    net = Net()
    x16 = (rand(1, 3, 2, 16, seed=8) * 30).astype(np.float16)
    cos, sin = rand(12, 8, seed=9).astype(np.float16), rand(12, 8, seed=10).astype(np.float16)
    layer = net.network.add_rotary_embedding(
        net.input("x", "float16", x16.shape), net.const(cos), net.const(sin), False, 0
    )
    layer.set_input(3, net.input("pos", "int64", (1, 2)))
    net.mark(layer.get_output(0))
    plan = compile_network(net.network)
    (step,) = [s for s in plan._steps if s.layer == layer.name]
    assert step.outputs[0][1] is identity and step.kernel.fn is step.kernel.halves
    positions = np.array([[3, 4]], np.int64)
    for at in ([3, 4], [-1, 0], [11, 2]):
        positions[0] = at  # the same array, other values
        out = plan.run({"x": x16, "pos": positions})["out"]
        wide = [a.astype(np.float32) for a in (x16, cos, sin)]
        expected = ops.apply_rope(wide[0], wide[1], wide[2], positions).astype(np.float16)
        np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize(("b", "nq", "nkv", "h", "dim", "interleaved"), [
    (1, 9, 3, 64, None, False),  # SmolLM2's heads
    (3, 4, 2, 20, 12, False),  # a partial rotary dim, halves not a multiple of 8
    (2, 2, 2, 10, None, True),
])  # fmt: skip
@pytest.mark.parametrize(
    "rounded", [(False, False, False), (True, True, True), (True, False, True)]
)
def test_decode_heads_are_rope_scale_and_cache_writes_one_by_one(
    b, nq, nkv, h, dim, interleaved, rounded
):
    """One call gives the bits of RoPE (the reference's), the float32 scale, each rounding to
    float16 where asked, and the cache update's row writes, from rows that are columns of one
    product (Q, K, V side by side); nothing else in the caches changes."""
    width, s_max = (nq + 2 * nkv) * h, 7
    qkv = rand(b, 1, width, seed=11) * np.float32(1e3)
    q, k, v = np.split(qkv, [nq * h, (nq + nkv) * h], axis=2)
    half = (dim or h) // 2
    cos, sin = rand(40, half, seed=12), rand(40, half, seed=13)
    positions = np.array([[39], [0], [17]][:b], np.int64)
    where = np.array([6, 0, 3][:b], np.int64)
    factor = np.float32(0.125) * np.float32(1.1)  # not a power of two: the product rounds
    keys, values = rand(b, nkv, s_max, h, seed=14), rand(b, nkv, s_max, h, seed=15)
    want_keys, want_values = keys.copy(), values.copy()

    def rope(x: np.ndarray, n: int, rounding: bool) -> np.ndarray:
        out = ops.apply_rope(x.reshape(b, n, 1, h), cos, sin, positions, dim, interleaved)
        return out.astype(np.float16).astype(np.float32) if rounding else out

    want_q = np.multiply(rope(q, nq, rounded[0]), factor)
    want_q = want_q.astype(np.float16).astype(np.float32) if rounded[2] else want_q
    ops.kv_cache_update_(want_keys, rope(k, nkv, rounded[1]), where)
    ops.kv_cache_update_(want_values, v.reshape(b, nkv, 1, h), where)
    rows, r = native_rope.rope_rows((b, nq, 1, h), cos, sin, positions, dim)
    heads = native_rope.decode_heads((nq, nkv, h), r, interleaved, rounded[:2], factor, rounded[2])
    got_q = heads(q, k, v, cos, sin, rows, keys, values, where)
    np.testing.assert_array_equal(got_q.view(np.uint32), want_q.view(np.uint32))
    np.testing.assert_array_equal(keys.view(np.uint32), want_keys.view(np.uint32))
    np.testing.assert_array_equal(values.view(np.uint32), want_values.view(np.uint32))
