"""NumPy reference attention: GQA by broadcasting (no copied KV heads), keys no query sees
(NaN in unwritten cache rows) never reach the output, and a window cut to the valid keys gives
the same result as the whole window."""

from __future__ import annotations

import numpy as np

from trt_kv.reference import attention


def _rand(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _plain(q, k, v, keep):
    """Per query head, in float64: ``softmax(q k^T / sqrt(H)) v`` over kept keys only."""
    b, nq, sq, h = q.shape
    group = nq // k.shape[1]
    keep = np.broadcast_to(keep, (b, nq, sq, k.shape[2]))
    out = np.zeros(q.shape)
    for i in range(b):
        for head in range(nq):
            for s in range(sq):
                j = np.flatnonzero(keep[i, head, s])
                kh, vh = k[i, head // group, j].astype(float), v[i, head // group, j].astype(float)
                scores = kh @ q[i, head, s].astype(float) / np.sqrt(h)
                w = np.exp(scores - scores.max())
                out[i, head, s] = w / w.sum() @ vh
    return out


def test_gqa_query_head_reads_its_kv_head():
    q, k, v = _rand(2, 6, 3, 8, seed=0), _rand(2, 2, 5, 8, seed=1), _rand(2, 2, 5, 8, seed=2)
    keep = np.tril(np.ones((3, 5), bool), k=2)[None, None]
    out = attention(q, k, v, causal="lower_right")
    np.testing.assert_allclose(out, _plain(q, k, v, keep), rtol=1e-5, atol=1e-6)


def test_per_head_bool_mask_with_gqa():
    q, k, v = _rand(1, 4, 2, 8, seed=3), _rand(1, 2, 6, 8, seed=4), _rand(1, 2, 6, 8, seed=5)
    mask = np.random.default_rng(6).random((1, 4, 2, 6)) > 0.5
    mask[..., 0] = True
    out = attention(q, k, v, mask=mask)
    np.testing.assert_allclose(out, _plain(q, k, v, mask), rtol=1e-5, atol=1e-6)


def test_nan_in_rows_past_the_lengths_never_reaches_the_output():
    q, k, v = _rand(2, 4, 1, 8, seed=7), _rand(2, 2, 8, 8, seed=8), _rand(2, 2, 8, 8, seed=9)
    lengths = np.array([3, 6])
    for b, n in enumerate(lengths):
        k[b, :, n:] = np.nan
        v[b, :, n:] = np.nan
    out = attention(q, k, v, kv_lengths=lengths)
    keep = (np.arange(8) < lengths[:, None])[:, None, None, :]
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _plain(q, k, v, keep), rtol=1e-5, atol=1e-6)


def test_nan_seen_by_one_head_of_a_group_stays_in_that_head():
    """Key 2 holds NaN; query head 0 sees it, head 1 (same KV head) does not."""
    q, k, v = _rand(1, 2, 1, 8, seed=10), _rand(1, 1, 4, 8, seed=11), _rand(1, 1, 4, 8, seed=12)
    v[0, 0, 2] = np.nan
    mask = np.array([[True, True, True, False], [True, True, False, True]])[None, :, None, :]
    out = attention(q, k, v, mask=mask)
    assert np.isnan(out[0, 0]).all()
    np.testing.assert_allclose(out[0, 1], _plain(q, k, v, mask)[0, 1], rtol=1e-5, atol=1e-6)


def test_window_cut_to_the_valid_keys_gives_the_same_result_to_float32_rounding():
    q, k, v = _rand(2, 6, 2, 8, seed=13), _rand(2, 2, 16, 8, seed=14), _rand(2, 2, 16, 8, seed=15)
    lengths = np.array([5, 9])
    whole = attention(q, k, v, causal="lower_right", kv_lengths=lengths)
    cut = attention(q, k[:, :, :9], v[:, :, :9], causal="lower_right", kv_lengths=lengths)
    np.testing.assert_allclose(whole, cut, rtol=1e-6, atol=1e-7)  # a few ulps: sum order


def test_a_query_row_that_sees_no_key_gives_zeros():
    """Row 1 of head 0 keeps no key (its softmax total is 0): exact zeros there, the other
    rows as the plain per-row computation."""
    q, k, v = _rand(1, 2, 3, 8, seed=16), _rand(1, 1, 5, 8, seed=17), _rand(1, 1, 5, 8, seed=18)
    mask = np.ones((1, 2, 3, 5), bool)
    mask[0, 0, 1] = False
    out = attention(q, k, v, mask=mask)
    assert (out[0, 0, 1] == 0).all()
    expected = _plain(q, k, v, np.ones_like(mask))  # rows are independent
    expected[0, 0, 1] = 0
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_a_nan_score_a_query_sees_gives_nan_in_that_row_only():
    """Key 3 holds NaN: query row 0 sees it (NaN out, as softmax gives), row 1 does not."""
    q, k, v = _rand(1, 1, 2, 8, seed=19), _rand(1, 1, 5, 8, seed=20), _rand(1, 1, 5, 8, seed=21)
    k[0, 0, 3] = np.nan
    mask = np.array([[True, True, True, True, False], [True, True, False, False, True]])
    out = attention(q, k, v, mask=mask[None, None])
    assert np.isnan(out[0, 0, 0]).all()
    np.testing.assert_allclose(
        out[0, 0, 1], _plain(q, k, v, mask[None, None])[0, 0, 1], rtol=1e-5, atol=1e-6
    )
