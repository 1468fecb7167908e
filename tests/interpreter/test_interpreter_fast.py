"""Interpreter fast paths against the plain kernels, on the same networks.

``compile_network(network)`` (fast) reads only the cache rows below the largest
key_value_length in attention, runs a matrix product against a shared weight as one
``[rows, K] @ [K, N]`` product (one row as a dot product per weight row, a few rows in
blocks of weight rows) and drops every intermediate after its last reader;
``compile_network(network, fast=False)`` runs the plain kernels. Both execute every layer:
results agree within the compute dtype's rounding (float32: a few ulps, from BLAS summation
order), and NaN in unwritten cache rows stays out of both.
"""

from __future__ import annotations

import tracemalloc
from dataclasses import replace

import numpy as np
import pytest

from tests.support.interpreter_support import Net, rand
from tests.support.tiny_models import TINY_GQA
from trt_kv._trt import trt
from trt_kv.builder.model_caches import cache_names
from trt_kv.builder.routes import Routes
from trt_kv.errors import ArgumentError
from trt_kv.interpreter import compile_network
from trt_kv.models.family import FULL, SLIDING
from trt_kv.models.llama import build_llama_network, random_weights

S_MAX = 24
M = trt.MatrixOperation
E = trt.ElementWiseOperation


def _caches(dtype: str) -> dict[str, np.ndarray]:
    """Every cache ``[2, N_kv, S_MAX, H]`` filled with NaN: unwritten rows hold NaN."""
    shape = (2, TINY_GQA.num_key_value_heads, S_MAX, TINY_GQA.head_dim)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    return {
        name: np.full(shape, np.nan, np_dtype)
        for i in range(TINY_GQA.num_hidden_layers)
        for name in cache_names(i)[:2]
    }


# Ragged prefill (3 and 2 tokens), a second prefill chunk, then decode steps.
STEPS = [
    ([[3, 5, 7], [9, 2, 0]], [[0, 1, 2], [0, 1, 2]], [0, 0], [3, 2], [2, 4]),
    ([[4, 6], [8, 1]], [[3, 4], [2, 3]], [3, 2], [5, 4], [1, 3]),
    ([[11], [13]], [[5], [4]], [5, 4], [6, 5], [0, 1]),
    ([[12], [10]], [[6], [5]], [6, 5], [7, 6], [0, 1]),
]


# A window of 3 on layer 0 (layer 1 full): the steps below move keys out of it.
WINDOWED = replace(TINY_GQA, sliding_window=3, layer_types=(SLIDING, FULL))
ROUTES = {  # name -> (config, routes)
    "mask_only": (TINY_GQA, Routes()),  # attention bounded by the causal mask alone
    "key_value_lengths": (TINY_GQA, Routes(key_value_lengths=True)),
    "primitive": (TINY_GQA, Routes(attention="primitive")),  # matmuls and softmax layers
    "rope_elementwise": (TINY_GQA, Routes(rope="elementwise")),  # gather + pointwise RoPE
    "sliding_window": (WINDOWED, Routes()),
    "sliding_window_primitive": (WINDOWED, Routes(attention="primitive")),
}


@pytest.mark.parametrize(("config", "routes"), list(ROUTES.values()), ids=list(ROUTES))
@pytest.mark.parametrize(("dtype", "rtol"), [("float32", 1e-6), ("float16", 4e-3)])
def test_llama_network_fast_and_plain_agree_and_keep_nan_out(dtype, rtol, config, routes):
    """float32: a few ulps (BLAS summation order). float16 networks round every tensor, so a
    last-bit float32 difference before a rounding can move that tensor by one float16 ulp
    (~1e-3 relative): the tolerance allows a few of them."""
    caches = _run_fast_and_plain(_network(config, dtype, 2, routes), dtype, rtol, STEPS)
    final = np.array(STEPS[-1][3])
    for name in caches["fast"]:
        fast, plain = caches["fast"][name], caches["plain"][name]
        for b, n in enumerate(final):
            assert np.isnan(fast[b, :, n:]).all() and np.isnan(plain[b, :, n:]).all()
            np.testing.assert_allclose(fast[b, :, :n], plain[b, :, :n], rtol=rtol, atol=rtol)


