"""Weights kept quantized: GGUF blocks read as stored (each type against gguf's own
dequantization), build-time quantization, the interpreter's ``IDequantizeLayer`` against
NumPy, the quantized product in a network, and the real TensorRT-RTX builder on it."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from trt_kv import dtypes
from trt_kv._trt import trt
from trt_kv.builder import Profile, build_engine, create_network
from trt_kv.checkpoints.gguf_blocks import keep_quantized
from trt_kv.cli.inspect import weights_line
from trt_kv.engine.store import BuildOptions
from trt_kv.errors import ArgumentError
from trt_kv.interpreter import compile_network
from trt_kv.models.layers.graph import Graph
from trt_kv.quantization import QuantizedMatrix, quantize_asymmetric4, quantize_symmetric
from trt_kv.quantization.blocks import pack_int4, unpack_int4
from trt_kv.quantization.network import block_offsets, quantized_linear
from trt_kv.quantization.storage import check_weight_format, weight_storage

RNG = np.random.default_rng(34)
N, K = 16, 256


def _gguf(type_name: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(raw bytes, gguf's float32 dequantization) of ``w`` quantized by gguf itself."""
    kind = GGMLQuantizationType[type_name]
    raw = quants.quantize(w, kind)
    return raw, quants.dequantize(raw, kind).reshape(w.shape)


# types gguf cannot quantize: (bytes per block, offsets of the float16 scales)
_HAND_BUILT = {"Q2_K": (84, (80, 82)), "Q3_K": (110, (108,)), "Q4_K": (144, (0, 2))}
_HAND_BUILT |= {"Q5_K": (176, (0, 2)), "Q6_K": (210, (208,)), "IQ4_NL": (18, (0,))}
_HAND_BUILT |= {"IQ4_XS": (136, (0,)), "IQ2_XXS": (66, (0,))}


