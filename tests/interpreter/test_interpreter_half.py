"""float16 conversions of the fast plan: the same bits as NumPy's casts, everywhere.

Golden values are NumPy's own ``astype`` results; the inputs cover every float16 value,
every tie between two neighbours, and each edge of the float32 ranges that round to a normal
float16, a subnormal one, infinity or NaN. (Every one of the 2^32 float32 bit patterns was
also checked once by hand, in chunks: no difference.)
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.support.compiled_helper import require_compiled_helper
from trt_kv.errors import DTypeError
from trt_kv.interpreter import half, native

_IMPLEMENTATIONS = {"recipes": half.RECIPES, "compiled": half.COMPILED}


@pytest.fixture(params=sorted(_IMPLEMENTATIONS))
def impl(request):
    """(widen, round_float16) of each implementation: NumPy's recipes, and the compiled
    helper (AVX2, FMA, F16C), which must have been built wherever a C compiler and that
    processor are."""
    pair = _IMPLEMENTATIONS[request.param]
    if pair is None:
        require_compiled_helper()
    return pair


@pytest.fixture
def widen(impl):
    return impl[0]


@pytest.fixture
def round_float16(impl):
    return impl[1]


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def _every_float16() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16)


def _reference(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def test_widen_gives_numpys_bits_for_every_float16_value(widen):
    h = _every_float16()
    np.testing.assert_array_equal(_bits(widen(h)), _bits(h.astype(np.float32)))


def test_widen_reads_strided_windows(widen):
    window = _every_float16().reshape(4, 128, 128)[:, :57, ::3]  # a cache window: not contiguous
    np.testing.assert_array_equal(_bits(widen(window)), _bits(window.astype(np.float32)))
    assert widen(window).shape == window.shape


@pytest.mark.parametrize(
    "window",
    [
        lambda c: c[:, :, :57],  # a cache window: runs of 57 * 64 elements, 128 * 64 apart
        lambda c: c[1:, 1:2, 3:99],  # one run per sequence
        lambda c: c[:, :, :1, :],  # one row per sequence and head
        lambda c: c[:, ::2, :40],  # heads skipped: runs still evenly spaced
        lambda c: c[:, :, 5:9, ::-1],  # reversed: copied first
        lambda c: c.transpose(0, 2, 1, 3)[:, :100],  # heads inside tokens: copied first
        lambda c: c[:2, :, :0],  # empty
    ],
)
def test_widen_reads_every_layout_of_a_cache(window, widen):
    """Windows of a ``[B, N, S_max, H]`` float16 cache holding every float16 value."""
    cache = np.resize(_every_float16(), (4, 3, 128, 64))
    view = window(cache)
    got = widen(view)
    assert got.shape == view.shape and got.dtype == np.float32
    np.testing.assert_array_equal(_bits(got), _bits(view.astype(np.float32)))


def test_round_float16_keeps_every_float16_value(round_float16):
    x = _every_float16().astype(np.float32)
    np.testing.assert_array_equal(_bits(round_float16(x)), _bits(x))


def test_round_float16_rounds_ties_to_even_and_neighbours_to_nearest(round_float16):
    """Midpoints between consecutive finite float16 values (ties), and one float32 ulp on
    either side of each, in both signs."""
    h = _every_float16()
    finite = np.sort(np.unique(h[np.isfinite(h)].astype(np.float32)))
    mid = (finite[:-1].astype(np.float64) + finite[1:]) / 2  # exact in float32 here
    mid = mid.astype(np.float32)
    x = np.concatenate(
        [mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))]
    )
    np.testing.assert_array_equal(_bits(round_float16(x)), _bits(_reference(x)))


def test_round_float16_at_the_edges_of_its_ranges(round_float16):
    """2^-14 (smallest normal), 2^-24 (smallest subnormal) and below, 65504 (largest),
    65520 (rounds to inf), inf, NaN with payloads, -0."""
    edges = np.array(
        [
            2.0**-14,
            2.0**-24,
            2.0**-25,
            2.0**-26,
            3 * 2.0**-26,
            1e-30,
            0.0,
            65504.0,
            65519.99,
            65520.0,
            65536.0,
            1e30,
            np.inf,
        ],
        np.float32,
    )
    around = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, np.inf)])
    nans = np.array([0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFC00000, 0xFFFFFFFF], np.uint32)
    x = np.tile(np.concatenate([around, -around, nans.view(np.float32)]), 64)  # the bit recipe
    np.testing.assert_array_equal(_bits(round_float16(x)), _bits(_reference(x)))


@pytest.mark.parametrize(
    "lo, hi",
    [
        (0x3F800000, 0x40000000),  # [1, 2): 2^13 ties of each parity, every neighbour
        (0x38000000, 0x38800000),  # [2^-15, 2^-14): subnormal results, some round up to 2^-14
        (0x38800000, 0x39000000),  # [2^-14, 2^-13): the smallest normal binade
        (0x47000000, 0x477FF000),  # [32768, 65520): the largest binade, below inf
        (0x477FF000, 0x47802000),  # [65520, 65600): rounds to inf
    ],
)
def test_round_float16_every_float32_of_the_binades_where_rules_change(lo, hi, round_float16):
    """Every float32 with these bit patterns, both signs, in one array."""
    u = np.arange(lo, hi, dtype=np.uint32)
    x = np.concatenate([u, u | np.uint32(0x80000000)]).view(np.float32)
    np.testing.assert_array_equal(_bits(round_float16(x)), _bits(_reference(x)))


def test_round_float16_known_values(round_float16):
    """Written out: ties go to the even neighbour, up or down; 65520 is the first to overflow;
    below 2^-24 halves, towards zero, keeping the sign."""
    x = np.array(
        [
            1 + 2.0**-11,
            1 + 3 * 2.0**-11,
            2048 + 1,
            2048 + 3,
            65504 + 15.99,
            65520,
            2.0**-25,
            3 * 2.0**-26,
            -(2.0**-26),
            2.0**-14 - 2.0**-25,
        ],
        np.float32,
    )
    want = np.array(
        [1, 1 + 2.0**-9, 2048, 2052, 65504, np.inf, 0, 2.0**-24, -0.0, 2.0**-14], np.float32
    )
    for size in (10, 4096):  # NumPy's casts, and the large-array path
        got = round_float16(np.tile(x, size // 10 + 1))[: x.size]
        np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("size", [1, 576, 1023, 1024, 1025, 4608, 12288, 73728])
@pytest.mark.parametrize("outlier", [None, np.inf, np.nan, 70000.0])
def test_round_float16_random_arrays_of_every_size(size, outlier, round_float16):
    """Sizes on both sides of the small-array cut; a few values below 2^-14, zeros of both
    signs and ties among normal values; with or without one element of the outlier path."""
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * np.exp(rng.uniform(-8, 8, size))).astype(np.float32)
    x = np.clip(x, -65000, 65000)
    picks = rng.integers(0, size, (4, max(1, size // 100)))
    x[picks[0]] *= np.float32(1e-5)
    x[picks[1]] = np.where(rng.random(picks.shape[1]) < 0.5, 0.0, -0.0)
    h = x[picks[2]].astype(np.float16)  # ties: halfway to the next float16 up
    x[picks[2]] = (
        h.astype(np.float64) + np.nextafter(h, np.float16(np.inf)).astype(np.float64)
    ) / 2
    if outlier is not None:
        x[picks[3, 0]] = outlier
    np.testing.assert_array_equal(_bits(round_float16(x)), _bits(_reference(x)))
    if size % 64 == 0:  # a transposed view: results in logical order
        view = x.reshape(-1, 64).T
        got = round_float16(view)
        assert got.shape == view.shape
        np.testing.assert_array_equal(_bits(got), _bits(_reference(view)))


def test_small_arrays_take_numpys_casts_with_the_same_results(widen, round_float16):
    h = _every_float16()[::4096]  # 16 values: below the size where the bit recipes start
    np.testing.assert_array_equal(_bits(widen(h)), _bits(h.astype(np.float32)))
    x = h.astype(np.float32) * np.float32(1.0001)
    np.testing.assert_array_equal(_bits(round_float16(x)), _bits(_reference(x)))


def test_round_float16_random_values_and_shapes(round_float16):
    rng = np.random.default_rng(0)
    shape = (3, 50, 70)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-20, 12, shape))).astype(np.float32)
    strided = x[:, ::2]
    got = round_float16(strided)
    assert got.shape == strided.shape and got.dtype == np.float32
    np.testing.assert_array_equal(_bits(got), _bits(_reference(strided)))


@pytest.mark.parametrize("size", [16, 4096])
@pytest.mark.parametrize("dtype", [">f2", ">f4", "<f8", "<i2", "<i4"])
def test_other_dtypes_are_refused_before_any_read(dtype, size, widen, round_float16):
    """The compiled helper reads raw memory: another dtype (or byte order) would be read as
    garbage or past its end. Every implementation refuses it, naming the argument."""
    a = np.zeros(size, dtype)
    for function, name, wanted in ((widen, "h", "<f2"), (round_float16, "x", "<f4")):
        if a.dtype.str != wanted:
            with pytest.raises(
                DTypeError, match=rf"^{name}: expected dtype {wanted}, got {dtype}$"
            ):
                function(a)


_CACHE = np.zeros((4, 3, 128, 64), np.float16)  # [B, N, S_max, H]


@pytest.mark.parametrize(
    ("view", "runs"),
    [
        (_CACHE, (1, 0, 4 * 3 * 128 * 64)),
        (_CACHE[:, :, :57], (12, 128 * 64, 57 * 64)),
        (_CACHE[1:, 1:2, 3:99], (3, 3 * 128 * 64, 96 * 64)),
        (_CACHE[:, :, :1, :], (12, 128 * 64, 64)),
        (_CACHE[2, 1, 7], (1, 0, 64)),
        (_CACHE[:, :, :, :5], (4 * 3 * 128, 64, 5)),
        (_CACHE[:, ::2, :40], None),  # heads 0, 2 of each sequence: not evenly spaced
        (_CACHE[:, :, 5:9, ::-1], None),
        (_CACHE.transpose(0, 2, 1, 3), None),
        (_CACHE[::-1], None),  # sequences in reverse: a negative stride
    ],
)
def test_strided_runs_of_cache_windows(view, runs):
    assert native.strided_runs(view) == runs


def _misaligned_float16(count: int) -> np.ndarray:
    raw = np.zeros(2 * count + 1, np.uint8)
    return np.frombuffer(raw.data, np.float16, count=count, offset=1)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(1000, dtype=np.float32),
        lambda: np.arange(1000, dtype=np.float32)[10:],  # a view, 40 bytes in
        lambda: np.arange(1000, dtype=np.float32)[::2],
        lambda: np.arange(1000, dtype=np.float32).reshape(20, 50).T,
        lambda: _CACHE[:, :, :7],  # a cache window: no buffer to export
        lambda: _misaligned_float16(100),
    ],
    ids=["contiguous", "offset", "strided", "transposed", "window", "misaligned"],
)
@pytest.mark.parametrize("writeable", [True, False])
def test_address_is_numpys_data_pointer(make, writeable):
    a = make()
    a.flags.writeable = writeable
    assert native.address(a) == a.ctypes.data


def test_widen_of_short_runs_and_misaligned_arrays(widen):
    """Runs shorter than the helper's minimum, and float16 at an odd address, are copied to
    a contiguous aligned array first: the values are NumPy's either way."""
    cache = np.resize(_every_float16(), (4, 3, 128, 64))
    short = cache[:, :, :, :5]
    np.testing.assert_array_equal(_bits(widen(short)), _bits(short.astype(np.float32)))
    odd = _misaligned_float16(4096)
    odd_bits = odd.view(np.uint16)
    assert not odd.flags.aligned
    np.copyto(odd_bits, _every_float16()[::16].view(np.uint16))
    np.testing.assert_array_equal(_bits(widen(odd)), _bits(odd.astype(np.float32)))


