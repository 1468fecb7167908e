"""The NumPy reference computes in the dtype it is given: every float array the Llama forward
produces, down to the last temporary, is float32 when weights and caches are float32.

Checked by tracing, not by reading the code: weights and caches are a ndarray subclass that
records the dtype of every array derived from it (ufunc results, NumPy function results,
views, casts and index results) and passes the tracing on to what it produces. A single
float64 scalar anywhere (NumPy 2 promotes ``float32_array * np.float64(x)`` to float64)
shows up as a float64 entry.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from tests.support.tiny_models import TINY_GQA
from trt_kv.models.llama import random_weights
from trt_kv.models.llama.reference import empty_caches, forward
from trt_kv.models.llama.weights import LayerWeights, LlamaWeights
from trt_kv.reference import attention


class Traced(np.ndarray):
    """An array whose descendants are all Traced, each recorded in ``Traced.log``."""

    log: ClassVar[list[tuple[str, np.dtype]]] = []

    def __array_finalize__(self, obj: object) -> None:  # views, casts, indexing
        Traced.log.append(("array", self.dtype))

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [np.asarray(a) if isinstance(a, Traced) else a for a in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(a) for a in kwargs["out"])
        if isinstance(kwargs.get("where"), Traced):
            kwargs["where"] = np.asarray(kwargs["where"])
        return _traced(f"{ufunc.__name__}.{method}", getattr(ufunc, method)(*plain, **kwargs))

    def __array_function__(self, func, types, args, kwargs):
        return _traced(func.__name__, super().__array_function__(func, types, args, kwargs))


def _traced(what: str, result: object) -> object:
    if isinstance(result, tuple):
        return tuple(_traced(what, r) for r in result)
    if isinstance(result, np.ndarray):
        Traced.log.append((what, result.dtype))
        return result if isinstance(result, Traced) else result.view(Traced)
    if isinstance(result, np.generic):
        Traced.log.append((what, result.dtype))
    return result


def _trace(weights: LlamaWeights) -> LlamaWeights:
    t = lambda a: None if a is None else a.view(Traced)  # noqa: E731
    layers = [LayerWeights(**{k: t(v) for k, v in vars(lw).items()}) for lw in weights.layers]
    return LlamaWeights(t(weights.embed), layers, t(weights.final_norm), t(weights.lm_head))


def _float_dtypes() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for what, dtype in Traced.log:
        if dtype.kind == "f":
            found.setdefault(dtype.name, set()).add(what)
    return found


def test_tracer_sees_a_float64_scalar_widening_a_float32_array():
    """The check below can fail: one NumPy float64 scalar is caught."""
    Traced.log.clear()
    x = np.ones((2, 3), np.float32).view(Traced)
    y = np.where(x > 0, x, 0.0) * (1.0 / np.sqrt(np.float32(4)).astype(np.float64))
    assert y.dtype == np.float64
    assert "float64" in _float_dtypes()


def test_every_float_intermediate_of_prefill_and_decode_is_float32():
    cfg = TINY_GQA
    weights = _trace(random_weights(cfg, seed=3))
    caches = [(k.view(Traced), v.view(Traced)) for k, v in empty_caches(cfg, 2, 12)]
    Traced.log.clear()
    ids = np.array([[3, 5, 7], [9, 2, 0]])
    positions = np.array([[0, 1, 2], [0, 1, 2]])
    logits = forward(
        cfg, weights, ids, positions, caches, np.array([0, 0]), np.array([3, 2], np.int32)
    )
    logits_decode = forward(
        cfg,
        weights,
        np.array([[11], [13]]),
        np.array([[3], [2]]),
        caches,
        np.array([3, 2]),
        np.array([4, 3], np.int32),
    )
    assert logits.dtype == logits_decode.dtype == np.float32
    assert len(Traced.log) > 100  # the whole forward was traced, not just its inputs
    assert set(_float_dtypes()) == {"float32"}, _float_dtypes()


def test_attention_default_scale_keeps_float32():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 3, 8)).astype(np.float32).view(Traced)
    k, v = (rng.standard_normal((1, 2, 5, 8)).astype(np.float32).view(Traced) for _ in "kv")
    Traced.log.clear()
    out = attention(q, k, v, causal="upper_left", kv_lengths=np.array([4]))
    assert out.dtype == np.float32
    assert set(_float_dtypes()) == {"float32"}, _float_dtypes()


def test_linear_is_the_float64_product_on_both_sides_of_its_row_threshold():
    """Up to ``_FEW_ROWS`` rows (a decode step) the reference multiplies as ``(W x^T)^T``, more
    as ``x W^T``: either way float32 in, float32 out, ``[..., Out]``, within float32 rounding
    of the float64 product."""
    from trt_kv.reference import ops

    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 40)).astype(np.float32)
    for rows in (1, ops._FEW_ROWS, ops._FEW_ROWS + 1, 64):
        x = rng.standard_normal((1, rows, 40)).astype(np.float32)
        out = ops.linear(x, w)
        expected = x.astype(np.float64) @ w.astype(np.float64).T
        bound = 2 * 40 * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w).T)
        assert out.dtype == np.float32 and out.shape == (1, rows, 48)
        assert (np.abs(out - expected) <= bound).all()