def _hand_built(type_name: str, n: int = N, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    """Random blocks of a type gguf dequantizes but cannot quantize: random bytes, but
    positive float16 super-scales (as llama.cpp writes them) at their offsets."""
    size, fields = _HAND_BUILT[type_name]
    weights = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]
    raw = RNG.integers(0, 256, (n, k // weights, size), dtype=np.uint8)
    for offset in fields:
        scale = (RNG.random((n, k // weights, 1)) * 0.02 + 1e-3).astype(np.float16)
        raw[..., offset : offset + 2] = scale.view(np.uint8)
    raw = raw.reshape(n, -1)
    kind = GGMLQuantizationType[type_name]
    return raw, quants.dequantize(raw, kind).reshape(n, k)


def _stored(type_name: str, n: int = N, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    """(raw bytes, gguf's float32 dequantization) of a random ``[n, k]`` matrix."""
    if type_name in _HAND_BUILT:
        return _hand_built(type_name, n, k)
    return _gguf(type_name, RNG.standard_normal((n, k)).astype(np.float32))


# every type mapped exactly: (bits, block) of its held codes
EXACT = {"Q8_0": (8, 32), "Q4_0": (4, 32), "Q4_1": (4, 32), "Q5_0": (8, 32), "Q5_1": (8, 32)}
EXACT |= {"Q4_K": (4, 32), "Q5_K": (8, 32), "Q6_K": (8, 16), "Q3_K": (4, 16), "Q2_K": (4, 16)}
EXACT |= {"IQ4_NL": (8, 32), "IQ4_XS": (8, 32), "TQ2_0": (4, 32), "MXFP4": (8, 32)}


@pytest.mark.parametrize("type_name", list(EXACT))
def test_exact_gguf_types_dequantize_bit_for_bit_as_gguf(type_name):
    """The held codes, float32 scales and minimums give gguf's float32 values bit for bit
    (see trt_kv/quantization/blocks.py: every product before the minimum's sum is exact)."""
    raw, expected = _stored(type_name)
    q = keep_quantized(type_name, raw, (N, K), lambda: pytest.fail("re-quantized"))
    assert (q.bits, q.block) == EXACT[type_name] and q.exact and q.max_error == 0.0
    lo, hi = (-8, 7) if q.bits == 4 else (-128, 127)
    assert lo <= q.codes.min() and q.codes.max() <= hi and q.source == type_name
    assert np.array_equal(q.dequantize().view(np.uint32), expected.view(np.uint32))


def _network_weight(q: QuantizedMatrix, dtype: str) -> np.ndarray:
    """The weight ``[N, K]`` a ``dtype`` network holds for ``q``: the interpreter's product
    of the network with the identity (``I W^T = W^T``), in float32."""
    k = q.shape[1]
    _, net = create_network()
    g = Graph(net, dtype)
    x = net.add_input("x", dtypes.to_trt(dtype), (-1, k))
    y = quantized_linear(g, x, q)
    y.name = "y"
    net.mark_output(y)
    out = compile_network(net).run({"x": np.eye(k, dtype=dtypes.to_numpy(dtype))})["y"]
    return out.T.astype(np.float32)


@pytest.mark.parametrize("type_name", list(EXACT))
def test_network_weight_of_each_exact_type_is_ggufs(type_name):
    """The weight as the network holds it: ``fl(d) c`` from the ``IDequantizeLayer`` plus
    the block offset ``o = fl(zero d + m)`` of the minimum's product, against gguf's
    ``w = fl(d q + m)`` (``u`` the dtype's unit roundoff).

    float32: ``d c`` is exact, so a type without offsets is gguf's bit for bit; with one,
    ``fl(d c + fl(o))`` is within ``u |o| + u |d c + o|`` of the exact ``d c + o`` and gguf
    within ``u |w|``: at most ``2 u (|o| + |d c| + |w|)``.
    float16 (``u = 2^-11``): ``fl(d)`` off by ``u |d c|``, the dequantized product rounded
    (``u |d c|``), ``o`` rounded (``u |o|``), the sum rounded (``u (|d c| + |o|)``):
    ``u (3 |d c| + 2 |o|)`` to first order (1% slack for the second), plus gguf's float32
    ``2^-24 |w|`` and half a float16 subnormal step per rounding."""
    raw, expected = _stored(type_name)
    q = keep_quantized(type_name, raw, (N, K), lambda: pytest.fail("re-quantized"))
    dc = np.abs(np.repeat(q.scales, q.block, axis=1) * q.codes.astype(np.float32))
    o = np.abs(np.repeat(block_offsets(q), q.block, axis=1))
    w32 = _network_weight(q, "float32")
    if not o.any():
        assert np.array_equal(w32, expected)
    assert np.all(np.abs(w32 - expected) <= 2**-23 * (o + dc + np.abs(expected)))
    w16 = _network_weight(q, "float16")
    bound = 2**-11 * 1.01 * (3 * dc + 2 * o) + 2**-24 * np.abs(expected) + 3 * 2**-25
    assert np.all(np.abs(w16 - expected) <= bound)


REQUANTIZED = ["TQ1_0", "IQ2_XXS"]  # ternary in base 3; a sign and lattice codebook


@pytest.mark.parametrize("type_name", REQUANTIZED)
def test_other_gguf_types_are_requantized_with_their_error_recorded(type_name):
    raw, expected = _stored(type_name)
    q = keep_quantized(type_name, raw, (N, K), lambda: expected)
    error = np.abs(q.dequantize() - expected).max()
    assert q.source == type_name and q.max_error == pytest.approx(error) and not q.exact
    assert q.bits == 4 and q.mins is not None
    # at most half a code step of the block's scale, plus the float16 rounding of d and m
    step = np.repeat(q.scales, q.block, axis=1)
    assert np.all(np.abs(q.dequantize() - expected) <= 0.5 * step + 2e-3 * np.abs(expected) + 1e-6)


def test_the_sidecar_says_which_types_are_exact_and_the_error_of_the_others():
    raw, _ = _stored("Q4_K")
    exact = keep_quantized("Q4_K", raw, (N, K), lambda: pytest.fail("re-quantized"))
    raw, expected = _stored("IQ2_XXS")
    requantized = keep_quantized("IQ2_XXS", raw, (N, K), lambda: expected)
    tensors = {"a": np.zeros((N, K)), "b": np.zeros((N, K)), "norm": np.zeros(K)}
    storage = weight_storage(tensors, {"a": exact, "b": requantized}, "keep", "float16")
    assert storage["exact"] == ["Q4_K"]
    error = requantized.max_error
    assert error > 0.0 and storage["requantized"] == {
        "count": 1, "max_error": error, "by_type": {"IQ2_XXS": error}
    }  # fmt: skip
    line = weights_line(storage)
    assert "exact: Q4_K" in line and f"1 re-quantized (max error IQ2_XXS {error:.3g})" in line


def test_float_types_and_odd_widths_stay_float():
    w = RNG.standard_normal((N, K)).astype(np.float32)
    assert keep_quantized("F16", w.astype(np.float16), (N, K), lambda: w) is None
    assert keep_quantized("Q8_0", np.zeros((N, 17), np.uint8), (N, 16), lambda: w) is None


@pytest.mark.parametrize("bits", [4, 8])
def test_symmetric_quantization_is_within_half_a_step(bits):
    w = RNG.standard_normal((N, K)).astype(np.float32)
    q = quantize_symmetric(w, bits)
    top = 2 ** (bits - 1) - 1
    assert q.codes.min() >= -top and q.codes.max() <= top and q.mins is None
    step = np.repeat(q.scales, q.block, axis=1)
    assert np.all(np.abs(q.dequantize() - w) <= 0.5 * step * 1.001)
    assert q.max_error == pytest.approx(np.abs(q.dequantize() - w).max())


def test_int4_packing_round_trips_low_nibble_first():
    codes = RNG.integers(-8, 8, (4, 64)).astype(np.int8)
    packed = pack_int4(codes)
    assert packed.size == codes.size // 2
    assert packed[0] == (int(codes[0, 0]) & 0xF) | ((int(codes[0, 1]) & 0xF) << 4)
    assert np.array_equal(unpack_int4(packed, codes.size).reshape(codes.shape), codes)


def test_quantized_matrix_refuses_mismatched_scales():
    with pytest.raises(Exception, match="scales"):
        QuantizedMatrix(np.zeros((4, 64), np.int8), np.zeros((4, 3), np.float32), 8)


def _dequantize_network(codes, scale, bits, axis, dtype):
    _, net = create_network()
    scale_dtype = np.float16 if dtype == "float16" else np.float32
    keep = [pack_int4(codes) if bits == 4 else codes, scale.astype(scale_dtype)]
    kind = trt.int4 if bits == 4 else trt.int8
    c = net.add_constant(codes.shape, trt.Weights(kind, keep[0].ctypes.data, codes.size))
    sdt = trt.float16 if dtype == "float16" else trt.float32
    s = net.add_constant(scale.shape, trt.Weights(sdt, keep[1].ctypes.data, scale.size))
    layer = net.add_dequantize(c.get_output(0), s.get_output(0), sdt)
    layer.axis = axis
    out = layer.get_output(0)
    out.name = "w"
    net.mark_output(out)
    return net, keep


SCALES = {
    "block": lambda n, k: (RNG.random((n, k // 32)) * 0.1, 1),
    "channel": lambda n, k: (RNG.random((n,)) * 0.1, 0),
    "tensor": lambda n, k: (np.array(0.037), 0),
}


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("scales", list(SCALES))
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("fast", [True, False])
def test_interpreter_dequantize_is_numpy_bit_for_bit(bits, scales, dtype, fast):
    lo, hi = (-8, 8) if bits == 4 else (-128, 128)
    codes = RNG.integers(lo, hi, (8, 64)).astype(np.int8)
    scale, axis = SCALES[scales](8, 64)
    net, keep = _dequantize_network(codes, scale, bits, axis, dtype)
    out = compile_network(net, fast=fast).run({})["w"]
    s = keep[1].astype(np.float32)
    if scales == "block":
        s = np.repeat(s, 32, axis=1)
    elif scales == "channel":
        s = s[:, None]
    expected = (codes.astype(np.float32) * s).astype(np.dtype(dtype))
    assert out.dtype == np.dtype(dtype)
    assert np.array_equal(out, expected)


QUANTIZERS = {
    "int8": lambda w: quantize_symmetric(w, 8),
    "int4": lambda w: quantize_symmetric(w, 4),
    "int4+mins": lambda w: quantize_asymmetric4(w, "Q4_K"),
}


@pytest.mark.parametrize("kind", list(QUANTIZERS))
@pytest.mark.parametrize("rank", [2, 3])
def test_quantized_linear_is_the_product_with_the_dequantized_matrix(kind, rank):
    q = QUANTIZERS[kind](RNG.standard_normal((48, 128)).astype(np.float32))
    _, net = create_network()
    g = Graph(net, "float32")
    x = net.add_input("x", trt.float32, (-1,) * (rank - 1) + (128,))
    y = quantized_linear(g, x, q)
    y.name = "y"
    net.mark_output(y)
    xv = RNG.standard_normal((2, 3, 128)[3 - rank :]).astype(np.float32)
    expected = xv.astype(np.float64) @ q.dequantize().astype(np.float64).T
    for fast in (True, False):
        out = compile_network(net, fast=fast).run({"x": xv})["y"]
        assert out.shape == expected.shape
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", ["int4", "int4+mins"])
def test_tensorrt_builds_the_quantized_product(kind):
    """The real builder: an INT4 product (with minimums too) builds; alone in a network, the
    symmetric one holds its codes in about half a byte per weight, not the two of float16
    (one with minimums is folded to float16 here, though not in a whole decoder: see
    scripts/bench_build.py)."""
    w = RNG.standard_normal((256, 512)).astype(np.float32)
    sizes = {}
    for name, q in {kind: QUANTIZERS[kind](w), "float16": None}.items():
        builder, net = create_network()
        g = Graph(net, "float16")
        x = net.add_input("x", trt.float16, (-1, 512))
        y = quantized_linear(g, x, q) if q else g.linear(x, g.const(w))
        y.name = "y"
        net.mark_output(y)
        profile = Profile("p", {"x": ((1, 512), (1, 512), (64, 512))})
        sizes[name] = len(build_engine(builder, net, [profile]).data)
    if kind == "int4":
        assert sizes["int4"] < 0.5 * sizes["float16"]


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_0", "Q3_K", "Q6_K"])
def test_tensorrt_builds_exact_gguf_products(type_name):
    """An exactly-mapped GGUF matrix ``[256, 512]`` (INT4 block 32 with minimums, INT8
    block 32, INT4 block 16, INT8 block 16): the real builder builds its float16 product,
    and a symmetric INT4 one keeps its codes in about half a byte per weight; the
    interpreter's float32 product is ``x W^T`` of gguf's dequantized ``W`` within float32
    rounding (a dot product of K terms: ``K u`` times the sum of the magnitudes of the
    products it adds, the offsets' included)."""
    n, k = 256, 512
    raw, w = _stored(type_name, n, k)
    q = keep_quantized(type_name, raw, (n, k), lambda: pytest.fail("re-quantized"))
    sizes = {}
    for name, weight in {type_name: q, "float16": None}.items():
        builder, net = create_network()
        g = Graph(net, "float16")
        x = net.add_input("x", trt.float16, (-1, k))
        y = quantized_linear(g, x, weight) if weight else g.linear(x, g.const(w))
        y.name = "y"
        net.mark_output(y)
        profile = Profile("p", {"x": ((1, k), (1, k), (64, k))})
        sizes[name] = len(build_engine(builder, net, [profile]).data)
    if q.bits == 4 and q.mins is None:
        assert sizes[type_name] < 0.5 * sizes["float16"]
    _, net = create_network()
    x = net.add_input("x", trt.float32, (-1, k))
    y = quantized_linear(Graph(net, "float32"), x, q)
    y.name = "y"
    net.mark_output(y)
    xv = RNG.standard_normal((8, k)).astype(np.float32)
    out = compile_network(net).run({"x": xv})["y"]
    expected = xv.astype(np.float64) @ w.astype(np.float64).T
    o = np.abs(np.repeat(block_offsets(q), q.block, axis=1))
    scale = np.abs(xv) @ (np.abs(w) + 2 * o).T
    assert np.all(np.abs(out - expected) <= k * 2**-24 * scale)


def test_weight_format_is_checked_and_names_the_engine():
    assert check_weight_format(None, "float16") is None
    assert check_weight_format("float16", "float16") is None
    assert check_weight_format("keep", "float16") == "keep"
    for bad in ("bfloat16", "int3", ""):
        with pytest.raises(ArgumentError, match="weights"):
            check_weight_format(bad, "float16")
    assert "weights_keep" in BuildOptions(weight_format="keep").key()
    assert "weights" not in BuildOptions().key()


def _layer_types(net):
    return [str(net.network.get_layer(i).type) for i in range(net.network.num_layers)]


def test_weights_in_the_activation_dtype_build_the_float_network_unchanged():
    """The default (and ``weight_format`` equal to the dtype) adds no quantization layer and
    keeps both profiles; ``int4`` puts one dequantization before each of the 14 products."""
    from tests.support.tiny_models import TINY_HF_CONFIG
    from trt_kv.models.llama import LlamaConfig, build_llama_network, random_weights

    config = LlamaConfig.from_hf(TINY_HF_CONFIG)
    weights = random_weights(config, seed=1)
    build = lambda fmt: build_llama_network(config, weights, max_seq_len=16, weight_format=fmt)  # noqa: E731
    plain, same, int4 = build(None), build("float16"), build("int4")
    assert _layer_types(plain) == _layer_types(same)
    assert "LayerType.DEQUANTIZE" not in _layer_types(plain)
    assert [p.name for p in plain.profiles] == ["decode", "prefill"]
    assert plain.metadata()["weights"]["format"] == "float16" and not plain.weight_format
    assert _layer_types(int4).count("LayerType.DEQUANTIZE") == 14
    assert [p.name for p in int4.profiles] == ["steps"]