def _compile(source: str, out: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in library")
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(src)], check=True)


def _stand_in(ready: int, digest: str) -> str:
    """C source of a library with the helper's 20 symbols (functions that do nothing)."""
    return (
        f"int trt_kv_native_ready(void) {{ return {ready}; }}\n"
        f'const char *trt_kv_native_source(void) {{ return "{digest}"; }}\n'
        "void trt_kv_round_float16(void) {}\nvoid trt_kv_widen_float16(void) {}\n"
        "void trt_kv_product_float16(void) {}\nvoid trt_kv_product_float32(void) {}\n"
        "int trt_kv_panels_float16(void) { return 0; }\n"
        "int trt_kv_panels_float32(void) { return 0; }\n"
        "int trt_kv_panels_wide_float16(void) { return 0; }\n"
        "int trt_kv_panels_wide_float32(void) { return 0; }\n"
        "int trt_kv_native_wide(void) { return 0; }\n"
        "int trt_kv_attention_float32(void) { return 0; }\n"
        "void trt_kv_rope_float32(void) {}\nvoid trt_kv_sigmoid_float32(void) {}\n"
        "void trt_kv_decode_heads(void) {}\n"
        "int trt_kv_blocks_product(void) { return 0; }\n"
        "int trt_kv_blocks_panels(void) { return 0; }\n"
        "void trt_kv_rms_norm(void) {}\nvoid trt_kv_add_rms_norm(void) {}\n"
        "void trt_kv_swiglu(void) {}\n"
    )


