"""Interpreter: elementwise, unary, activation, select, cast and identity layers."""

from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest

from tests.support.interpreter_support import Net, rand
from trt_kv._trt import trt
from trt_kv.interpreter import execute

E = trt.ElementWiseOperation
U = trt.UnaryOperation
A = trt.ActivationType

X = np.array([[-2.5, -1.0, 0.5], [1.5, 3.0, 4.25]], np.float32)
Y = np.array([[2.0, -3.0, 0.5]], np.float32)  # broadcast over rows


def _binary(op: object, a: np.ndarray, b: np.ndarray, dtype: str = "float32") -> np.ndarray:
    net = Net()
    x = net.input("a", dtype, a.shape)
    y = net.const(b)
    net.mark(net.network.add_elementwise(x, y, op).get_output(0))
    return net.run({"a": a})["out"]


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (E.SUM, X + Y),
        (E.PROD, X * Y),
        (E.MAX, np.maximum(X, Y)),
        (E.MIN, np.minimum(X, Y)),
        (E.SUB, X - Y),
        (E.DIV, X / Y),
        (E.FLOOR_DIV, np.floor(X / Y)),
    ],
    ids=lambda v: str(v).rsplit(".", 1)[-1] if not isinstance(v, np.ndarray) else "",
)
def test_elementwise_float_op_broadcasts_like_numpy(op, expected):
    np.testing.assert_allclose(_binary(op, X, Y), expected, rtol=1e-6)


def test_elementwise_pow_raises_first_to_second():
    base = np.array([[1.5, 2.0, 3.0]], np.float32)
    exponent = np.array([[2.0, 0.5, -1.0]], np.float32)
    np.testing.assert_allclose(_binary(E.POW, base, exponent), base**exponent, rtol=1e-6)


@pytest.mark.parametrize(
    ("op", "expected"),
    [(E.EQUAL, X == Y), (E.GREATER, X > Y), (E.LESS, X < Y)],
    ids=["EQUAL", "GREATER", "LESS"],
)
def test_elementwise_comparison_gives_bool(op, expected):
    out = _binary(op, X, np.broadcast_to(Y, X.shape).copy())
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        (E.AND, np.array([True, False, False, False])),
        (E.OR, np.array([True, True, True, False])),
        (E.XOR, np.array([False, True, True, False])),
    ],
    ids=["AND", "OR", "XOR"],
)
def test_elementwise_logical_op_on_bools(op, expected):
    net = Net()
    a = net.input("a", "bool", (4,))
    b = net.input("b", "bool", (4,))
    net.mark(net.network.add_elementwise(a, b, op).get_output(0))
    feed = {"a": np.array([True, True, False, False]), "b": np.array([True, False, True, False])}
    np.testing.assert_array_equal(net.run(feed)["out"], expected)


def test_elementwise_integer_floor_div_rounds_down():
    a = np.array([7, -7, 7, -7], np.int32)
    b = np.array([2, 2, -2, -2], np.int32)
    out = _binary(E.FLOOR_DIV, a, b, "int32")
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [3, -4, -4, 3])


def test_elementwise_integer_div_truncates_toward_zero():
    a = np.array([7, -7, 7, -7], np.int64)
    b = np.array([2, 2, -2, -2], np.int64)
    np.testing.assert_array_equal(_binary(E.DIV, a, b, "int64"), [3, -3, -3, 3])


POSITIVE = np.array([0.25, 0.5, 0.9], np.float32)


