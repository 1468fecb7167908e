"""A rewritten ONNX decoder parsed by TensorRT's ``OnnxParser`` into a strongly typed network
with its decoder roles: what the interpreter runs and the engine store builds."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from trt_kv._trt import logger, trt
from trt_kv.builder.contract import DecoderNetwork, decoder_profiles, decoder_roles
from trt_kv.builder.engine import create_network
from trt_kv.errors import UnsupportedLayerError, mismatch
from trt_kv.onnx.rewrite import UPDATE_OPS  # in the order trt_kv prefers them


def _update_probe(op: str) -> bytes:
    """A one-node graph: ``op`` writing ``[1, 1, 2, 1]`` into a cache ``[1, 1, 4, 1]``."""
    from onnx import TensorProto, helper

    rows = TensorProto.INT64 if op == "TensorScatter" else TensorProto.INT32
    attrs = {"axis": -2, "mode": "linear"}
    if op == "TRT_KVCacheUpdate":
        attrs["update_form"] = "padded_bhnd"
    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node(op, ["cache", "update", "rows"], ["out"], **attrs)],
        "probe",
        [
            value("cache", TensorProto.FLOAT, [1, 1, 4, 1]),
            value("update", TensorProto.FLOAT, [1, 1, 2, 1]),
            value("rows", rows, [1]),
        ],
        [value("out", TensorProto.FLOAT, [1, 1, 4, 1])],
    )
    opset = [helper.make_opsetid("", 24)]
    return helper.make_model(graph, opset_imports=opset, ir_version=10).SerializeToString()


_INT64_BINDING = "has Int64 binding"  # the parser's note on each int64 input: the contract's


def _parser_logger() -> object:
    """A logger for the parser: its errors come back in the raised UnsupportedLayerError,
    its notes on int64 inputs (``position_ids``, the export's ids) are dropped, and other
    warnings go to trt_kv's logger (stderr)."""
    severity = trt.ILogger.Severity

    class ParserLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, level: object, msg: str) -> None:
            if level == severity.WARNING and _INT64_BINDING not in msg:
                logger().log(level, msg)

    return ParserLogger()


@cache
def parser_update_op() -> str:
    """The cache-update op the installed TensorRT's parser imports, the first of
    :data:`UPDATE_OPS`: ``TensorScatter`` (TensorRT >= 11.0 and TensorRT-RTX 1.7.1 both take
    it), else ``TRT_KVCacheUpdate``.

    Raises:
        UnsupportedLayerError: a parser that imports neither (TensorRT 10.x before 11.0).
    """
    for op in UPDATE_OPS:
        _, network = create_network()
        if trt.OnnxParser(network, _parser_logger()).parse(_update_probe(op)):
            return op
    raise UnsupportedLayerError(
        mismatch(
            f"{trt.__name__} {trt.__version__}'s ONNX parser",
            "one of the cache updates",
            " or ".join(UPDATE_OPS),
            "neither (TensorRT >= 11.0 or TensorRT-RTX imports them)",
        )
    )


def parse_decoder(
    model: bytes, folder: Path, *, max_batch: int, max_step_tokens: int
) -> DecoderNetwork:
    """The network of the serialized ONNX ``model`` (a rewritten decoder,
    :func:`~trt_kv.onnx.rewrite.rewrite_decoder`; external data files in ``folder``), parsed
    into a strongly typed network with the two decoder profiles
    (B <= ``max_batch``, S <= ``max_step_tokens``) and its checked roles.

    Raises:
        UnsupportedLayerError: a node the installed TensorRT's parser does not import, named
            with its op (``TensorScatter`` needs a parser of TensorRT >= 11.0 or TensorRT-RTX).
        NetworkError, DTypeError, ShapeError: a network that breaks the decoder contract
            (:func:`~trt_kv.builder.contract.decoder_roles`).
        ArgumentError: ``max_batch`` or ``max_step_tokens`` not an integer >= 1.
    """
    builder, network = create_network()
    quiet = _parser_logger()
    parser = trt.OnnxParser(network, quiet)
    if not parser.parse(model, str(folder)):
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        first = errors[0] if errors else None
        where = (
            f"ONNX node {first.node_name()} ({first.node_operator()})" if first else "ONNX graph"
        )
        desc = first.desc() if first else "no error reported"
        raise UnsupportedLayerError(
            mismatch(where, f"a node {trt.__name__} {trt.__version__}'s parser imports", "", desc)
        )
    profiles = decoder_profiles(network, max_batch=max_batch, max_step_tokens=max_step_tokens)
    roles = decoder_roles(network, profiles)
    return DecoderNetwork(builder, network, profiles, roles, keep=(parser, quiet))
