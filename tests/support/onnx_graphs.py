"""Helpers for the interpreter's ONNX tests; this file holds no tests.

An ONNX graph is parsed by TensorRT-RTX's real ``OnnxParser`` into a strongly typed network
(as trt_kv's builder creates them), run by the interpreter, and compared with onnxruntime on
the same bytes: the expected values never come from trt_kv.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from trt_kv._trt import trt
from trt_kv.builder import create_network
from trt_kv.interpreter import compile_network

OPSET = 17


def graph(
    nodes: Sequence[object],
    inputs: Sequence[object],
    outputs: Sequence[object],
    initializers: Mapping[str, object] | None = None,
    opset: int = OPSET,
) -> bytes:
    """A serialized ONNX model of ``nodes`` (``onnx.helper.make_node``), its inputs and
    outputs (``make_tensor_value_info``) and constant initializers (name -> array)."""
    from onnx import helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.asarray(v), name) for name, v in (initializers or {}).items()
    ]
    g = helper.make_graph(list(nodes), "case", list(inputs), list(outputs), initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # what onnxruntime and TensorRT-RTX 1.7's parser both read
    return model.SerializeToString()


@dataclass
class Parsed:
    """A network parsed from ONNX, and what must outlive it: the parser owns the weights."""

    builder: object
    network: object
    parser: object

    def layer_types(self) -> set[str]:
        """``LayerType`` member names of the network's layers."""
        return {
            str(self.network.get_layer(i).type).rsplit(".", 1)[-1]
            for i in range(self.network.num_layers)
        }

    def run(self, feed: Mapping[str, np.ndarray], fast: bool = True) -> dict[str, np.ndarray]:
        """The interpreter's outputs for ``feed`` (copied: a cache update writes in place)."""
        plan = compile_network(self.network, fast=fast)
        return plan.run({k: np.array(v) for k, v in feed.items()})


def parse(data: bytes | str) -> Parsed:
    """``data`` (model bytes, or a file path) parsed by TensorRT's ``OnnxParser``.

    Raises:
        AssertionError: the parser refused the graph (its first error in the message).
    """
    builder, network = create_network()
    parser = trt.OnnxParser(network, trt.Logger(trt.Logger.ERROR))
    ok = parser.parse_from_file(data) if isinstance(data, str) else parser.parse(data)
    assert ok, parser.get_error(0).desc()
    return Parsed(builder, network, parser)


def onnxruntime_outputs(data: bytes | str, feed: Mapping[str, np.ndarray]) -> dict:
    """onnxruntime's outputs (name -> array) for ``feed``, on the CPU."""
    import onnxruntime as ort

    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {k: np.array(v) for k, v in feed.items()})))


def assert_matches(
    got: Mapping[str, np.ndarray],
    want: Mapping[str, np.ndarray],
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> None:
    """Each of ``want``'s outputs equal in ``got``: same dtype and shape, floats within
    float32 tolerance (NaN where NaN), integers and bools exactly."""
    for name, expected in want.items():
        actual = got[name]
        assert actual.dtype == expected.dtype, (name, actual.dtype, expected.dtype)
        assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
        if expected.dtype.kind == "f":
            np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(actual, expected, err_msg=name)