@pytest.mark.parametrize(
    ("op", "x", "expected"),
    [
        (U.EXP, X, np.exp(X)),
        (U.LOG, POSITIVE, np.log(POSITIVE)),
        (U.SQRT, POSITIVE, np.sqrt(POSITIVE)),
        (U.RECIP, X, 1 / X),
        (U.ABS, X, np.abs(X)),
        (U.NEG, X, -X),
        (U.SIN, X, np.sin(X)),
        (U.COS, X, np.cos(X)),
        (U.TAN, POSITIVE, np.tan(POSITIVE)),
        (U.SINH, X, np.sinh(X)),
        (U.COSH, X, np.cosh(X)),
        (U.ASIN, POSITIVE, np.arcsin(POSITIVE)),
        (U.ACOS, POSITIVE, np.arccos(POSITIVE)),
        (U.ATAN, X, np.arctan(X)),
        (U.ASINH, X, np.arcsinh(X)),
        (U.ACOSH, 1 + POSITIVE, np.arccosh(1 + POSITIVE)),
        (U.ATANH, POSITIVE, np.arctanh(POSITIVE)),
        (U.CEIL, X, np.ceil(X)),
        (U.FLOOR, X, np.floor(X)),
        (U.ERF, X, np.vectorize(math.erf)(X)),
        (U.SIGN, X, np.sign(X)),
    ],
    ids=lambda v: str(v).rsplit(".", 1)[-1] if not isinstance(v, np.ndarray) else "",
)
def test_unary_float_op_matches_numpy(op, x, expected):
    net = Net()
    net.mark(net.network.add_unary(net.input("x", "float32", x.shape), op).get_output(0))
    np.testing.assert_allclose(net.run({"x": x})["out"], expected, rtol=1e-6, atol=1e-7)


def test_unary_round_goes_half_to_even():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.6], np.float32)
    net = Net()
    net.mark(net.network.add_unary(net.input("x", "float32", x.shape), U.ROUND).get_output(0))
    np.testing.assert_array_equal(net.run({"x": x})["out"], [-2, -2, -0, 0, 2, 2, 3])


@pytest.mark.parametrize(
    ("op", "expected"),
    [(U.ISINF, [False, True, True, False]), (U.ISNAN, [False, False, False, True])],
    ids=["ISINF", "ISNAN"],
)
def test_unary_isinf_isnan_give_bool(op, expected):
    x = np.array([1.0, np.inf, -np.inf, np.nan], np.float32)
    net = Net()
    net.mark(net.network.add_unary(net.input("x", "float32", x.shape), op).get_output(0))
    np.testing.assert_array_equal(net.run({"x": x})["out"], expected)


def test_unary_not_negates_bools():
    net = Net()
    net.mark(net.network.add_unary(net.input("x", "bool", (2,)), U.NOT).get_output(0))
    np.testing.assert_array_equal(net.run({"x": np.array([True, False])})["out"], [False, True])


Z = np.linspace(-4, 4, 17, dtype=np.float32)


@pytest.mark.parametrize(
    ("kind", "alpha", "beta", "expected"),
    [
        (A.RELU, 0, 0, np.maximum(Z, 0)),
        (A.SIGMOID, 0, 0, 1 / (1 + np.exp(-Z))),
        (A.TANH, 0, 0, np.tanh(Z)),
        (A.LEAKY_RELU, 0.1, 0, np.where(Z >= 0, Z, 0.1 * Z)),
        (A.ELU, 0.7, 0, np.where(Z >= 0, Z, 0.7 * (np.exp(Z) - 1))),
        (A.SELU, 1.5, 1.2, np.where(Z > 0, 1.2 * Z, 1.2 * (1.5 * np.exp(Z) - 1.5))),
        (A.SOFTSIGN, 0, 0, Z / (1 + np.abs(Z))),
        (A.SOFTPLUS, 2.0, 0.5, 2.0 * np.log(np.exp(0.5 * Z) + 1)),
        (A.CLIP, -1.0, 2.0, np.clip(Z, -1, 2)),
        (A.HARD_SIGMOID, 0.2, 0.5, np.clip(0.2 * Z + 0.5, 0, 1)),
        (A.SCALED_TANH, 1.7, 0.6, 1.7 * np.tanh(0.6 * Z)),
        (A.THRESHOLDED_RELU, 1.0, 0, np.where(Z > 1.0, Z, 0)),
        (A.GELU_ERF, 0, 0, 0.5 * Z * (1 + np.vectorize(math.erf)(Z / math.sqrt(2)))),
        (
            A.GELU_TANH,
            0,
            0,
            0.5 * Z * (1 + np.tanh(math.sqrt(2 / math.pi) * (Z + 0.044715 * Z**3))),
        ),
    ],
    ids=lambda v: str(v).rsplit(".", 1)[-1] if not isinstance(v, (np.ndarray, int, float)) else "",
)
def test_activation_follows_documented_formula(kind, alpha, beta, expected):
    net = Net()
    layer = net.network.add_activation(net.input("x", "float32", Z.shape), kind)
    layer.alpha, layer.beta = alpha, beta
    net.mark(layer.get_output(0))
    np.testing.assert_allclose(net.run({"x": Z})["out"], expected, rtol=1e-5, atol=1e-6)