def _network(config: object, dtype: str, batch: int, routes: Routes | None = None) -> object:
    """The tiny Llama network (S_max 24, steps of up to 4 tokens, seeded weights)."""
    return build_llama_network(
        config,
        random_weights(config, seed=5),
        max_seq_len=S_MAX,
        max_batch=batch,
        max_step_tokens=4,
        dtype=dtype,
        routes=routes,
    )


def step_feed(plan: object, caches: dict[str, np.ndarray], step: tuple) -> dict[str, np.ndarray]:
    """The feed of one of STEPS (ids, positions, write indices, lengths, last-token rows) on
    ``caches``, with the inputs ``plan`` has (key_value_lengths is a route)."""
    ids, positions, write, lengths, rows = step
    feed = {
        **caches,
        "input_ids": np.array(ids, np.int32),
        "position_ids": np.array(positions, np.int64),
        "write_indices": np.array(write, np.int32),
        "key_value_lengths": np.array(lengths, np.int32),
        "last_token_rows": np.array(rows, np.int32),
    }
    return {k: v for k, v in feed.items() if k in plan.input_names}


def _run_fast_and_plain(net: object, dtype: str, rtol: float, steps: list) -> dict:
    """Run ``steps`` (ids, positions, write indices, lengths, last-token rows) on a fast and a
    plain plan of ``net``, each on its own NaN-filled caches; assert finite logits that agree
    within ``rtol`` of their scale; return the caches by plan kind."""
    plans = {
        "fast": compile_network(net.network),
        "plain": compile_network(net.network, fast=False),
    }
    batch = len(steps[0][0])
    caches = {kind: {k: v[:batch].copy() for k, v in _caches(dtype).items()} for kind in plans}
    for step in steps:
        logits = {
            kind: plan.run(step_feed(plan, caches[kind], step))["logits"]
            for kind, plan in plans.items()
        }
        assert np.isfinite(logits["fast"]).all()
        scale = float(np.abs(logits["plain"]).max())
        np.testing.assert_allclose(logits["fast"], logits["plain"], rtol=rtol, atol=rtol * scale)
    return caches


def _linear_net(transpose: bool) -> Net:
    """``x [B, S, 16] @ W`` with W a constant ``[1, 16, 12]`` (or ``[1, 12, 16]`` read
    transposed, as the Llama network stores ``nn.Linear`` weights)."""
    net = Net()
    x = net.input("x", "float32", (-1, -1, 16))
    w = rand(1, 12, 16, seed=1) if transpose else rand(1, 16, 12, seed=1)
    op = M.TRANSPOSE if transpose else M.NONE
    net.mark(net.network.add_matrix_multiply(x, M.NONE, net.const(w), op).get_output(0))
    net.weight = w[0].T if transpose else w[0]
    return net


@pytest.mark.parametrize("transpose", [False, True], ids=["plain_weight", "transposed_weight"])
def test_matrix_multiply_against_a_shared_weight_fast_and_plain_agree(transpose):
    net = _linear_net(transpose)
    x = rand(5, 3, 16, seed=2)
    net.build({"x": x})
    fast = compile_network(net.network).run({"x": x})["out"]
    plain = compile_network(net.network, fast=False).run({"x": x})["out"]
    expected = np.einsum("bsk,kn->bsn", x.astype(np.float64), net.weight.astype(np.float64))
    np.testing.assert_allclose(fast, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fast, plain, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 16, 17])
def test_product_with_a_row_major_weight_fast_and_plain_agree(rows):
    """``x [rows, 333] @ W^T`` with W ``[1000, 333]`` read transposed (an ``nn.Linear``
    weight, large enough for the fast paths): one row runs as a dot product per row of W,
    2..16 rows in blocks of W's rows (5 rows: blocks of 384, the last one of 232; up to 8
    rows each block is read once before its product), 17 as one product. Within float32
    rounding of the plain plan and of float64."""
    net = Net()
    x = net.input("x", "float32", (-1, 333))
    w = rand(1000, 333, seed=16)
    product = net.network.add_matrix_multiply(x, M.NONE, net.const(w), M.TRANSPOSE)
    net.mark(product.get_output(0))
    feed = {"x": rand(rows, 333, seed=17)}
    net.build(feed)
    fast = compile_network(net.network).run(feed)["out"]
    plain = compile_network(net.network, fast=False).run(feed)["out"]
    assert fast.shape == (rows, 1000) and fast.flags.c_contiguous
    expected = feed["x"].astype(np.float64) @ w.T.astype(np.float64)
    scale = np.abs(feed["x"]) @ np.abs(w.T)  # float32 rounding is relative to this sum
    assert (np.abs(fast - expected) <= 1e-6 * scale).all()
    assert (np.abs(fast - plain) <= 1e-6 * scale).all()


