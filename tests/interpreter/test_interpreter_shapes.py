"""Interpreter: constant, shape, fill, shuffle, slice, concatenation, gather, squeeze and
unsqueeze layers."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.support.interpreter_support import Net, rand
from trt_kv._trt import trt
from trt_kv.errors import ShapeError
from trt_kv.interpreter import execute

S = trt.SampleMode


def test_constant_float16_weights_come_back_exactly():
    w = rand(3, 4, dtype="float16")
    net = Net()
    net.mark(net.const(w))
    out = net.run({})["out"]
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, w)


def test_constant_bfloat16_weights_come_back_exactly():
    w = rand(2, 5, dtype="bfloat16")
    net = Net()
    x = net.input("x", "bfloat16", (2, 5))
    net.mark(
        net.network.add_elementwise(x, net.const(w), trt.ElementWiseOperation.SUM).get_output(0)
    )
    out = net.run({"x": np.zeros((2, 5), ml_dtypes.bfloat16)})["out"]
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out, w)


def test_constant_int64_weights_keep_their_dtype():
    net = Net()
    x = net.input("x", "int64", (3,))
    c = net.const(np.array([10, 20, 30], np.int64))
    net.mark(net.network.add_elementwise(x, c, trt.ElementWiseOperation.SUM).get_output(0))
    out = net.run({"x": np.array([1, 2, 3], np.int64)})["out"]
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [11, 22, 33])


def test_shape_gives_runtime_dims_as_int64():
    net = Net()
    x = net.input("x", "float32", (-1, 3))
    net.mark(net.network.add_shape(x).get_output(0))
    out = net.run({"x": np.zeros((5, 3), np.float32)})["out"]
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [5, 3])


def test_fill_linspace_static_counts_from_alpha_by_beta():
    net = Net()
    layer = net.network.add_fill((6,), trt.FillOperation.LINSPACE, trt.int32)
    layer.alpha, layer.beta = 3, 2
    x = net.input("x", "int32", (6,))
    net.mark(
        net.network.add_elementwise(
            x, layer.get_output(0), trt.ElementWiseOperation.SUM
        ).get_output(0)
    )
    np.testing.assert_array_equal(
        net.run({"x": np.zeros(6, np.int32)})["out"], 3 + 2 * np.arange(6)
    )


def test_fill_linspace_with_dynamic_shape_is_arange_per_axis():
    """``out[i, j] = start + delta[0] * i + delta[1] * j``, the 2-D example of the docs."""
    net = Net()
    x = net.input("x", "float32", (-1, -1))
    layer = net.network.add_fill((0, 0), trt.FillOperation.LINSPACE, trt.float32)
    layer.set_input(0, net.network.add_shape(x).get_output(0))
    layer.set_input(1, net.const(np.array(1.0, np.float32)))
    layer.set_input(2, net.const(np.array([100.0, 10.0], np.float32)))
    net.mark(
        net.network.add_elementwise(
            x, layer.get_output(0), trt.ElementWiseOperation.SUM
        ).get_output(0)
    )
    out = net.run({"x": np.zeros((3, 4), np.float32)})["out"]
    np.testing.assert_array_equal(out, 1 + 100 * np.arange(3)[:, None] + 10 * np.arange(4))


def _shuffle(
    x: np.ndarray, configure: object, reshape_input: np.ndarray | None = None
) -> np.ndarray:
    net = Net()
    layer = net.network.add_shuffle(net.input("x", "float32", x.shape))
    if reshape_input is not None:
        layer.set_input(1, net.const(reshape_input))
    configure(layer)
    net.mark(layer.get_output(0))
    return net.run({"x": x})["out"]


def test_shuffle_transpose_reshape_transpose_in_order():
    x = rand(2, 3, 4)

    def configure(layer: object) -> None:
        layer.first_transpose = (2, 0, 1)  # CHW -> HWC, as the docs' example
        layer.reshape_dims = (4, 6)
        layer.second_transpose = (1, 0)

    expected = x.transpose(2, 0, 1).reshape(4, 6).transpose(1, 0)
    np.testing.assert_array_equal(_shuffle(x, configure), expected)


def test_shuffle_zero_copies_input_dim_and_minus_one_infers():
    x = rand(2, 3, 4)

    def configure(layer: object) -> None:
        layer.reshape_dims = (0, -1)

    np.testing.assert_array_equal(_shuffle(x, configure), x.reshape(2, 12))


def test_shuffle_reshape_from_second_input():
    x = rand(2, 3, 4)
    out = _shuffle(x, lambda layer: None, np.array([4, 3, 2], np.int64))
    np.testing.assert_array_equal(out, x.reshape(4, 3, 2))


def _slice(
    x: np.ndarray, start: tuple, shape: tuple, stride: tuple, mode: object = S.STRICT_BOUNDS
):
    net = Net()
    layer = net.network.add_slice(net.input("x", "float32", x.shape), start, shape, stride)
    layer.mode = mode
    net.mark(layer.get_output(0))
    return net.run({"x": x})["out"]


def test_slice_start_shape_stride():
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    np.testing.assert_array_equal(_slice(x, (1, 0, 1), (2, 2, 2), (1, 2, 2)), x[1:3, 0:4:2, 1:5:2])


def test_slice_negative_stride_walks_backwards():
    x = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(_slice(x, (5,), (3,), (-2,)), [5, 3, 1])


def test_slice_clamp_mode_repeats_the_edge():
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(_slice(x, (2,), (4,), (1,), S.CLAMP), [2, 3, 3, 3])


def test_slice_wrap_mode_wraps_around():
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(_slice(x, (2,), (4,), (1,), S.WRAP), [2, 3, 0, 1])


def test_slice_fill_mode_fills_out_of_bounds_with_zero_by_default():
    x = np.arange(1, 5, dtype=np.float32)
    np.testing.assert_array_equal(_slice(x, (2,), (4,), (1,), S.FILL), [3, 4, 0, 0])


def test_slice_strict_bounds_refuses_out_of_bounds_start():
    x = np.arange(4, dtype=np.float32)
    net = Net()
    layer = net.network.add_slice(net.input("x", "float32", x.shape), (0,), (2,), (1,))
    layer.set_input(1, net.network.add_shape(net.input("y", "float32", (-1,))).get_output(0))
    net.mark(layer.get_output(0))
    with pytest.raises(ShapeError, match="slice axis 0"):
        execute(net.network, {"x": x, "y": np.zeros(3, np.float32)})


def test_slice_dynamic_start_and_size_from_inputs():
    """Start is computed at run time (the shape of ``y``), size is a tensor input."""
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    net = Net()
    layer = net.network.add_slice(net.input("x", "float32", (4, 5)), (0, 0), (1, 1), (1, 1))
    layer.set_input(1, net.network.add_shape(net.input("y", "float32", (-1, -1))).get_output(0))
    layer.set_input(2, net.const(np.array([2, 3], np.int64)))
    net.mark(layer.get_output(0))
    out = net.run({"x": x, "y": np.zeros((1, 2), np.float32)})["out"]
    np.testing.assert_array_equal(out, x[1:3, 2:5])


def test_concatenation_joins_along_axis():
    a, b = rand(2, 3, seed=1), rand(2, 2, seed=2)
    net = Net()
    layer = net.network.add_concatenation(
        [net.input("a", "float32", a.shape), net.input("b", "float32", b.shape)]
    )
    layer.axis = 1
    net.mark(layer.get_output(0))
    np.testing.assert_array_equal(net.run({"a": a, "b": b})["out"], np.concatenate([a, b], 1))


def _gather(data: np.ndarray, idx: np.ndarray, axis: int, configure: object = None) -> np.ndarray:
    net = Net()
    layer = net.network.add_gather(
        net.input("data", "float32", data.shape), net.input("idx", "int32", idx.shape), axis
    )
    if configure is not None:
        configure(layer)
    net.mark(layer.get_output(0))
    return net.run({"data": data, "idx": idx})["out"]


def test_gather_default_takes_rows_like_an_embedding():
    table = rand(10, 4)
    ids = np.array([[3, 0, 9], [1, 1, 2]], np.int32)
    np.testing.assert_array_equal(_gather(table, ids, 0), table[ids])


def test_gather_default_on_inner_axis():
    data = rand(2, 5, 3)
    idx = np.array([4, 0], np.int32)
    np.testing.assert_array_equal(_gather(data, idx, 1), data[:, idx])


def test_gather_default_with_one_elementwise_dim_is_per_batch():
    data = rand(2, 5, 3)
    idx = np.array([[4, 1], [0, 0]], np.int32)

    def configure(layer: object) -> None:
        layer.num_elementwise_dims = 1

    expected = np.stack([data[0, [4, 1]], data[1, [0, 0]]])
    np.testing.assert_array_equal(_gather(data, idx, 1, configure), expected)


def test_gather_element_mode_is_take_along_axis():
    data = rand(3, 4)
    idx = np.array([[0, 3], [1, 1], [2, 0]], np.int32)

    def configure(layer: object) -> None:
        layer.mode = trt.GatherMode.ELEMENT

    np.testing.assert_array_equal(
        _gather(data, idx, 1, configure), np.take_along_axis(data, idx, axis=1)
    )


def test_gather_nd_mode_picks_by_coordinates():
    data = rand(3, 4, 2)
    idx = np.array([[0, 1], [2, 3]], np.int32)

    def configure(layer: object) -> None:
        layer.mode = trt.GatherMode.ND

    expected = np.stack([data[0, 1], data[2, 3]])
    np.testing.assert_array_equal(_gather(data, idx, 0, configure), expected)


def test_squeeze_drops_the_given_unit_axes():
    x = rand(1, 3, 1, 2)
    net = Net()
    axes = net.const(np.array([0, -2], np.int64))
    net.mark(net.network.add_squeeze(net.input("x", "float32", x.shape), axes).get_output(0))
    np.testing.assert_array_equal(net.run({"x": x})["out"], x.reshape(3, 2))


def test_unsqueeze_inserts_unit_axes_at_output_positions():
    x = rand(3, 2)
    net = Net()
    axes = net.const(np.array([0, -1], np.int64))
    net.mark(net.network.add_unsqueeze(net.input("x", "float32", x.shape), axes).get_output(0))
    np.testing.assert_array_equal(net.run({"x": x})["out"], x[None, :, :, None])
