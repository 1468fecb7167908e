"""Interpreter: a whole Llama-shaped decoder, prefill then decode with in-place caches, against
a NumPy model that recomputes every token from scratch; and the speed of one SmolLM2-135M-
shaped decode step.

The network is built here with plain layers (gather, RMSNorm from elementwise and reduce,
linear, RoPE, KV-cache update, attention v2, SwiGLU) so this test does not move with
trt_kv.models; it exercises the layer mix a real model uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tests.support.interpreter_support import Net
from trt_kv import dtypes
from trt_kv._trt import trt
from trt_kv.builder import add_model_caches
from trt_kv.builder.model_caches import cache_names
from trt_kv.interpreter import compile_network

E = trt.ElementWiseOperation
EPS = 1e-5


@dataclass(frozen=True)
class Dims:
    vocab: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    s_max: int


TINY = Dims(vocab=64, hidden=32, ffn=48, layers=2, heads=4, kv_heads=2, head_dim=8, s_max=16)
SMOLLM2 = Dims(49152, 576, 1536, 30, 9, 3, 64, 256)
LAYER_KEYS = ("norm1", "wq", "wk", "wv", "wo", "norm2", "w_gate", "w_up", "w_down")


def make_weights(d: Dims, seed: int = 0, std: float = 0.1, shared_layers: bool = False) -> dict:
    """Hugging Face layouts (``[out, in]``); ``shared_layers`` reuses one block's arrays."""
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    def block() -> dict:
        q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
        return {
            "norm1": 1 + w(d.hidden),
            "wq": w(q, d.hidden),
            "wk": w(kv, d.hidden),
            "wv": w(kv, d.hidden),
            "wo": w(d.hidden, q),
            "norm2": 1 + w(d.hidden),
            "w_gate": w(d.ffn, d.hidden),
            "w_up": w(d.ffn, d.hidden),
            "w_down": w(d.hidden, d.ffn),
        }

    first = block()
    layers = [first if shared_layers else block() for _ in range(d.layers)]
    layers[0] = first
    inv = 1.0 / 10000 ** (np.arange(0, d.head_dim, 2) / d.head_dim)
    angles = np.arange(d.s_max)[:, None] * inv[None, :]
    return {
        "embed": w(d.vocab, d.hidden),
        "layers": layers,
        "final_norm": 1 + w(d.hidden),
        "cos": np.cos(angles).astype(np.float32),
        "sin": np.sin(angles).astype(np.float32),
    }


def build_decoder(d: Dims, wts: dict, dtype: str = "float32") -> Net:
    """Inputs ids, positions [B, S], write_indices, kv_lengths [B], caches; output logits
    [B, S, V] float32 and present_key/value.{i}."""
    net = Net()
    nw = net.network
    ids = net.input("ids", "int32", (-1, -1))
    pos = net.input("positions", "int64", (-1, -1))
    caches = add_model_caches(
        nw,
        num_layers=d.layers,
        num_kv_heads=d.kv_heads,
        head_dim=d.head_dim,
        max_seq_len=d.s_max,
        dtype=dtype,
    )
    kv_lengths = net.input("kv_lengths", "int32", (-1,))

    def const(a: np.ndarray, as_dtype: str = dtype) -> object:
        return net.const(a, as_dtype)

    def ew(a: object, b: object, op: object) -> object:
        return nw.add_elementwise(a, b, op).get_output(0)

    def shuffle(x: object, dims: tuple, first: tuple | None = None, second: tuple | None = None):
        layer = nw.add_shuffle(x)
        if first:
            layer.first_transpose = first
        layer.reshape_dims = dims
        if second:
            layer.second_transpose = second
        return layer.get_output(0)

    def linear(x: object, w: np.ndarray) -> object:
        m = nw.add_matrix_multiply(
            x, trt.MatrixOperation.NONE, const(w[None]), trt.MatrixOperation.TRANSPOSE
        )
        return m.get_output(0)

    def rms(x: object, w: np.ndarray) -> object:
        mean = nw.add_reduce(ew(x, x, E.PROD), trt.ReduceOperation.AVG, 1 << 2, True).get_output(0)
        root = nw.add_unary(
            ew(mean, const(np.full((1, 1, 1), EPS)), E.SUM), trt.UnaryOperation.SQRT
        )
        return ew(ew(x, root.get_output(0), E.DIV), const(w[None, None]), E.PROD)

    def rope(x: object) -> object:
        layer = nw.add_rotary_embedding(x, cos, sin, False, 0)
        layer.set_input(3, pos)
        return layer.get_output(0)

    cos, sin = const(wts["cos"]), const(wts["sin"])
    j = const(np.arange(d.s_max).reshape(1, 1, 1, -1), "int64")
    later = ew(j, shuffle(pos, (0, 1, -1, 1)), E.GREATER)  # key j after query position
    keep = nw.add_unary(later, trt.UnaryOperation.NOT).get_output(0)  # [B, 1, S, S_max]
    embed = const(wts["embed"])
    x = nw.add_gather(embed, ids, 0).get_output(0)  # [B, S, D]
    for i, lw in enumerate(wts["layers"]):
        h = rms(x, lw["norm1"])
        q = rope(shuffle(linear(h, lw["wq"]), (0, 0, d.heads, d.head_dim), second=(0, 2, 1, 3)))
        k = rope(shuffle(linear(h, lw["wk"]), (0, 0, d.kv_heads, d.head_dim), second=(0, 2, 1, 3)))
        v = shuffle(linear(h, lw["wv"]), (0, 0, d.kv_heads, d.head_dim), second=(0, 2, 1, 3))
        q = ew(q, const(np.full((1, 1, 1, 1), d.head_dim**-0.5)), E.PROD)
        k_all, v_all = caches.update(i, k, v)
        att = nw.add_attention_v2(
            q, k_all, v_all, trt.AttentionNormalizationOp.SOFTMAX, trt.CausalMaskKind.NONE
        )
        att.mask, att.key_value_lengths, att.decomposable = keep, kv_lengths, True
        o = shuffle(att.get_output(0), (0, 0, d.heads * d.head_dim), first=(0, 2, 1, 3))
        x = ew(x, linear(o, lw["wo"]), E.SUM)
        h = rms(x, lw["norm2"])
        gate = linear(h, lw["w_gate"])
        sig = nw.add_activation(gate, trt.ActivationType.SIGMOID).get_output(0)
        x = ew(
            x, linear(ew(ew(gate, sig, E.PROD), linear(h, lw["w_up"]), E.PROD), lw["w_down"]), E.SUM
        )
    head = shuffle(embed, (1, d.vocab, d.hidden))
    final = rms(x, wts["final_norm"])
    logits = nw.add_matrix_multiply(
        final, trt.MatrixOperation.NONE, head, trt.MatrixOperation.TRANSPOSE
    )
    net.mark(nw.add_cast(logits.get_output(0), trt.float32).get_output(0), "logits")
    return net


