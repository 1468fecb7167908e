"""Weights kept quantized: GGUF blocks read as stored (each type against gguf's own
dequantization), build-time quantization, the interpreter's ``IDequantizeLayer`` against
NumPy, the quantized product in a network, and the real TensorRT-RTX builder on it."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from trt_kv._trt import trt
from trt_kv.builder import Profile, build_engine, create_network
from trt_kv.checkpoints.gguf_blocks import keep_quantized
from trt_kv.errors import ArgumentError
from trt_kv.interpreter import compile_network
from trt_kv.jobs import BuildOptions
from trt_kv.models.llama.graph import Graph
from trt_kv.quantization import QuantizedMatrix, quantize_asymmetric4, quantize_symmetric
from trt_kv.quantization.blocks import pack_int4, unpack_int4
from trt_kv.quantization.network import quantized_linear
from trt_kv.quantization.storage import check_weight_format

RNG = np.random.default_rng(34)
N, K = 16, 256


def _gguf(type_name: str, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(raw bytes, gguf's float32 dequantization) of ``w`` quantized by gguf itself."""
    kind = GGMLQuantizationType[type_name]
    raw = quants.quantize(w, kind)
    return raw, quants.dequantize(raw, kind).reshape(w.shape)


# K-quant blocks of random bytes with sane float16 super-scales: (bytes per 256, offsets of
# the float16 fields); gguf cannot quantize these types, but it dequantizes them.
_K_BLOCKS = {"Q2_K": (84, (80, 82)), "Q3_K": (110, (108,)), "Q4_K": (144, (0, 2))}
_K_BLOCKS |= {"Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}


def _k_quant(type_name: str) -> tuple[np.ndarray, np.ndarray]:
    size, fields = _K_BLOCKS[type_name]
    raw = RNG.integers(0, 256, (N, K // 256, size), dtype=np.uint8)
    for offset in fields:
        raw[..., offset : offset + 2] = np.array([0.01], np.float16).view(np.uint8)
    raw = raw.reshape(N, -1)
    kind = GGMLQuantizationType[type_name]
    return raw, quants.dequantize(raw, kind).reshape(N, K)


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1"])
def test_exact_gguf_types_dequantize_bit_for_bit_as_gguf(type_name):
    raw, expected = _gguf(type_name, RNG.standard_normal((N, K)).astype(np.float32))
    q = keep_quantized(type_name, raw, (N, K), lambda: pytest.fail("re-quantized"))
    assert q.bits == (8 if type_name == "Q8_0" else 4) and q.max_error == 0.0
    assert np.array_equal(q.dequantize().view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("type_name", ["Q5_0", "Q5_1", *_K_BLOCKS])
def test_other_gguf_types_are_requantized_with_their_error_recorded(type_name):
    if type_name in _K_BLOCKS:
        raw, expected = _k_quant(type_name)
    else:
        raw, expected = _gguf(type_name, RNG.standard_normal((N, K)).astype(np.float32))
    q = keep_quantized(type_name, raw, (N, K), lambda: expected)
    error = np.abs(q.dequantize() - expected).max()
    assert q.source == type_name and q.max_error == pytest.approx(error)
    four_bits = type_name in ("Q2_K", "Q3_K", "Q4_K")
    assert q.bits == (4 if four_bits else 8) and (q.mins is not None) == four_bits
    # at most half a code step of the block's scale, plus the float16 rounding of d and m
    step = np.repeat(q.scales, q.block, axis=1)
    assert np.all(np.abs(q.dequantize() - expected) <= 0.5 * step + 2e-3 * np.abs(expected) + 1e-6)


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
    assert packed[0] == (codes[0, 0] & 0xF) | ((codes[0, 1] & 0xF) << 4)
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
    from tiny_models import TINY_HF_CONFIG

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
