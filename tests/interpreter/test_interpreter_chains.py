"""Element-wise chains (RMSNorm, SwiGLU, a scale between casts) run as one step in a fast plan.

Oracles: the plain plan (``fast=False``: every layer one by one in NumPy) on the same network,
and NumPy expressions of each chain written here. The chain computes the same float32
operations in the same order, so results agree within one float16 rounding (NumPy's own
summation order or ``exp`` may differ from the helper's where the arithmetic is otherwise the
same). ``chains.COUNTS`` shows the chain ran; a chain whose inner tensor something else reads
is left to the layers.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.compiled_helper import require_compiled_helper
from tests.support.interpreter_support import Net, rand
from tests.support.tiny_models import TINY_GQA
from trt_kv._trt import trt
from trt_kv.errors import DTypeError, ShapeError
from trt_kv.interpreter import chains, compile_network
from trt_kv.models.layers.graph import Graph
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.models.llama.norm_mlp import rms_norm

EPS = 1e-5
_NP = {"float16": np.float16, "float32": np.float32}


@pytest.fixture(autouse=True)
def _compiled():
    require_compiled_helper()


def _close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    """Equal within one rounding of ``dtype`` (float16: 2^-10 relative; float32: 2^-22); in
    float16 all but a few elements the same bits (a rounding the chain skipped or added
    would move about half of them)."""
    rtol = 2.0**-10 if dtype == "float16" else 2.0**-22
    if dtype == "float16":
        assert np.mean(got == want) >= 0.97
    got, want = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 2.0**-14)


def _norm_net(dtype: str, width: int, *, weight: bool = True, mean_out: bool = False) -> Net:
    """RMSNorm of ``x [B, S, width]`` as the Llama network states it; ``mean_out`` also marks
    the chain's mean as an output (something else reads an inner tensor)."""
    net = Net()
    g = Graph(net.network, dtype)
    x = net.input("x", dtype, (-1, -1, width))
    w = rand(width, seed=2, dtype=dtype) if weight else None
    if w is None:  # the chain up to ``x / r`` (no cast, no weight): a float32 output
        x32 = g.cast(x, "float32")
        sq = net.network.add_reduce(g.mul(x32, x32), trt.ReduceOperation.AVG, 1 << 2, True)
        var = g.add(sq.get_output(0), g.const(np.full((1, 1, 1), EPS), "float32"))
        rms = net.network.add_unary(var, trt.UnaryOperation.SQRT).get_output(0)
        y = g.eltwise(x32, rms, trt.ElementWiseOperation.DIV)
    else:
        y = rms_norm(g, x, w, EPS)
    net.mark(y)
    if mean_out:
        layers = [net.network.get_layer(i) for i in range(net.network.num_layers)]
        [mean] = [layer for layer in layers if layer.type == trt.LayerType.REDUCE]
        net.mark(mean.get_output(0), "mean")
    net.weight = w
    return net


