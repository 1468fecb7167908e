"""NumPy reference of the LINEAR KV-cache update: golden example and properties."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trt_kv.errors import CacheOverflowError, DTypeError, ShapeError
from trt_kv.reference import kv_cache_update

# TensorRT's KVCacheUpdate operator example: cache [4, 2, 8, 1], update [4, 2, 4, 1],
# write_indices [2, 1, 1, 3]. The page's own input values could not be retrieved here, so the
# inputs are: cache filled with -1, update[i, d, s, 0] = 1 + 8 i + 4 d + s. Expected output
# written out by hand from the documented rule out[i, :, w[i] + s, :] = update[i, :, s, :].
DOC_CACHE = np.full((4, 2, 8, 1), -1.0, dtype=np.float32)
DOC_UPDATE = np.arange(1, 33, dtype=np.float32).reshape(4, 2, 4, 1)
DOC_WRITE_INDICES = np.array([2, 1, 1, 3], dtype=np.int32)
DOC_EXPECTED = np.array(
    [
        [[-1, -1, 1, 2, 3, 4, -1, -1], [-1, -1, 5, 6, 7, 8, -1, -1]],
        [[-1, 9, 10, 11, 12, -1, -1, -1], [-1, 13, 14, 15, 16, -1, -1, -1]],
        [[-1, 17, 18, 19, 20, -1, -1, -1], [-1, 21, 22, 23, 24, -1, -1, -1]],
        [[-1, -1, -1, 25, 26, 27, 28, -1], [-1, -1, -1, 29, 30, 31, 32, -1]],
    ],
    dtype=np.float32,
)[..., None]


def test_documentation_example_gives_expected_output():
    out = kv_cache_update(DOC_CACHE, DOC_UPDATE, DOC_WRITE_INDICES)
    np.testing.assert_array_equal(out, DOC_EXPECTED)


def test_input_cache_is_not_modified():
    cache = DOC_CACHE.copy()
    kv_cache_update(cache, DOC_UPDATE, DOC_WRITE_INDICES)
    np.testing.assert_array_equal(cache, DOC_CACHE)


def test_packed_form_equals_padded_form_for_equal_lengths():
    packed = DOC_UPDATE[..., 0].transpose(0, 2, 1).reshape(16, 2)[..., None]  # [T, N, H]
    lengths = np.array([0, 4, 8, 12, 16], dtype=np.int32)
    out = kv_cache_update(DOC_CACHE, packed, DOC_WRITE_INDICES, lengths)
    np.testing.assert_array_equal(out, DOC_EXPECTED)


def test_packed_form_with_ragged_lengths():
    cache = np.zeros((2, 1, 6, 1), np.float32)
    update = np.array([1, 2, 3, 4], np.float32).reshape(4, 1, 1)  # seq 0: 1 token, seq 1: 3
    out = kv_cache_update(cache, update, np.array([5, 0]), np.array([0, 1, 4]))
    np.testing.assert_array_equal(out[:, 0, :, 0], [[0, 0, 0, 0, 0, 1], [2, 3, 4, 0, 0, 0]])


def test_write_past_s_max_raises_and_writes_nothing():
    cache = DOC_CACHE.copy()
    with pytest.raises(CacheOverflowError, match=r"write_indices\[3\].*S_max = 8.*5 \+ 4 = 9"):
        kv_cache_update(cache, DOC_UPDATE, np.array([2, 1, 1, 5], np.int32))


def test_negative_write_index_raises():
    with pytest.raises(CacheOverflowError, match=r"write_indices\[0\]"):
        kv_cache_update(DOC_CACHE, DOC_UPDATE, np.array([-1, 1, 1, 3], np.int32))


def test_update_dtype_must_match_cache():
    with pytest.raises(DTypeError, match="update: expected dtype float32, got float16"):
        kv_cache_update(DOC_CACHE, DOC_UPDATE.astype(np.float16), DOC_WRITE_INDICES)


def test_index_dtype_must_be_int32_or_int64():
    with pytest.raises(DTypeError, match="write_indices"):
        kv_cache_update(DOC_CACHE, DOC_UPDATE, DOC_WRITE_INDICES.astype(np.float32))


def test_packed_lengths_must_end_at_token_count():
    with pytest.raises(ShapeError, match="update_lengths"):
        kv_cache_update(
            DOC_CACHE,
            np.zeros((16, 2, 1), np.float32),
            DOC_WRITE_INDICES,
            np.array([0, 4, 8, 12, 15], np.int32),
        )


DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@st.composite
def update_case(draw):
    b = draw(st.integers(1, 4))
    n = draw(st.integers(1, 3))
    s_max = draw(st.integers(1, 12))
    h = draw(st.integers(1, 5))
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    index_dtype = draw(st.sampled_from([np.int32, np.int64]))
    packed = draw(st.booleans())
    counts = [draw(st.integers(0 if packed else 1, s_max)) for _ in range(b)]
    if not packed:
        counts = [max(counts)] * b
    starts = [draw(st.integers(0, s_max - c)) for c in counts]
    seed = draw(st.integers(0, 2**31))
    return b, n, s_max, h, dtype, index_dtype, packed, counts, starts, seed


@settings(max_examples=150, deadline=None)
@given(update_case())
def test_property_written_window_equals_update_and_rest_is_bit_identical(case):
    b, n, s_max, h, dtype, index_dtype, packed, counts, starts, seed = case
    rng = np.random.default_rng(seed)
    # Random bit patterns (NaNs included) show that untouched bytes stay untouched.
    cache = rng.integers(
        0, 256, size=(b, n, s_max, h * np.dtype(dtype).itemsize), dtype=np.uint8
    ).view(dtype)
    seqs = [rng.standard_normal((n, c, h)).astype(dtype) for c in counts]
    indices = np.array(starts, dtype=index_dtype)
    if packed:
        update = np.concatenate([s.transpose(1, 0, 2) for s in seqs]).reshape(-1, n, h)
        lengths = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        out = kv_cache_update(cache, update, indices, lengths)
    else:
        out = kv_cache_update(cache, np.stack(seqs), indices)
    written = np.zeros(cache.shape, dtype=bool)
    for i, (w, c) in enumerate(zip(starts, counts)):
        written[i, :, w : w + c] = True
        np.testing.assert_array_equal(out[i, :, w : w + c].view(np.uint8), seqs[i].view(np.uint8))
    assert (
        out.view(np.uint8)[~written.repeat(np.dtype(dtype).itemsize, -1)]
        == cache.view(np.uint8)[~written.repeat(np.dtype(dtype).itemsize, -1)]
    ).all()


def test_negative_write_index_message_states_the_broken_condition():
    with pytest.raises(
        CacheOverflowError, match=r"write_indices\[0\]: expected an index >= 0, got -1"
    ):
        kv_cache_update(DOC_CACHE, DOC_UPDATE, np.array([-1, 1, 1, 3], np.int32))


@pytest.mark.parametrize("dtype", [np.int8, np.bool_, np.int32, np.float64])
def test_cache_dtypes_the_layer_does_not_take_are_refused(dtype):
    cache, update = DOC_CACHE.astype(dtype), DOC_UPDATE.astype(dtype)
    with pytest.raises(
        DTypeError, match=r"cache: expected dtype \('float32', 'float16', 'bfloat16'\), got "
    ):
        kv_cache_update(cache, update, DOC_WRITE_INDICES)


def test_float_update_lengths_are_refused():
    packed = np.zeros((16, 2, 1), np.float32)
    lengths = np.array([0.0, 4.0, 8.0, 12.0, 16.0])
    with pytest.raises(DTypeError, match=r"update_lengths: expected dtype .*got float64"):
        kv_cache_update(DOC_CACHE, packed, DOC_WRITE_INDICES, lengths)


def test_index_lists_are_accepted_as_int64():
    out = kv_cache_update(DOC_CACHE, DOC_UPDATE, [2, 1, 1, 3])
    np.testing.assert_array_equal(out, DOC_EXPECTED)
    packed = DOC_UPDATE[..., 0].transpose(0, 2, 1).reshape(16, 2)[..., None]
    out = kv_cache_update(DOC_CACHE, packed, [2, 1, 1, 3], [0, 4, 8, 12, 16])
    np.testing.assert_array_equal(out, DOC_EXPECTED)


def test_cache_or_update_as_a_list_is_refused_by_name():
    with pytest.raises(DTypeError, match="cache: expected a NumPy array, got list"):
        kv_cache_update(DOC_CACHE.tolist(), DOC_UPDATE, DOC_WRITE_INDICES)
    with pytest.raises(DTypeError, match="update: expected a NumPy array, got list"):
        kv_cache_update(DOC_CACHE, DOC_UPDATE.tolist(), DOC_WRITE_INDICES)
