"""Pointwise layers: elementwise, unary, activation, select, cast, identity.

Inputs arrive with floats in the compute dtype; outputs are rounded to their declared dtype
by the executor, so a cast is the identity here and only the executor's rounding acts.
"""

from __future__ import annotations

import math

import numpy as np

from trt_kv._trt import trt
from trt_kv.interpreter import half, native
from trt_kv.interpreter.registry import Array, Context, Inputs, handles

_E = trt.ElementWiseOperation
_U = trt.UnaryOperation
_A = trt.ActivationType

_erf_scalar = np.frompyfunc(math.erf, 1, 1)


def erf(x: Array) -> Array:
    """Gauss error function, exact to float64 (NumPy has none; SciPy is not a dependency)."""
    return _erf_scalar(x).astype(x.dtype)


def _div(a: Array, b: Array) -> Array:
    # Integer DIV truncates toward zero (C semantics, as in TensorRT's CUDA kernels and ONNX);
    # open question until checked on a GPU (docs/gpu-results.md).
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) ^ (b < 0), -q, q)
    return a / b


def _floor_div(a: Array, b: Array) -> Array:
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return np.floor_divide(a, b)
    return np.floor(a / b)


_BINARY = {
    _E.SUM: np.add,
    _E.PROD: np.multiply,
    _E.MAX: np.maximum,
    _E.MIN: np.minimum,
    _E.SUB: np.subtract,
    _E.DIV: _div,
    _E.POW: np.power,
    _E.FLOOR_DIV: _floor_div,
    _E.AND: np.logical_and,
    _E.OR: np.logical_or,
    _E.XOR: np.logical_xor,
    _E.EQUAL: np.equal,
    _E.GREATER: np.greater,
    _E.LESS: np.less,
}

_UNARY = {
    _U.EXP: np.exp,
    _U.LOG: np.log,
    _U.SQRT: np.sqrt,
    _U.RECIP: np.reciprocal,
    _U.ABS: np.abs,
    _U.NEG: np.negative,
    _U.SIN: np.sin,
    _U.COS: np.cos,
    _U.TAN: np.tan,
    _U.SINH: np.sinh,
    _U.COSH: np.cosh,
    _U.ASIN: np.arcsin,
    _U.ACOS: np.arccos,
    _U.ATAN: np.arctan,
    _U.ASINH: np.arcsinh,
    _U.ACOSH: np.arccosh,
    _U.ATANH: np.arctanh,
    _U.CEIL: np.ceil,
    _U.FLOOR: np.floor,
    _U.ERF: erf,
    _U.NOT: np.logical_not,
    _U.SIGN: np.sign,
    _U.ROUND: np.rint,  # round half to even, as documented
    _U.ISINF: np.isinf,
    _U.ISNAN: np.isnan,
}


@handles(trt.LayerType.ELEMENTWISE, trt.IElementWiseLayer)
def elementwise(layer: object, ctx: Context) -> object:
    """``op(a, b)`` with NumPy broadcasting (TensorRT's: equal ranks, size-1 axes stretch)."""
    op = ctx.pick(_BINARY, layer.op, "op")
    if layer.op == _E.POW:
        return lambda x: np.power(x[0], x[1]) if x[0].dtype.kind == "f" else _int_pow(x)
    return lambda x: op(x[0], x[1])


def _int_pow(x: Inputs) -> Array:
    a, b = x
    return np.power(a.astype(np.float64), b.astype(np.float64))


@handles(trt.LayerType.UNARY, trt.IUnaryLayer)
def unary(layer: object, ctx: Context) -> object:
    """``op(x)``; ISINF/ISNAN give bool, NOT takes and gives bool."""
    op = ctx.pick(_UNARY, layer.op, "op")
    return lambda x: op(x[0])


def _sigmoid(x: Array) -> Array:
    """``1 / (1 + exp(-x))`` within 4 ulps; exp overflowing to inf (x < -88 in float32) gives
    the limit 0 (the true value is subnormal there). 20x faster than a logaddexp form."""
    with np.errstate(over="ignore"):
        e = np.exp(-x)
    e += 1
    return np.reciprocal(e, out=e)


def _activation(kind: object, alpha: float, beta: float) -> object:
    table = {
        _A.RELU: lambda x: np.maximum(x, 0),
        _A.SIGMOID: _sigmoid,
        _A.TANH: np.tanh,
        _A.LEAKY_RELU: lambda x: np.where(x >= 0, x, alpha * x),
        _A.ELU: lambda x: np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0))),
        _A.SELU: lambda x: np.where(x > 0, beta * x, beta * alpha * np.expm1(np.minimum(x, 0))),
        _A.SOFTSIGN: lambda x: x / (1 + np.abs(x)),
        _A.SOFTPLUS: lambda x: alpha * np.logaddexp(beta * x, 0),
        _A.CLIP: lambda x: np.maximum(alpha, np.minimum(beta, x)),
        _A.HARD_SIGMOID: lambda x: np.maximum(0, np.minimum(1, alpha * x + beta)),
        _A.SCALED_TANH: lambda x: alpha * np.tanh(beta * x),
        _A.THRESHOLDED_RELU: lambda x: np.where(x > alpha, x, 0),
        _A.GELU_ERF: lambda x: 0.5 * x * (1 + erf(x * math.sqrt(0.5))),
        _A.GELU_TANH: lambda x: (
            0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (0.044715 * x**3 + x)))
        ),
    }
    return table.get(kind)


@handles(trt.LayerType.ACTIVATION, trt.IActivationLayer)
def activation(layer: object, ctx: Context) -> object:
    """The documented activation formulas, with the layer's ``alpha`` and ``beta``. A fast
    float32 plan computes SIGMOID (SiLU's half) in the native helper where it is built."""
    alpha = ctx.compute.type(layer.alpha)
    beta = ctx.compute.type(layer.beta)
    fn = _activation(layer.type, alpha, beta)
    if fn is None:
        raise ctx.unsupported(f"activation {layer.type}")
    if layer.type == _A.SIGMOID and ctx.fast and half.NATIVE:
        fn = _fast_sigmoid
    return lambda x: fn(x[0])


def _fast_sigmoid(x: Array) -> Array:
    """:func:`_sigmoid` through the native helper for float32 arrays of ``_NATIVE_SIZE``
    elements or more (~4x faster there; within ~3 ulps, as NumPy's within 4)."""
    if x.dtype == np.float32 and x.size >= _NATIVE_SIZE:
        return native.sigmoid(x)
    return _sigmoid(x)


_NATIVE_SIZE = 4096  # below this, a call through ctypes costs more than NumPy's passes save


@handles(trt.LayerType.SELECT, trt.ISelectLayer)
def select(layer: object, ctx: Context) -> object:
    """``where(condition, then, else)`` with broadcasting."""
    return lambda x: np.where(x[0], x[1], x[2])


@handles(trt.LayerType.CAST, trt.ICastLayer)
def cast(layer: object, ctx: Context) -> object:
    """Identity here: the executor's cast to the declared dtype is the conversion
    (float -> int truncates toward zero, as TensorRT's Cast example shows: 4.5 -> 4)."""
    return lambda x: x[0]


@handles(trt.LayerType.IDENTITY, trt.IIdentityLayer)
def identity(layer: object, ctx: Context) -> object:
    """The input, converted to the output's declared dtype by the executor."""
    return lambda x: x[0]
