"""The native helper's attention (``native.attention``) and the fast plan that runs it.

A prefill chunk's attention in a fast float32 plan runs in the helper: each query row's
scores only up to the last key it sees, softmax with the helper's own ``exp`` (within ~1 ulp
of NumPy's), the values weighted in blocks of rows. Expected values are the reference
attention (``ops.attention``) in float64 on the same values and mask; the plain plan is the
yardstick of the fast one on a whole network.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.interpreter.test_interpreter_fast import step_feed
from tests.support.compiled_helper import require_compiled_helper
from tests.support.interpreter_support import rand
from tests.support.tiny_models import TINY_GQA
from trt_kv.builder.model_caches import cache_names
from trt_kv.errors import DTypeError, ShapeError
from trt_kv.interpreter import attention, compile_network, half, native
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.reference import ops


@pytest.fixture(autouse=True)
def _compiled():
    """Every test here needs the compiled helper, which must be built wherever it can be."""
    require_compiled_helper()


def _case(b: int, nq: int, nkv: int, sq: int, n: int, h: int, *, s_max: int = 0, seed: int = 0):
    """q ``[b, nq, sq, h]``; k and v windows ``[b, nkv, n, h]`` of caches of ``s_max`` rows
    whose rows past each sequence's length hold NaN (never written); ragged lengths, the
    last ``sq`` positions of each sequence as queries; the causal mask ``[b, 1, sq, n]``."""
    rng = np.random.default_rng(seed)
    q = rand(b, nq, sq, h, seed=seed)
    caches = [rand(b, nkv, max(s_max, n), h, seed=seed + i) for i in (1, 2)]
    lengths = np.maximum(rng.integers(n // 2, n + 1, b), sq) if b > 1 else np.array([n])
    for cache in caches:
        for i, length in enumerate(lengths):
            cache[i, :, length:] = np.nan
    positions = lengths[:, None] - sq + np.arange(sq)  # [b, sq]
    mask = (np.arange(n) <= positions[:, :, None])[:, None]  # [b, 1, sq, n]
    k, v = (cache[:, :, :n] for cache in caches)
    return q, k, v, mask, lengths


def _expected(q, k, v, mask, lengths, scale: float) -> np.ndarray:
    wide = [a.astype(np.float64) for a in (q, k, v)]
    with np.errstate(invalid="ignore"):  # a row of +inf scores: inf / inf, NaN as intended
        return ops.attention(*wide, kv_lengths=lengths, mask=mask, scale=scale)


def _keep(q, k, mask, lengths) -> np.ndarray:
    return ops.causal_keep(q.shape[2], k.shape[2], "none", lengths, q.shape[0]) & mask


# (b, nq, nkv, sq, n, h, s_max): a causal prefill chunk (GQA 9:3, SmolLM2's heads), a second
# chunk over a ragged batch, decode rows, H with tails past 16 columns (13, 130), keys not a
# multiple of 16, windows of larger caches (strided K and V)
CASES = [
    (1, 9, 3, 40, 40, 64, 0),
    (2, 4, 2, 9, 37, 13, 50),
    (3, 6, 3, 1, 70, 64, 90),
    (2, 4, 4, 17, 40, 130, 0),
    (2, 8, 1, 5, 16, 24, 20),
]


@pytest.mark.parametrize(("b", "nq", "nkv", "sq", "n", "h", "s_max"), CASES)
def test_attention_is_the_float64_reference_within_float32_rounding(b, nq, nkv, sq, n, h, s_max):
    """Keys past each sequence's length hold NaN: a row never reads a key it does not see,
    so every output is finite."""
    q, k, v, mask, lengths = _case(b, nq, nkv, sq, n, h, s_max=s_max, seed=3)
    scale = h**-0.5
    out = native.attention(q, k, v, _keep(q, k, mask, lengths), scale)
    assert out.dtype == np.float32 and out.shape == q.shape and np.isfinite(out).all()
    np.testing.assert_allclose(out, _expected(q, k, v, mask, lengths, scale), rtol=0, atol=4e-6)


@pytest.mark.parametrize("sq", [12, 1], ids=["prefill", "decode"])
def test_a_mask_per_head_is_read_per_head(sq):
    """Key 3, below every row's last key, is seen by no row: its key and values (NaN) reach
    no output."""
    q, k, v, mask, lengths = _case(2, 4, 2, sq, 30, 16, seed=4)
    per_head = mask & (np.random.default_rng(5).random((2, 4, sq, 30)) < 0.7)
    per_head[..., 3] = False
    k[:, :, 3] = v[:, :, 3] = np.nan
    out = native.attention(q, k, v, _keep(q, k, per_head, lengths), 0.25)
    expected = _expected(q, k, v, per_head, lengths, 0.25)
    np.testing.assert_allclose(out, expected, rtol=0, atol=4e-6)


@pytest.mark.parametrize("seed", range(4))
def test_softmax_weights_are_as_close_as_numpys_float32(seed):
    """Scores set exactly (q ones, key j = s_j e_j) and values one-hot (v_j = e_j): the output
    is the softmax weights themselves. Their largest relative error against float64 is
    within two float32 ulps of the float32 reference's (NumPy's exp, sum and division)."""
    scores = np.random.default_rng(seed).uniform(-12, 0, 64).astype(np.float32)
    q = np.ones((1, 1, 1, 64), np.float32)
    k = np.diag(scores)[None, None].astype(np.float32)
    v = np.eye(64, dtype=np.float32)[None, None]
    out = native.attention(q, k, v, np.ones((1, 1, 1, 64), bool), 1.0)[0, 0, 0]
    float32 = ops.attention(q, k, v, scale=1.0)[0, 0, 0]
    weights = np.exp(scores.astype(np.float64) - scores.max())
    weights /= weights.sum()
    error = [float(np.max(np.abs(a / weights - 1))) for a in (out, float32)]
    assert error[0] <= error[1] + 2 * np.finfo(np.float32).eps


def test_a_row_that_sees_no_key_is_zeros_and_a_seen_nan_or_infinity_makes_its_row_nan():
    """As the reference: a NaN or +inf among a row's seen scores makes that row NaN, and no
    other; a row that sees nothing is zeros."""
    q, k, v, mask, lengths = _case(1, 2, 1, 9, 20, 16, seed=6)
    mask = mask.copy()
    mask[0, 0, 4] = False  # query row 4 sees no key
    k[0, 0, 15, 3] = np.nan  # key 15: seen by rows 5-8 (positions 11..19), not by 0-3
    q[0, 1, 2, 0] = np.inf  # head 1, row 2: its scores are +-inf or NaN
    keep = _keep(q, k, mask, lengths)
    out = native.attention(q, k, v, keep, 1.0)
    expected = _expected(q, k, v, mask, lengths, 1.0)
    assert (out[0, :, 4] == 0).all() and (expected[0, :, 4] == 0).all()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    assert np.isnan(out[:, :, 5:]).all() and np.isnan(out[0, 1, 2]).all()
    assert np.isfinite(out[0, 0, :4]).all() and np.isfinite(out[0, 1, [0, 1, 3]]).all()
    finite = np.isfinite(expected)
    np.testing.assert_allclose(out[finite], expected[finite], rtol=0, atol=4e-6)


def test_strided_queries_are_read_as_their_values():
    q, k, v, mask, lengths = _case(1, 4, 2, 10, 24, 16, seed=7)
    strided = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    keep = _keep(q, k, mask, lengths)
    np.testing.assert_array_equal(
        native.attention(strided, k, v, keep, 1.0), native.attention(q, k, v, keep, 1.0)
    )


# (b, nq, nkv, n, h): decode steps, one query row a sequence (at most 4 rows a KV head: the
# helper reads each key where it lies): SmolLM2's GQA 9:3, 4:1 and 1:1 heads, 1 to 600 keys
# (not multiples of 16 or of 2), H 64, 13 and 130 (columns past the 8-column chunks)
DECODE_CASES = [
    (1, 9, 3, 1, 64),
    (3, 9, 3, 37, 64),
    (1, 9, 3, 130, 64),
    (3, 9, 3, 201, 64),
    (3, 4, 1, 17, 13),
    (1, 4, 1, 600, 64),
    (3, 1, 1, 2, 130),
    (3, 3, 3, 333, 130),
    (1, 1, 1, 599, 13),
]


@pytest.mark.parametrize(("b", "nq", "nkv", "n", "h"), DECODE_CASES)
def test_decode_steps_are_the_float64_reference_within_float32_rounding(b, nq, nkv, n, h):
    """Windows of caches of n + 20 rows, ragged lengths, NaN in every row past a sequence's
    length: never read, every output finite."""
    q, k, v, mask, lengths = _case(b, nq, nkv, 1, n, h, s_max=n + 20, seed=n + h)
    scale = h**-0.5
    out = native.attention(q, k, v, _keep(q, k, mask, lengths), scale)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _expected(q, k, v, mask, lengths, scale), rtol=0, atol=4e-6)


def test_a_decode_row_that_sees_no_key_is_zeros_and_a_nan_score_makes_its_row_nan():
    """Sequence 1 sees no key; in sequence 0, query head 4 (KV head 1) has a NaN score: its
    row is NaN and the other heads of its group (3 and 5), which read the same keys, are not."""
    q, k, v, mask, lengths = _case(3, 9, 3, 1, 50, 64, s_max=60, seed=11)
    mask = mask.copy()
    mask[1] = False
    q[0, 4, 0, 7] = np.nan
    out = native.attention(q, k, v, _keep(q, k, mask, lengths), 0.125)
    expected = _expected(q, k, v, mask, lengths, 0.125)
    assert (out[1] == 0).all() and (expected[1] == 0).all()
    assert np.isnan(out[0, 4]).all() and np.isnan(expected[0, 4]).all()
    assert np.isfinite(np.delete(out[0], 4, axis=0)).all() and np.isfinite(out[2]).all()
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(out), finite)
    np.testing.assert_allclose(out[finite], expected[finite], rtol=0, atol=4e-6)


@pytest.mark.parametrize("nq", [9, 27])
def test_a_sequences_rows_do_not_depend_on_the_batch(nq):
    """Each sequence of a batch of 3, alone: the same bits (a decode step, 3 rows a KV head,
    and a prefill-like 9)."""
    q, k, v, mask, lengths = _case(3, nq, 3, 1, 300, 64, s_max=320, seed=12)
    keep = _keep(q, k, mask, lengths)
    batch = native.attention(q, k, v, keep, 0.125)
    for i in range(3):
        one = native.attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], keep[i : i + 1], 0.125)
        np.testing.assert_array_equal(batch[i : i + 1], one)


@pytest.mark.parametrize(
    ("args", "error", "names"),
    [
        ((rand(1, 2, 3, 8, dtype="float16"), rand(1, 1, 4, 8), rand(1, 1, 4, 8)), DTypeError, "q"),
        ((rand(1, 3, 3, 8), rand(1, 2, 4, 8), rand(1, 2, 4, 8)), ShapeError, "q, k, v"),
        ((rand(1, 2, 3, 8), rand(1, 1, 4, 8), rand(1, 1, 5, 8)), ShapeError, "q, k, v"),
        ((rand(1, 2, 3, 8), rand(1, 1, 4, 9), rand(1, 1, 4, 9)), ShapeError, "q, k, v"),
    ],
    ids=["q float16", "heads do not divide", "k and v differ", "H differs"],
)
def test_attention_refuses_other_dtypes_and_shapes(args, error, names):
    keep = np.ones((1, 1, 3, 4), bool)
    with pytest.raises(error, match=f"^{names}: expected"):
        native.attention(*args, keep, 1.0)


def test_keep_that_does_not_fit_is_refused():
    q, k, v = rand(1, 2, 3, 8), rand(1, 1, 4, 8), rand(1, 1, 4, 8)
    with pytest.raises(ShapeError, match=r"^keep: expected"):
        native.attention(q, k, v, np.ones((1, 1, 3, 5), bool), 1.0)
    with pytest.raises(DTypeError, match=r"^keep: expected"):
        native.attention(q, k, v, np.ones((1, 1, 3, 4), np.float32), 1.0)


# Ragged prefill chunks of 12 and 9 tokens, a second chunk of 10, then a decode step: each
# runs the native attention (the chunks 8+ query rows, the step 2 a KV head).
S_MAX = 24
IDS = np.random.default_rng(8).integers(0, TINY_GQA.vocab_size, (2, 23))
STEPS = [
    (IDS[:, :12], [list(range(12))] * 2, [0, 0], [12, 9], [11, 8]),
    (IDS[:, 12:22], [list(range(12, 22)), list(range(9, 19))], [12, 9], [22, 19], [9, 9]),
    (IDS[:, 22:], [[22], [19]], [22, 19], [23, 20], [0, 0]),
]


@pytest.mark.parametrize(("dtype", "rtol"), [("float32", 1e-5), ("float16", 4e-3)])
def test_prefill_chunks_run_native_attention_and_agree_with_the_plain_plan(
    dtype, rtol, monkeypatch
):
    """float32: within float32 rounding (the helper's exp and sums against NumPy's);
    float16 networks round every tensor, so a last-bit difference can move a tensor by one
    float16 ulp. Cache rows never written stay NaN in both and reach no logit."""
    calls = []
    run = native.attention
    monkeypatch.setattr(native, "attention", lambda *a, **kw: calls.append(1) or run(*a, **kw))
    net = build_llama_network(
        TINY_GQA, random_weights(TINY_GQA, seed=9), max_seq_len=S_MAX, max_batch=2,
        max_step_tokens=12, dtype=dtype,
    )  # fmt: skip
    plans = {"fast": compile_network(net.network)}
    plans["plain"] = compile_network(net.network, fast=False)
    shape = (2, TINY_GQA.num_key_value_heads, S_MAX, TINY_GQA.head_dim)
    names = [n for i in range(TINY_GQA.num_hidden_layers) for n in cache_names(i)[:2]]
    caches = {kind: {n: np.full(shape, np.nan, dtype) for n in names} for kind in plans}
    for step in STEPS:
        logits = {k: p.run(step_feed(p, caches[k], step))["logits"] for k, p in plans.items()}
        assert np.isfinite(logits["fast"]).all()
        scale = float(np.abs(logits["plain"]).max())
        np.testing.assert_allclose(logits["fast"], logits["plain"], rtol=rtol, atol=rtol * scale)
    assert len(calls) == 3 * TINY_GQA.num_hidden_layers  # two chunks and the decode step
    for name in names:
        for b, n in enumerate(STEPS[-1][3]):
            assert np.isnan(caches["fast"][name][b, :, n:]).all()


def test_native_attention_runs_only_where_it_pays():
    q, k = rand(2, 9, 128, 64), rand(2, 3, 128, 64)
    f32 = np.dtype(np.float32)
    pays = attention.native_attention_pays
    assert pays(q, k, k, None, f32)
    deep = rand(2, 3, 1024, 64)
    assert pays(q[:, :, :1], k, k, None, f32) and pays(q[:, :, :1], deep, deep, None, f32)
    assert not pays(q[:, :, :2], k, k, None, f32)  # 6 rows a KV head, few keys
    assert not pays(q, deep, deep, None, f32)  # deep in a context
    assert not pays(q, k, k, np.zeros((1, 1, 128, 128), np.float32), f32)  # additive mask
    assert not pays(q, k[:1], k[:1], None, f32)  # K and V broadcast over the batch
    assert not pays(q.astype(np.float64), k, k, None, np.dtype(np.float64))


@pytest.mark.parametrize("sq", [1, 12])
def test_keys_reads_the_first_keys_of_whole_caches_as_their_window(sq):
    """``keys=n`` over caches of 40 rows (NaN past n, never read): the bits of the call on
    the windows ``[:, :, :n]``; a count past the caches' rows is refused."""
    q, k, v, mask, lengths = _case(2, 9, 3, sq, 30, 64, s_max=40, seed=sq)
    caches = [a.base if a.base is not None else a for a in (k, v)]
    assert caches[0].shape[2] == 40 and np.isnan(caches[0][..., 30:, :]).all()
    keep = _keep(q, k, mask, lengths)
    whole = native.attention(q, *caches, keep, 0.125, keys=30)
    np.testing.assert_array_equal(whole, native.attention(q, k, v, keep, 0.125))
    with pytest.raises(ShapeError, match=r"^keys: expected in \[0, 40\], got 41"):
        native.attention(q, *caches, keep, 0.125, keys=41)