def _expected_norm(x: np.ndarray, w: np.ndarray | None, dtype: str) -> np.ndarray:
    x32 = x.astype(np.float32)
    r = np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + np.float32(EPS))
    y = x32 / r
    if w is None:
        return y
    return (y.astype(_NP[dtype]).astype(np.float32) * w.astype(np.float32)).astype(_NP[dtype])


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("width", [1, 7, 8, 64, 130, 576])
def test_rms_norm_runs_as_one_call_and_equals_the_layers(dtype, width):
    net = _norm_net(dtype, width)
    feed = {"x": rand(2, 3, width, seed=1, dtype=dtype) * 3}
    fast, plain = compile_network(net.network), compile_network(net.network, fast=False)
    before = chains.COUNTS["rms_norm"]
    got = fast.run(feed)["out"]
    assert chains.COUNTS["rms_norm"] - before == 1
    assert got.dtype == _NP[dtype] and got.shape == (2, 3, width)
    _close(got, plain.run(feed)["out"], dtype)
    _close(got, _expected_norm(feed["x"], net.weight, dtype), dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_residual_add_and_its_rms_norm_run_as_one_step(dtype):
    """``h = a + b`` (read again later: the residual stream) and the RMSNorm of ``h``: one
    step giving both, at the add's place."""
    net = Net()
    g = Graph(net.network, dtype)
    a, b = (net.input(name, dtype, (-1, -1, 64)) for name in ("a", "b"))
    h = g.add(a, b)
    w = rand(64, seed=12, dtype=dtype)
    net.mark(rms_norm(g, h, w, EPS))
    net.mark(g.add(h, a), "later")  # another reader of the sum
    feed = {"a": rand(2, 3, 64, seed=10, dtype=dtype), "b": rand(2, 3, 64, seed=11, dtype=dtype)}
    fast, plain = compile_network(net.network), compile_network(net.network, fast=False)
    before = chains.COUNTS["rms_norm"]
    got = fast.run(feed)
    assert chains.COUNTS["rms_norm"] - before == 1
    want = plain.run(feed)
    h = (feed["a"].astype(np.float32) + feed["b"].astype(np.float32)).astype(_NP[dtype])
    assert np.array_equal(got["later"], want["later"])  # the sum: one exact add, one rounding
    _close(got["out"], want["out"], dtype)
    _close(got["out"], _expected_norm(h, w, dtype), dtype)


def test_rms_norm_without_its_weight_gives_the_float32_rows():
    net = _norm_net("float16", 64, weight=False)
    feed = {"x": rand(1, 2, 64, seed=3, dtype="float16")}
    before = chains.COUNTS["rms_norm"]
    got = compile_network(net.network).run(feed)["out"]
    assert chains.COUNTS["rms_norm"] - before == 1 and got.dtype == np.float32
    _close(got, _expected_norm(feed["x"], None, "float32"), "float32")


def test_a_chain_whose_mean_is_an_output_runs_its_layers():
    net = _norm_net("float16", 64, mean_out=True)
    feed = {"x": rand(1, 2, 64, seed=4, dtype="float16")}
    before = chains.COUNTS["rms_norm"]
    out = compile_network(net.network).run(feed)
    assert chains.COUNTS["rms_norm"] == before
    _close(out["out"], _expected_norm(feed["x"], net.weight, "float16"), "float16")
    x32 = feed["x"].astype(np.float32)
    _close(out["mean"], np.mean(x32 * x32, axis=-1, keepdims=True), "float32")


def _swiglu_net(dtype: str) -> Net:
    """``gate * sigmoid(gate) * up`` as the Llama network's gated MLP states it."""
    net = Net()
    g = Graph(net.network, dtype)
    gate, up = (net.input(name, dtype, (-1, 40)) for name in ("gate", "up"))
    sig = net.network.add_activation(gate, trt.ActivationType.SIGMOID).get_output(0)
    net.mark(g.mul(g.mul(gate, sig), up))
    return net


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_swiglu_runs_as_one_call_and_equals_the_layers(dtype):
    net = _swiglu_net(dtype)
    feed = {"gate": rand(3, 40, seed=5, dtype=dtype) * 4, "up": rand(3, 40, seed=6, dtype=dtype)}
    fast, plain = compile_network(net.network), compile_network(net.network, fast=False)
    before = chains.COUNTS["swiglu"]
    got = fast.run(feed)["out"]
    assert chains.COUNTS["swiglu"] - before == 1 and got.dtype == _NP[dtype]
    _close(got, plain.run(feed)["out"], dtype)
    g32, u32, t = feed["gate"].astype(np.float32), feed["up"].astype(np.float32), _NP[dtype]
    s = (1 / (1 + np.exp(-g32))).astype(t).astype(np.float32)
    _close(got, ((g32 * s).astype(t).astype(np.float32) * u32).astype(t), dtype)


@pytest.mark.parametrize("dtype", ["float16"])  # a float32 network has no casts there
def test_a_scale_between_casts_runs_as_one_step(dtype):
    """``x`` cast to float32, times 0.125, cast back (the query's 1/sqrt(H))."""
    net = Net()
    g = Graph(net.network, dtype)
    x = net.input("x", dtype, (-1, 9, -1, 64))
    scaled = g.mul(g.cast(x, "float32"), g.const(np.full((1, 1, 1, 1), 0.125), "float32"))
    net.mark(g.cast(scaled, dtype))
    feed = {"x": rand(2, 9, 3, 64, seed=9, dtype=dtype) * 7}
    before = chains.COUNTS["scale"]
    got = compile_network(net.network).run(feed)["out"]
    assert chains.COUNTS["scale"] - before == 1 and got.dtype == _NP[dtype]
    want = (feed["x"].astype(np.float32) * np.float32(0.125)).astype(_NP[dtype])
    assert np.array_equal(got, want)  # one exact product, one rounding: the same bits


def test_a_tiny_llama_decode_step_runs_every_norm_and_mlp_as_one_call():
    """Two norms a layer and the final one; one SwiGLU a layer; logits as the plain plan's
    (test_interpreter_fast compares whole networks on every route)."""
    net = build_llama_network(
        TINY_GQA, random_weights(TINY_GQA, seed=1), max_seq_len=8, max_batch=1, dtype="float16"
    )
    fast, plain = compile_network(net.network), compile_network(net.network, fast=False)
    shape = (1, TINY_GQA.num_key_value_heads, 8, TINY_GQA.head_dim)
    feed = {
        "input_ids": np.array([[3]], np.int32),
        "position_ids": np.zeros((1, 1), np.int64),
        "write_indices": np.zeros(1, np.int32),
        "last_token_rows": np.zeros(1, np.int32),
    }
    feeds = {
        kind: feed | {n: np.zeros(shape, np.float16) for n in plan.input_names if "past" in n}
        for kind, plan in (("fast", fast), ("plain", plain))
    }
    before = dict(chains.COUNTS)
    got = fast.run(feeds["fast"])["logits"]
    layers = TINY_GQA.num_hidden_layers
    assert chains.COUNTS["rms_norm"] - before.get("rms_norm", 0) == 2 * layers + 1
    assert chains.COUNTS["swiglu"] - before.get("swiglu", 0) == layers
    assert chains.COUNTS["scale"] - before.get("scale", 0) == layers  # the query's 1/sqrt(H)
    want = plain.run(feeds["plain"])["logits"]
    np.testing.assert_allclose(got, want, rtol=4e-3, atol=4e-3 * np.abs(want).max())


def test_the_chain_calls_refuse_what_they_do_not_compute():
    x = rand(2, 8)
    with pytest.raises(DTypeError, match="x"):
        chains.rms_norm(x.astype(np.float64), EPS, None, 0)
    with pytest.raises(ShapeError, match="w"):
        chains.rms_norm(x, EPS, rand(7), 0)
    with pytest.raises(DTypeError, match="up"):
        chains.swiglu(x, x.astype(np.float16), 0)


def test_swiglu_broadcasts_its_inputs_as_the_layers_do():
    gate, up = rand(3, 8, seed=7), rand(1, 8, seed=8)
    s = 1 / (1 + np.exp(-gate))
    _close(chains.swiglu(gate, up, 0), gate * s * up, "float32")
