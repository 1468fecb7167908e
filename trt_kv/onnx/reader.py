"""Read an ONNX decoder file: the graph, with the ops trt_kv refuses named before any rewrite."""

from __future__ import annotations

from pathlib import Path

import onnx

from trt_kv.errors import ArgumentError, UnsupportedLayerError, mismatch

# ops no rewrite handles: (domain, op) -> why
REFUSED = {
    ("com.microsoft", "GroupQueryAttention"): "onnxruntime's contrib op (its cache is its own)",
    ("com.microsoft", "MultiHeadAttention"): "onnxruntime's contrib op (its cache is its own)",
}


def read_onnx(path: Path) -> onnx.ModelProto:
    """The model of ``path`` (its external data loaded from beside it).

    Raises:
        ArgumentError: no such file, or not an ONNX model.
        UnsupportedLayerError: a node of an op in :data:`REFUSED`, named with the node.
    """
    path = Path(path)
    if not path.is_file():
        raise ArgumentError(
            mismatch("--model", "an ONNX file", "", f"{str(path)!r} (no such file)")
        )
    try:
        model = onnx.load(str(path))
    except Exception as err:  # onnx raises DecodeError and others for a file of another kind
        raise ArgumentError(
            mismatch("--model", "an ONNX model file", "", f"{str(path)!r} ({type(err).__name__})")
        ) from err
    for node in model.graph.node:
        why = REFUSED.get((node.domain, node.op_type))
        if why is not None:
            raise UnsupportedLayerError(
                mismatch(
                    f"ONNX node {node.name or node.output[0]} ({node.domain}.{node.op_type})",
                    "an op trt_kv rewrites, not",
                    why,
                    node.op_type,
                )
            )
    return model