def test_one_row_products_stacked_or_alone_give_the_same_bits():
    """Q and K products of one row ``x [1, 1, 320]`` (weights ``[640, 320]``, ``[256, 320]``):
    the fast plan stacks them and runs one dot product per weight row; a network with the Q
    product alone runs it on its own. Each row's sum is the same either way: same bits, and
    within float32 rounding of float64."""
    wq, wk = rand(1, 640, 320, seed=18), rand(1, 256, 320, seed=19)
    outs = {}
    for weights in ((wq, wk), (wq,)):
        net = Net()
        x = net.input("x", "float32", (1, 1, 320))
        for w, name in zip(weights, ("q", "k")):
            product = net.network.add_matrix_multiply(x, M.NONE, net.const(w), M.TRANSPOSE)
            net.mark(product.get_output(0), name)
        outs[len(weights)] = compile_network(net.network).run({"x": rand(1, 1, 320, seed=20)})
    np.testing.assert_array_equal(outs[2]["q"], outs[1]["q"])
    row = rand(1, 1, 320, seed=20)[0].astype(np.float64)
    np.testing.assert_allclose(outs[2]["k"][0], row @ wk[0].T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[2]["q"][0], row @ wq[0].T, rtol=1e-5, atol=1e-5)


def test_intermediates_are_dropped_after_their_last_reader():
    """A chain of 24 elementwise layers on a 1 MiB tensor peaks at a few live tensors, not 24."""
    net = Net()
    x = net.input("x", "float32", (256, 1024))
    t = x
    for i in range(24):
        one = net.const(np.full((1, 1), 1.0 + i, np.float32))
        t = net.network.add_elementwise(t, one, E.SUM).get_output(0)
    net.mark(t)
    plan = compile_network(net.network)
    feed = {"x": rand(256, 1024, seed=3)}
    plan.run(feed)  # warm
    tracemalloc.start()
    out = plan.run(feed)["out"]
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    np.testing.assert_allclose(out, feed["x"] + sum(1.0 + i for i in range(24)), rtol=1e-6)
    assert peak < 5 * 2**20, f"peak {peak / 2**20:.1f} MiB for 1 MiB tensors"


def test_wide_head_read_transposed_fast_and_plain_agree():
    """``x [8, 512] @ W^T`` with W ``[2048, 512]`` stored as is (an embedding tied to the
    head): the fast plan runs it in blocks of W's rows; same values within float32
    rounding."""
    net = Net()
    x = net.input("x", "float32", (-1, 512))
    w = rand(2048, 512, seed=7)
    product = net.network.add_matrix_multiply(x, M.NONE, net.const(w), M.TRANSPOSE)
    net.mark(product.get_output(0))
    feed = {"x": rand(8, 512, seed=8)}
    net.build(feed)
    fast = compile_network(net.network).run(feed)["out"]
    plain = compile_network(net.network, fast=False).run(feed)["out"]
    expected = feed["x"].astype(np.float64) @ w.T.astype(np.float64)
    scale = np.abs(feed["x"]) @ np.abs(w.T)  # float32 rounding is relative to this sum
    assert (np.abs(fast - expected) <= 1e-6 * scale).all()
    assert (np.abs(fast - plain) <= 1e-6 * scale).all()


@pytest.mark.parametrize("rows", [1, 3])
def test_tied_embedding_gathered_and_read_transposed_fast_and_plain_agree(rows):
    """A vocabulary-sized table ``[32768, 512]`` gathered by token and tied to the head: the
    fast plan reads the one table for the gather and for products of one row (a dot product
    per table row) and of a few (blocks of table rows); gathered rows are exact, logits
    agree within float32 rounding."""
    net = Net()
    ids = net.input("ids", "int32", (-1,))
    table = net.const(rand(32768, 512, seed=9))
    x = net.network.add_gather(table, ids, 0).get_output(0)  # [rows, 512]
    net.mark(x, "rows")
    head = net.network.add_matrix_multiply(x, M.NONE, table, M.TRANSPOSE)
    net.mark(head.get_output(0), "logits")
    feed = {"ids": np.arange(5, 5 + 7 * rows, 7, dtype=np.int32)}
    net.build(feed)
    fast = compile_network(net.network).run(feed)
    plain = compile_network(net.network, fast=False).run(feed)
    w = rand(32768, 512, seed=9)
    np.testing.assert_array_equal(fast["rows"], w[feed["ids"]])
    scale = np.abs(w[feed["ids"]]) @ np.abs(w.T)
    assert (np.abs(fast["logits"] - plain["logits"]) <= 1e-6 * scale).all()
    expected = w[feed["ids"]].astype(np.float64) @ w.T.astype(np.float64)
    assert (np.abs(fast["logits"] - expected) <= 1e-6 * scale).all()