def test_sigmoid_saturates_to_its_limits_without_warnings():
    x = np.array([-1e4, -100, -88, -20, 0, 20, 100, 1e4], np.float32)
    with np.errstate(over="ignore"):  # exp(1e4) is inf in float64 too: the limit 0
        expected = 1 / (1 + np.exp(-x.astype(np.float64)))
    net = Net()
    net.mark(
        net.network.add_activation(net.input("x", "float32", x.shape), A.SIGMOID).get_output(0)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = net.run({"x": x})["out"]
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-38)  # 0 where it is subnormal


@pytest.mark.parametrize("fast", [True, False])
def test_sigmoid_of_many_elements_is_within_four_ulps(fast):
    """8192 elements: a fast plan computes them in the native helper where it is built (its
    own exp, ~3 ulps), the plain plan with NumPy (up to 4); either is within 4 float32 ulps
    of float64, NaN stays NaN and the infinities give the limits."""
    x = np.random.default_rng(11).uniform(-30, 30, 8192).astype(np.float32)
    x[:5] = [np.nan, np.inf, -np.inf, 0.0, -100.0]
    net = Net()
    net.mark(
        net.network.add_activation(net.input("x", "float32", x.shape), A.SIGMOID).get_output(0)
    )
    net.build({"x": x})
    out = execute(net.network, {"x": x}, fast=fast)["out"]
    np.testing.assert_array_equal(out[:5], [np.nan, 1.0, 0.0, 0.5, 0.0])
    expected = 1 / (1 + np.exp(-x[5:].astype(np.float64)))
    ulp = np.spacing(expected.astype(np.float32))
    assert (np.abs(out[5:] - expected) <= 4 * ulp).all()


def test_select_picks_then_where_condition_true():
    net = Net()
    cond = net.input("c", "bool", (2, 3))
    then = net.input("t", "float32", (2, 3))
    other = net.const(np.zeros((1, 3), np.float32))
    net.mark(net.network.add_select(cond, then, other).get_output(0))
    c = np.array([[True, False, True], [False, True, False]])
    t = rand(2, 3)
    np.testing.assert_array_equal(net.run({"c": c, "t": t})["out"], np.where(c, t, 0))


def test_cast_float_to_int_truncates_toward_zero():
    x = np.array([1.2, 4.5, 8.9, -1.7, -0.5], np.float32)
    net = Net()
    net.mark(net.network.add_cast(net.input("x", "float32", x.shape), trt.int32).get_output(0))
    out = net.run({"x": x})["out"]
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [1, 4, 8, -1, 0])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cast_to_half_precision_rounds_to_nearest(dtype):
    x = rand(64, seed=3)
    net = Net()
    cast = net.network.add_cast(net.input("x", "float32", x.shape), getattr(trt, dtype))
    net.mark(cast.get_output(0))
    out = net.run({"x": x})["out"]
    np_dtype = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    assert out.dtype == np_dtype
    np.testing.assert_array_equal(out, x.astype(np_dtype))


def test_identity_passes_input_through():
    x = rand(2, 5)
    net = Net()
    net.mark(net.network.add_identity(net.input("x", "float32", x.shape)).get_output(0))
    np.testing.assert_array_equal(net.run({"x": x})["out"], x)
