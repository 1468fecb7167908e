"""A layer of a parsed ONNX graph the interpreter cannot run is refused at compile time with
UnsupportedLayerError naming the layer, its type and the ONNX node it came from (TensorRT's
parser records the node in the layer's metadata); layers not parsed from ONNX are named as
before."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx import TensorProto as T
from onnx import helper

from tests.support.interpreter_support import Net
from tests.support.onnx_graphs import graph, parse
from trt_kv._trt import trt
from trt_kv.errors import UnsupportedLayerError
from trt_kv.interpreter import compile_network

F = T.FLOAT
IMAGE = [helper.make_tensor_value_info("x", F, [2, 3, 4, 4])]
OUT = [helper.make_tensor_value_info("y", F, None)]


def test_a_layer_type_it_cannot_run_is_refused_naming_the_onnx_node():
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="/model/stem/Conv")
    parsed = parse(graph([conv], IMAGE, OUT, {"w": np.ones((2, 3, 1, 1), np.float32)}))
    with pytest.raises(UnsupportedLayerError) as err:
        compile_network(parsed.network)
    assert "(CONVOLUTION, ONNX node '/model/stem/Conv')" in str(err.value)
    assert "layer type not supported by the interpreter" in str(err.value)


def test_a_setting_it_cannot_run_is_refused_naming_the_onnx_node():
    norm = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, name="gn")
    scale = {"s": np.ones(3, np.float32), "b": np.zeros(3, np.float32)}
    parsed = parse(graph([norm], IMAGE, OUT, scale, opset=21))
    with pytest.raises(
        UnsupportedLayerError, match=r"ONNX node 'gn'\): unsupported setting: num_groups 3"
    ):
        compile_network(parsed.network)


def test_a_tensor_dtype_it_cannot_hold_is_refused_naming_the_onnx_node():
    to_fp8 = helper.make_node("Cast", ["x"], ["c"], to=T.FLOAT8E4M3FN, name="/q/Cast")
    back = helper.make_node("Cast", ["c"], ["y"], to=F, name="/q/Cast_1")
    parsed = parse(graph([to_fp8, back], IMAGE, OUT, opset=23))
    with pytest.raises(
        UnsupportedLayerError, match=r"\(CAST, ONNX node '/q/Cast'\): unsupported tensor dtype"
    ):
        compile_network(parsed.network)


def test_an_unnamed_node_is_named_as_the_parser_names_it():
    lrn = helper.make_node("LRN", ["x"], ["y"], size=3)  # no name: the parser says node_of_y
    parsed = parse(graph([lrn], IMAGE, OUT))
    with pytest.raises(UnsupportedLayerError, match=r"\(LRN, ONNX node 'node_of_y'\)"):
        compile_network(parsed.network)


def test_a_layer_built_by_hand_is_named_without_an_onnx_node():
    net = Net()
    x = net.input("x", "float32", (1, 3, 4, 4))
    pool = net.network.add_pooling_nd(x, trt.PoolingType.MAX, (2, 2))
    pool.name = "pool"
    net.mark(pool.get_output(0))
    with pytest.raises(UnsupportedLayerError) as err:
        compile_network(net.network)
    assert str(err.value) == "layer 'pool' (POOLING): layer type not supported by the interpreter"