def test_float16_moves_and_pointwise_layers_fast_and_plain_agree_bit_for_bit():
    """``x * a + b`` then a transpose, a gather and a concatenation in float16, on 64 x 96
    elements (the bit recipes' sizes): the fast plan rounds on the bits and skips rounding
    the moves, whose elements are already float16; the plain plan casts every tensor."""
    net = Net()
    x = net.input("x", "float16", (64, 96))
    a, b = net.const(rand(64, 96, seed=10, dtype="float16")), net.const(rand(1, 96, seed=11))
    ax = net.network.add_elementwise(x, a, E.PROD).get_output(0)
    b16 = net.network.add_cast(b, trt.float16).get_output(0)
    y = net.network.add_elementwise(ax, b16, E.SUM).get_output(0)
    shuffle = net.network.add_shuffle(y)
    shuffle.first_transpose = (1, 0)
    rows = net.const(np.array([3, 0, 95, 3], np.int32), "int32")
    picked = net.network.add_gather(shuffle.get_output(0), rows, 0).get_output(0)  # [4, 64]
    net.mark(net.network.add_concatenation([picked, picked]).get_output(0))
    feed = {"x": rand(64, 96, seed=12, dtype="float16") * np.float16(300)}
    net.build(feed)
    fast = compile_network(net.network).run(feed)["out"]
    plain = compile_network(net.network, fast=False).run(feed)["out"]
    assert fast.dtype == np.float16 and fast.shape == (8, 64)
    np.testing.assert_array_equal(fast.view(np.uint16), plain.view(np.uint16))


@pytest.mark.parametrize(("dtype", "rtol"), [("float32", 1e-6), ("float16", 4e-3)])
def test_one_sequence_decode_fast_and_plain_agree(dtype, rtol):
    """Batch 1: decode steps have one row, so the fast plan runs each block's Q/K/V and
    gate/up products as one product against their joined matrices. Logits and every written
    cache row agree with the plain plan within the compute dtype's rounding, as in the
    batched test above."""
    net = _network(TINY_GQA, dtype, 1)
    prefill = ([[3, 5, 7]], [[0, 1, 2]], [0], [3], [2])
    decode = [([[t]], [[t]], [t], [t + 1], [0]) for t in (3, 4, 5)]
    caches = _run_fast_and_plain(net, dtype, rtol, [prefill, *decode])
    for name in caches["fast"]:
        fast, plain = caches["fast"][name][:, :, :6], caches["plain"][name][:, :, :6]
        np.testing.assert_allclose(fast, plain, rtol=rtol, atol=rtol)


def _ragged_attention(
    heads: tuple[int, int], sq: int, skv: int, h: int, short: int, seed: int
) -> tuple[Net, dict[str, np.ndarray]]:
    """IAttention of 2 sequences, ``heads`` (Nq, Nkv) GQA, ``sq`` query rows (the chunk's last
    tokens) over ``skv`` keys; the second sequence is ``short`` keys long and its keys past
    that hold NaN (masked by its mask row and key_value_length). A built network and a feed."""
    (nq, nkv), b = heads, 2
    net = Net()
    q, k, v = (net.input(n, "float32", s) for n, s in (("q", (b, nq, sq, h)),
               ("k", (b, nkv, skv, h)), ("v", (b, nkv, skv, h))))  # fmt: skip
    att = net.network.add_attention_v2(
        q, k, v, trt.AttentionNormalizationOp.SOFTMAX, trt.CausalMaskKind.NONE
    )
    att.decomposable = True
    att.mask = net.input("mask", "bool", (b, 1, sq, skv))
    att.key_value_lengths = net.input("kv_lengths", "int32", (b,))
    net.mark(att.get_output(0))
    lengths = np.array([skv, short], np.int32)
    positions = lengths[:, None] - sq + np.arange(sq)  # the chunk's last sq tokens
    kv = [rand(b, nkv, skv, h, seed=s) for s in (seed + 1, seed + 2)]
    for a in kv:
        a[1, :, short:] = np.nan
    feed = {
        "q": rand(b, nq, sq, h, seed=seed),
        "k": kv[0],
        "v": kv[1],
        "mask": (np.arange(skv) <= positions[:, :, None])[:, None],
        "kv_lengths": lengths,
    }
    net.build(feed)
    return net, feed