@pytest.mark.parametrize("sq", [1, 12])
def test_rounded_is_the_result_rounded_to_float16_in_the_call(sq):
    """``rounded``: a float16 network's attention output, the bits of round_any after."""
    q, k, v, mask, lengths = _case(2, 9, 3, sq, 30, 64, seed=sq + 1)
    keep = _keep(q, k, mask, lengths)
    plain = native.attention(q, k, v, keep, 0.125)
    rounded = native.attention(q, k, v, keep, 0.125, rounded=True)
    assert not np.array_equal(plain, rounded)
    np.testing.assert_array_equal(rounded.view(np.uint32), half.round_any(plain).view(np.uint32))


def test_the_decode_attention_bench_runs_and_says_which_route_pays():
    """``scripts/bench_decode_attention.py`` (a benchmark: its times are not checked here)
    runs on the functions it names: the native route pays for a decode step's 3 query rows
    a KV head, not for 8."""
    require_compiled_helper()
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_decode_attention.py"
    rows = {}
    for heads in (("9", "3"), ("16", "2")):
        args = ["--batch", "1", "--keys", "32", "--calls", "1", "--repeats", "1", "--heads"]
        done = subprocess.run(
            [sys.executable, str(script), *args, *heads], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        rows[heads] = done.stdout.splitlines()[-1].split("|")
    assert rows[("9", "3")][-2].strip() == "True"
    assert rows[("16", "2")][-2].strip() == "False"
