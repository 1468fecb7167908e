"""Interpreter: attention v2 (causal kinds, key/value lengths, GQA, bool and float masks,
packed query form) against a plain ``softmax(Q K^T / sqrt(H)) V``.

TensorRT's attention does not scale scores (its guide asks for Q or K pre-scaled), so every
network here multiplies Q by ``1/sqrt(H)`` before the attention, as trt_kv's model does.
"""

from __future__ import annotations

import numpy as np

from tests.support.interpreter_support import Net, rand
from trt_kv._trt import trt

C = trt.CausalMaskKind
B, NQ, NKV, H = 2, 4, 2, 8


def softmax_attention(q, k, v, keep=None, add=None):
    """``softmax(Q K^T / sqrt(H) + add)`` over kept keys, times V; KV heads repeated for GQA."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if add is not None:
        scores = scores + add
    if keep is not None:
        scores = np.where(keep, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True) @ v


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    """The float32 tolerance of the interpreter's policy: 1e-5 relative, 1e-6 absolute."""
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def _attention(q, k, v, causal=C.NONE, mask=None, kv_lengths=None):
    net = Net()
    qt = net.input("q", "float32", q.shape)
    scale = net.const(np.full((1, 1, 1, 1), 1 / np.sqrt(q.shape[-1]), np.float32))
    qt = net.network.add_elementwise(qt, scale, trt.ElementWiseOperation.PROD).get_output(0)
    kt, vt = net.input("k", "float32", k.shape), net.input("v", "float32", v.shape)
    att = net.network.add_attention_v2(qt, kt, vt, trt.AttentionNormalizationOp.SOFTMAX, causal)
    att.decomposable = True
    feed = {"q": q, "k": k, "v": v}
    if mask is not None:
        att.mask = net.input("mask", mask.dtype.name, mask.shape)
        feed["mask"] = mask
    if kv_lengths is not None:
        att.key_value_lengths = net.input("kv_lengths", "int32", kv_lengths.shape)
        feed["kv_lengths"] = kv_lengths
    net.mark(att.get_output(0))
    return net.run(feed)["out"]


def _qkv(sq: int, skv: int, seed: int = 0):
    return (
        rand(B, NQ, sq, H, seed=seed),
        rand(B, NKV, skv, H, seed=seed + 1),
        rand(B, NKV, skv, H, seed=seed + 2),
    )


def test_attention_causal_none_sees_every_key():
    q, k, v = _qkv(3, 5)
    assert_close(_attention(q, k, v), softmax_attention(q, k, v))


def test_attention_upper_left_query_i_sees_keys_up_to_i():
    q, k, v = _qkv(3, 5)
    keep = np.tril(np.ones((3, 5), bool))  # j <= i
    assert_close(_attention(q, k, v, C.UPPER_LEFT), softmax_attention(q, k, v, keep))


def test_attention_lower_right_last_query_sees_every_key():
    q, k, v = _qkv(3, 5)
    keep = np.tril(np.ones((3, 5), bool), k=5 - 3)  # j <= i + S_kv - S_q
    assert_close(_attention(q, k, v, C.LOWER_RIGHT), softmax_attention(q, k, v, keep))


def test_attention_key_value_lengths_drop_keys_past_each_length():
    q, k, v = _qkv(2, 6)
    lengths = np.array([3, 6], np.int32)
    keep = (np.arange(6) < lengths[:, None])[:, None, None, :]  # [B, 1, 1, S_kv]
    out = _attention(q, k, v, kv_lengths=lengths)
    assert_close(out, softmax_attention(q, k, v, keep))


def test_attention_decode_step_reads_cache_up_to_its_length():
    """One new token per sequence over a padded cache of S_max = 8 (the decode step)."""
    q, k, v = _qkv(1, 8)
    lengths = np.array([5, 1], np.int32)
    keep = (np.arange(8) < lengths[:, None])[:, None, None, :]
    out = _attention(q, k, v, C.LOWER_RIGHT, kv_lengths=lengths)
    assert_close(out, softmax_attention(q, k, v, keep))


def test_attention_lower_right_with_lengths_anchors_at_each_valid_length():
    """Open question (b) in docs/gpu-results.md: the diagonal ends at key L_b - 1 (the last
    valid key), not at S_kv - 1."""
    q, k, v = _qkv(2, 6)
    lengths = np.array([4, 6], np.int32)
    i, j = np.arange(2)[:, None], np.arange(6)[None, :]
    keep = np.stack([(j <= i + n - 2) & (j < n) for n in lengths])[:, None]  # [B, 1, Sq, Skv]
    out = _attention(q, k, v, C.LOWER_RIGHT, kv_lengths=lengths)
    assert_close(out, softmax_attention(q, k, v, keep))


def test_attention_gqa_query_head_h_uses_kv_head_h_over_group():
    q, k, v = rand(1, 6, 2, H, seed=4), rand(1, 2, 5, H, seed=5), rand(1, 2, 5, H, seed=6)
    out = _attention(q, k, v)
    for h in range(6):
        one = softmax_attention(
            q[:, h : h + 1], k[:, h // 3 : h // 3 + 1], v[:, h // 3 : h // 3 + 1]
        )
        assert_close(out[:, h : h + 1], one)


def test_attention_bool_mask_true_means_attend():
    q, k, v = _qkv(3, 5)
    mask = np.random.default_rng(7).random((B, 1, 3, 5)) > 0.4
    mask[..., 0] = True  # every query keeps at least one key
    assert_close(_attention(q, k, v, mask=mask), softmax_attention(q, k, v, keep=mask))


def test_attention_float_mask_is_added_to_scaled_scores():
    q, k, v = _qkv(3, 5)
    bias = rand(1, NQ, 3, 5, seed=9)
    assert_close(_attention(q, k, v, mask=bias), softmax_attention(q, k, v, add=bias))


def test_attention_packed_query_splits_tokens_by_query_lengths():
    """PACKED_NHD query [T, Nq, H] with cumulative query_lengths [B + 1], padded K/V.

    Not built: TensorRT-RTX has no decomposition of packed attention, so the build needs a
    GPU target with a fused packed kernel ("no fused kernel is available on this target")."""
    q_lengths = np.array([0, 1, 3], np.int32)  # sequence 0: 1 token, sequence 1: 2 tokens
    q = rand(3, NQ, H, seed=11)
    k, v = rand(B, NKV, 4, H, seed=12), rand(B, NKV, 4, H, seed=13)
    net = Net()
    scale = net.const(np.full((1, 1, 1), 1 / np.sqrt(H), np.float32))
    qt = net.network.add_elementwise(
        net.input("q", "float32", q.shape), scale, trt.ElementWiseOperation.PROD
    ).get_output(0)
    att = net.network.add_attention_v2(
        qt,
        net.input("k", "float32", k.shape),
        net.input("v", "float32", v.shape),
        trt.AttentionNormalizationOp.SOFTMAX,
        C.NONE,
    )
    att.query_form = trt.AttentionIOForm.PACKED_NHD
    att.query_lengths = net.input("q_lengths", "int32", (3,))
    att.decomposable = True
    net.mark(att.get_output(0))
    out = net.run({"q": q, "k": k, "v": v, "q_lengths": q_lengths}, build=False)["out"]
    for b, (lo, hi) in enumerate([(0, 1), (1, 3)]):
        q_b = q[lo:hi].transpose(1, 0, 2)[None]  # [1, Nq, L_b, H]
        expected = softmax_attention(q_b, k[b : b + 1], v[b : b + 1])[0].transpose(1, 0, 2)
        assert_close(out[lo:hi], expected)