def numpy_logits(d: Dims, wts: dict, tokens: np.ndarray) -> np.ndarray:
    """Logits ``[n, V]`` of one sequence ``tokens [n]``, every token recomputed, no cache."""
    n = len(tokens)

    def rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w

    def rope(x: np.ndarray) -> np.ndarray:  # x [N, n, H]
        c, s = wts["cos"][:n], wts["sin"][:n]
        x1, x2 = x[..., : d.head_dim // 2], x[..., d.head_dim // 2 :]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    def heads(x: np.ndarray, count: int) -> np.ndarray:
        return x.reshape(n, count, d.head_dim).transpose(1, 0, 2)

    x = wts["embed"][tokens]
    causal = np.tril(np.ones((n, n), bool))
    for lw in wts["layers"]:
        h = rms(x, lw["norm1"])
        q = rope(heads(h @ lw["wq"].T, d.heads))
        k = np.repeat(rope(heads(h @ lw["wk"].T, d.kv_heads)), d.heads // d.kv_heads, axis=0)
        v = np.repeat(heads(h @ lw["wv"].T, d.kv_heads), d.heads // d.kv_heads, axis=0)
        scores = np.where(causal, q @ k.transpose(0, 2, 1) / np.sqrt(d.head_dim), -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        o = (p / p.sum(-1, keepdims=True) @ v).transpose(1, 0, 2).reshape(n, -1)
        x = x + o @ lw["wo"].T
        h = rms(x, lw["norm2"])
        gate = h @ lw["w_gate"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ lw["w_up"].T)) @ lw["w_down"].T
    return rms(x, wts["final_norm"]) @ wts["embed"].T


def _step_feed(d: Dims, caches: dict, ids: np.ndarray, start: int) -> dict:
    b, s = ids.shape
    return {
        **caches,
        "ids": ids.astype(np.int32),
        "positions": np.broadcast_to(start + np.arange(s), (b, s)).astype(np.int64),
        "write_indices": np.full(b, start, np.int32),
        "kv_lengths": np.full(b, start + s, np.int32),
    }


def _empty_caches(d: Dims, batch: int, dtype: str = "float32") -> dict:
    shape = (batch, d.kv_heads, d.s_max, d.head_dim)
    return {
        name: np.zeros(shape, dtypes.to_numpy(dtype))
        for i in range(d.layers)
        for name in cache_names(i)[:2]
    }


def test_tiny_decoder_prefill_then_decode_matches_numpy_recompute():
    wts = make_weights(TINY)
    net = build_decoder(TINY, wts)
    caches = _empty_caches(TINY, batch=2)
    prompts = np.array([[5, 17, 42], [9, 3, 60]])
    net.build(_step_feed(TINY, caches, prompts, 0))
    plan = compile_network(net.network)
    tokens = prompts
    out = plan.run(_step_feed(TINY, caches, prompts, 0))
    for step in range(3):  # prefill logits, then two decode steps
        for b in range(2):
            expected = numpy_logits(TINY, wts, tokens[b])[-out["logits"].shape[1] :]
            np.testing.assert_allclose(out["logits"][b], expected, rtol=1e-4, atol=1e-4)
        next_ids = out["logits"][:, -1].argmax(-1)[:, None]
        tokens = np.concatenate([tokens, next_ids], axis=1)
        if step < 2:
            out = plan.run(_step_feed(TINY, caches, next_ids, tokens.shape[1] - 1))
    for i in range(TINY.layers):
        past_key, _, present_key, _ = cache_names(i)
        assert out[present_key] is caches[past_key]


def test_smollm2_shaped_decode_step_runs_after_prefill():
    """One decode step (B = 1, S = 1) of a 30-layer, hidden 576, 9/3-head, vocab 49152 float16
    network with a compiled plan (not built: the per-layer tests prove TensorRT accepts it).
    Its speed (target < 1 s) is measured by scripts/bench_build.py, not here."""
    wts = make_weights(SMOLLM2, std=0.02, shared_layers=True)
    net = build_decoder(SMOLLM2, wts, "float16")  # keeps the weight arrays TensorRT points at
    plan = compile_network(net.network)
    caches = _empty_caches(SMOLLM2, batch=1, dtype="float16")
    plan.run(_step_feed(SMOLLM2, caches, np.array([[1, 2, 3, 4]]), 0))  # prefill
    out = plan.run(_step_feed(SMOLLM2, caches, np.array([[7]]), 4))
    assert out["logits"].shape == (1, 1, SMOLLM2.vocab)
    assert np.isfinite(out["logits"]).all()
