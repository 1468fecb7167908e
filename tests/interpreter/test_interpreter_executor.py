"""Interpreter: feed validation, unsupported layers, execution order, rounding at tensor
boundaries, precision, and reuse of a compiled plan."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.support.interpreter_support import Net, rand
from trt_kv._trt import trt
from trt_kv.errors import ArgumentError, DTypeError, NetworkError, ShapeError, UnsupportedLayerError
from trt_kv.interpreter import FeedError, compile_network, execute

E = trt.ElementWiseOperation


def _doubling_net() -> Net:
    """out = x + x for x [-1, 3] float32."""
    net = Net()
    x = net.input("x", "float32", (-1, 3))
    net.mark(net.network.add_elementwise(x, x, E.SUM).get_output(0))
    return net


@pytest.mark.parametrize("network", [None, "network.onnx"])
def test_compile_network_refuses_what_is_no_network_definition(network):
    with pytest.raises(ArgumentError) as err:
        compile_network(network)
    expected = f"network: expected an INetworkDefinition, got {type(network).__name__}"
    assert str(err.value) == expected


def test_feed_missing_input_names_it():
    with pytest.raises(FeedError, match="x: expected a feed array"):
        execute(_doubling_net().network, {})


def test_feed_unknown_name_is_refused():
    feed = {"x": np.zeros((1, 3), np.float32), "typo": np.zeros(1)}
    with pytest.raises(FeedError, match="typo"):
        execute(_doubling_net().network, feed)


def test_feed_wrong_dtype_names_expected_and_actual():
    with pytest.raises(DTypeError, match="x: expected dtype float32, got float64"):
        execute(_doubling_net().network, {"x": np.zeros((1, 3))})


def test_feed_wrong_rank_is_a_shape_error():
    with pytest.raises(ShapeError, match=r"x: expected shape \(-1, 3\), got \(3,\)"):
        execute(_doubling_net().network, {"x": np.zeros(3, np.float32)})


def test_feed_wrong_static_dim_is_a_shape_error():
    with pytest.raises(ShapeError, match=r"got \(2, 4\)"):
        execute(_doubling_net().network, {"x": np.zeros((2, 4), np.float32)})


def test_feed_dynamic_dim_takes_any_size():
    x = rand(7, 3)
    np.testing.assert_array_equal(_doubling_net().run({"x": x})["out"], 2 * x)


def _pooling_net() -> Net:
    """A 2x2 max pooling: a layer TensorRT builds and the interpreter has no handler for
    (TopK, then CUMULATIVE, were that example until the interpreter learnt them)."""
    net = Net()
    x = net.input("x", "float32", (1, 1, 4, 4))
    layer = net.network.add_pooling_nd(x, trt.PoolingType.MAX, (2, 2))
    layer.name = "pool"
    net.mark(layer.get_output(0), "values")
    return net


def test_unsupported_layer_type_names_layer_and_type():
    net = _pooling_net()
    net.build({})  # TensorRT accepts it; the interpreter does not execute POOLING
    with pytest.raises(UnsupportedLayerError, match=r"'pool' \(POOLING\)"):
        compile_network(net.network)


def test_unsupported_setting_names_layer_and_setting():
    net = Net()
    layer = net.network.add_fill((4,), trt.FillOperation.RANDOM_UNIFORM, trt.float32)
    layer.name = "noise"
    net.mark(layer.get_output(0))
    with pytest.raises(UnsupportedLayerError, match=r"'noise' \(FILL\).*RANDOM_UNIFORM"):
        compile_network(net.network)


def test_layers_no_output_needs_are_skipped():
    net = _pooling_net()
    net.network.unmark_output(net.network.get_output(0))
    x = net.network.get_input(0)
    net.mark(net.network.add_unary(x, trt.UnaryOperation.ABS).get_output(0))
    x_value = rand(1, 1, 4, 4)
    np.testing.assert_array_equal(net.run({"x": x_value})["out"], np.abs(x_value))


def test_layers_run_in_dependency_order_not_insertion_order():
    """``set_input`` can make a layer read a tensor produced by a layer added after it."""
    net = Net()
    x = net.input("x", "float32", (4,))
    first = net.network.add_unary(x, trt.UnaryOperation.NEG)  # input rewired below
    later = net.network.add_unary(x, trt.UnaryOperation.EXP)
    first.set_input(0, later.get_output(0))
    net.mark(first.get_output(0))
    x_value = rand(4)
    np.testing.assert_allclose(net.run({"x": x_value})["out"], -np.exp(x_value), rtol=1e-6)


@pytest.mark.parametrize(
    ("dtype", "np_dtype"), [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)]
)
def test_half_precision_network_rounds_every_tensor(dtype, np_dtype):
    """``(x * a) + b`` with the product rounded to the network dtype before the sum."""
    x = rand(256, seed=1, dtype=dtype)
    a = rand(256, seed=2, dtype=dtype)
    b = rand(256, seed=3, dtype=dtype)
    net = Net()
    prod = net.network.add_elementwise(net.input("x", dtype, x.shape), net.const(a), E.PROD)
    net.mark(net.network.add_elementwise(prod.get_output(0), net.const(b), E.SUM).get_output(0))
    out = net.run({"x": x})["out"]
    f32 = np.float32
    product = (x.astype(f32) * a.astype(f32)).astype(np_dtype)
    expected = (product.astype(f32) + b.astype(f32)).astype(np_dtype)
    assert out.dtype == np_dtype
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


def test_precision_float64_computes_inside_layers_in_float64():
    x = np.array([1e8, 1.0, -1e8], np.float32)
    net = Net()
    reduce = net.network.add_reduce(
        net.input("x", "float32", (3,)), trt.ReduceOperation.SUM, 1, False
    )
    net.mark(reduce.get_output(0))
    net.build({})
    assert execute(net.network, {"x": x}, precision="float64")["out"] == np.float32(1.0)
    assert execute(net.network, {"x": x}, precision="float32")["out"] == np.float32(0.0)


def test_compiled_plan_reruns_with_fresh_outputs():
    net = Net()
    c = net.const(np.array([1.0, 2.0], np.float32))
    net.mark(c, "weights")
    net.mark(net.network.add_elementwise(net.input("x", "float32", (2,)), c, E.SUM).get_output(0))
    plan = compile_network(net.network)
    first = plan.run({"x": np.zeros(2, np.float32)})
    first["weights"][:] = -1  # caller's copy; the plan's constant is untouched
    second = plan.run({"x": np.ones(2, np.float32)})
    np.testing.assert_array_equal(second["weights"], [1, 2])
    np.testing.assert_array_equal(second["out"], [2, 3])
    np.testing.assert_array_equal(first["out"], [1, 2])


def test_layer_tensorrt_cannot_shape_is_a_network_error():
    """A reshape TensorRT itself rejects ([4, 3] -> [1, 3, 0]: the second 0 copies a missing
    dim) fails at compile time, naming the layer."""
    net = Net()
    layer = net.network.add_shuffle(net.input("x", "float32", (4, 3)))
    layer.reshape_dims = (1, 0, 0)
    layer.name = "bad_reshape"
    net.mark(layer.get_output(0))
    with pytest.raises(NetworkError, match=r"'bad_reshape' \(SHUFFLE\)"):
        compile_network(net.network)
