"""Interpreter: matrix multiply, reduce, softmax and normalization layers."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.interpreter_support import Net, rand
from trt_kv._trt import trt

M = trt.MatrixOperation
R = trt.ReduceOperation


def _matmul(a: np.ndarray, op0: object, b: np.ndarray, op1: object) -> np.ndarray:
    net = Net()
    x = net.input("a", "float32", a.shape)
    y = net.input("b", "float32", b.shape)
    net.mark(net.network.add_matrix_multiply(x, op0, y, op1).get_output(0))
    return net.run({"a": a, "b": b})["out"]


def test_matmul_matrices():
    a, b = rand(3, 4, seed=1), rand(4, 5, seed=2)
    np.testing.assert_allclose(_matmul(a, M.NONE, b, M.NONE), a @ b, rtol=1e-5)


def test_matmul_transpose_second_like_a_linear_layer():
    x, w = rand(2, 3, 4, seed=1), rand(1, 5, 4, seed=2)  # w: [1, Out, In]
    np.testing.assert_allclose(
        _matmul(x, M.NONE, w, M.TRANSPOSE), x @ w.transpose(0, 2, 1), rtol=1e-5
    )


def test_matmul_transpose_first():
    a, b = rand(4, 3, seed=1), rand(4, 5, seed=2)
    np.testing.assert_allclose(_matmul(a, M.TRANSPOSE, b, M.NONE), a.T @ b, rtol=1e-5)


def test_matmul_broadcasts_batch_axes():
    a, b = rand(2, 1, 3, 4, seed=1), rand(1, 3, 4, 2, seed=2)
    out = _matmul(a, M.NONE, b, M.NONE)
    assert out.shape == (2, 3, 3, 2)
    np.testing.assert_allclose(out, np.einsum("bxik,xykj->byij", a, b[0:1]), rtol=1e-5)


def test_matmul_matrix_times_vector_gives_vector():
    a, v = rand(2, 3, 4, seed=1), rand(2, 4, seed=2)
    np.testing.assert_allclose(
        _matmul(a, M.NONE, v, M.VECTOR), np.einsum("bij,bj->bi", a, v), rtol=1e-5
    )


def test_matmul_vector_times_matrix_gives_vector():
    v, b = rand(2, 3, seed=1), rand(2, 3, 5, seed=2)
    np.testing.assert_allclose(
        _matmul(v, M.VECTOR, b, M.NONE), np.einsum("bi,bij->bj", v, b), rtol=1e-5
    )


def test_matmul_vector_times_vector_gives_scalar_per_batch():
    u, v = rand(3, 4, seed=1), rand(3, 4, seed=2)
    np.testing.assert_allclose(_matmul(u, M.VECTOR, v, M.VECTOR), (u * v).sum(-1), rtol=1e-5)


X = rand(2, 3, 4, seed=5)


@pytest.mark.parametrize(
    ("op", "axes", "keep", "expected"),
    [
        (R.SUM, 0b100, False, X.sum(2)),
        (R.PROD, 0b010, True, X.prod(1, keepdims=True)),
        (R.MAX, 0b101, False, X.max((0, 2))),
        (R.MIN, 0b001, True, X.min(0, keepdims=True)),
        (R.AVG, 0b110, False, X.mean((1, 2))),
    ],
    ids=["SUM", "PROD", "MAX", "MIN", "AVG"],
)
def test_reduce_over_axes_bitmask(op, axes, keep, expected):
    net = Net()
    net.mark(
        net.network.add_reduce(net.input("x", "float32", X.shape), op, axes, keep).get_output(0)
    )
    out = net.run({"x": X})["out"]
    assert out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=1e-5)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_along_bitmask_axis(axis):
    net = Net()
    layer = net.network.add_softmax(net.input("x", "float32", X.shape))
    layer.axes = 1 << axis
    net.mark(layer.get_output(0))
    e = np.exp(X - X.max(axis, keepdims=True))
    np.testing.assert_allclose(net.run({"x": X})["out"], e / e.sum(axis, keepdims=True), rtol=1e-5)


def test_normalization_is_layer_norm_over_last_axis():
    x = rand(2, 3, 8, seed=7)
    scale, bias = rand(1, 1, 8, seed=8), rand(1, 1, 8, seed=9)
    net = Net()
    layer = net.network.add_normalization_v2(
        net.input("x", "float32", x.shape), net.const(scale), net.const(bias), 1 << 2
    )
    layer.epsilon = 1e-3
    net.mark(layer.get_output(0))
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(var + 1e-3) * scale + bias
    np.testing.assert_allclose(net.run({"x": x})["out"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("op", [trt.TopKOperation.MAX, trt.TopKOperation.MIN])
def test_top_k_best_first_ties_to_the_lowest_index(k, op):
    x = np.array([[1, 5, 2, 5, 0, 5], [4, 4, 4, 4, 4, 4], [0, 1, 0, 3, -2, -2]], np.float32)
    net = Net()
    layer = net.network.add_topk(net.input("x", "float32", x.shape), op, k, 1 << 1)
    net.mark(layer.get_output(0), "values")
    net.mark(layer.get_output(1), "ids")
    out = net.run({"x": x})
    largest = op == trt.TopKOperation.MAX
    want = {  # by hand: best first, equal values in index order
        (True, 1): [[1], [0], [3]],
        (True, 3): [[1, 3, 5], [0, 1, 2], [3, 1, 0]],
        (False, 1): [[4], [0], [4]],
        (False, 3): [[4, 0, 2], [0, 1, 2], [4, 5, 0]],
    }[largest, k]
    assert out["ids"].dtype == np.int32 and out["ids"].tolist() == want
    np.testing.assert_array_equal(out["values"], np.take_along_axis(x, np.array(want), 1))