def test_long_context_attention_split_per_sequence_and_head_is_bit_exact():
    """Scores of 2 x 4 x 64 x 4200 (above the fast plan's split size): the fast plan runs
    attention per sequence and KV head, the plain plan in one call; ragged lengths (the
    second sequence's keys past 3000 hold NaN and are masked), GQA 4:2. Same bits."""
    net, feed = _ragged_attention((4, 2), sq=64, skv=4200, h=8, short=3000, seed=13)
    fast = compile_network(net.network).run(feed)["out"]
    plain = compile_network(net.network, fast=False).run(feed)["out"]
    assert np.isfinite(fast).all()
    np.testing.assert_array_equal(fast, plain)


@pytest.mark.parametrize("sq", [1, 2, 3])
def test_decode_attention_over_a_long_context_fast_and_plain_agree(sq):
    """A decode step (or 2-3 rows) over 1500 keys, GQA 6:2 (3 query heads a KV head), ragged
    lengths (the second sequence's keys past 1100 hold NaN). Up to 8 query rows a KV head
    and from 1024 keys, the fast plan's scores are native products, one per sequence and KV
    head (another summation order: scores of ~8 differ in their last bits, which the softmax
    carries into the outputs as up to ~1e-5); sq 3 (9 rows) keeps NumPy's. Both agree with
    float64 as closely; NaN stays out of both."""
    net, feed = _ragged_attention((6, 2), sq=sq, skv=1500, h=64, short=1100, seed=23)
    fast = compile_network(net.network).run(feed)["out"]
    plain = compile_network(net.network, fast=False).run(feed)["out"]
    wide = compile_network(net.network, precision="float64", fast=False).run(feed)["out"]
    assert np.isfinite(fast).all()
    for out in (fast, plain):
        np.testing.assert_allclose(out, wide, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(fast, plain, rtol=1e-4, atol=2e-5)


def test_fed_row_changed_in_place_between_runs_gets_new_products():
    """Two products of one fed row ``x [1, 16]`` (joined into one matrix-vector product by
    the fast plan): a caller that refills the same array and runs again gets the products of
    the new values, not the ones computed for the old."""
    net = Net()
    x = net.input("x", "float32", (1, 16))
    wq, wk = rand(8, 16, seed=1), rand(4, 16, seed=2)
    for w, name in ((wq, "q"), (wk, "k")):
        product = net.network.add_matrix_multiply(x, M.NONE, net.const(w), M.TRANSPOSE)
        net.mark(product.get_output(0), name)
    plan = compile_network(net.network)
    row = rand(1, 16, seed=3)
    plan.run({"x": row})
    row[:] = rand(1, 16, seed=4)
    out = plan.run({"x": row})
    np.testing.assert_allclose(out["q"], row @ wq.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["k"], row @ wk.T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
def test_read_only_cache_is_refused_before_any_layer_writes(fast):
    """Layer 1's key cache read-only: an ArgumentError naming it, and layer 0's caches (fed
    writeable) still hold only NaN: no layer ran."""
    plan = compile_network(_network(TINY_GQA, "float32", 2).network, fast=fast)
    caches = {k: v.copy() for k, v in _caches("float32").items()}
    key_1 = cache_names(1)[0]
    caches[key_1].flags.writeable = False
    feed = {
        **caches,
        "input_ids": np.array([[3, 5], [9, 2]], np.int32),
        "position_ids": np.array([[0, 1], [0, 1]], np.int64),
        "write_indices": np.array([0, 0], np.int32),
        "key_value_lengths": np.array([2, 2], np.int32),
        "last_token_rows": np.array([1, 3], np.int32),
    }
    feed = {k: v for k, v in feed.items() if k in plan.input_names}
    with pytest.raises(ArgumentError, match=f"{key_1}: expected a writeable array"):
        plan.run(feed)
    for name in cache_names(0)[:2]:
        assert np.isnan(caches[name]).all()