_OLDER_SOURCE = hashlib.sha256(b"another version of _native.c").hexdigest()


@pytest.mark.parametrize(
    ("library", "loads"),
    [
        ("int unrelated(void) { return 1; }\n", False),  # foreign: none of the symbols
        (_stand_in(native.SIGNATURES + 1, "{digest}"), False),  # other signatures
        (_stand_in(native.SIGNATURES, _OLDER_SOURCE), False),  # an older checkout
        (_stand_in(0, "{digest}"), False),  # a processor without AVX2, FMA or F16C
        ("not a library", False),
        (_stand_in(native.SIGNATURES, "{digest}"), True),
    ],
    ids=["foreign", "signatures", "source", "processor", "text", "own"],
)
def test_loader_takes_only_a_build_of_its_signatures_and_source(tmp_path, library, loads):
    path = tmp_path / f"_native{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    library = library.replace("{digest}", native.source_digest())
    if library.startswith("not"):
        path.write_text(library)
    else:
        _compile(library, path)
    assert (native.load(tmp_path) is not None) is loads


def test_loader_goes_on_past_a_library_it_cannot_use(tmp_path):
    """The first suffix holds a foreign library, the last one a usable build: it loads."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    if len(suffixes) < 2:
        pytest.skip(f"one extension suffix here: {suffixes}")
    _compile("int unrelated(void) { return 1; }\n", tmp_path / f"_native{suffixes[0]}")
    own = _stand_in(native.SIGNATURES, native.source_digest())
    _compile(own, tmp_path / f"_native{suffixes[-1]}")
    assert native.load(tmp_path) is not None


def test_the_packaged_build_is_of_this_source():
    """A build left from an older ``_native.c`` is not loaded (the recipes run instead):
    rebuild it after a checkout that changed the C file."""
    digest = native.source_digest().encode()
    for build in native.built_files():
        lib = ctypes.CDLL(str(build))
        lib.trt_kv_native_source.restype = ctypes.c_char_p
        assert lib.trt_kv_native_source() == digest, (
            f"{build.name} was built from another {native.SOURCE.name}: rebuild it "
            "(pip install -e . or python setup.py build_ext --inplace)"
        )
