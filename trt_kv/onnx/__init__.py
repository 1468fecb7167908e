"""ONNX as one more checkpoint source: a reader and a graph rewrite that yield a network with
decoder roles, so nothing downstream learns about ONNX (docs/onnx.md).

A decoder exported with a growing cache (``past_key_values.{i}.key`` concatenated into
``present.{i}.key``) is rewritten to static-``S_max`` caches updated in place
(:mod:`~trt_kv.onnx.rewrite`), parsed by TensorRT's ``OnnxParser`` (:mod:`~trt_kv.onnx.parse`)
and run by any backend; :func:`trt_kv.onnx.decoder.load_onnx_decoder` does all three. This
module imports nothing (``onnx`` is the ``onnx`` extra): the CLI asks :func:`is_onnx` first.
"""

from pathlib import Path

SUFFIX = ".onnx"


def is_onnx(spec: object) -> bool:
    """Whether a ``--model`` value names an ONNX file (by its suffix)."""
    return isinstance(spec, (str, Path)) and str(spec).lower().endswith(SUFFIX)
