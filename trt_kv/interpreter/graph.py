"""A network's layers as a graph the fast plan's pattern passes read: each tensor's producer
and readers, the layers downcast to their classes (:mod:`~trt_kv.interpreter.fused`,
:mod:`~trt_kv.interpreter.chains`), and the shuffles of an attention block's heads
(:mod:`~trt_kv.interpreter.attention_step`)."""

from __future__ import annotations

from trt_kv._trt import FEATURES, trt

L = trt.LayerType
CLASSES = {
    L.CONSTANT: trt.IConstantLayer,
    L.DEQUANTIZE: trt.IDequantizeLayer,
    L.MATRIX_MULTIPLY: trt.IMatrixMultiplyLayer,
    L.ELEMENTWISE: trt.IElementWiseLayer,
    L.SHUFFLE: trt.IShuffleLayer,
    L.REDUCE: trt.IReduceLayer,
    L.CAST: trt.ICastLayer,
    L.SLICE: trt.ISliceLayer,
    L.UNARY: trt.IUnaryLayer,
    L.ACTIVATION: trt.IActivationLayer,
}
if FEATURES.rotary_embedding:  # read only where the installed module has the layer
    CLASSES[L.ROTARY_EMBEDDING] = trt.IRotaryEmbeddingLayer
if FEATURES.attention:  # the boundary layers: their attention's causal kind and forms
    CLASSES[L.ATTENTION_INPUT] = CLASSES[L.ATTENTION_OUTPUT] = trt.IAttentionBoundaryLayer


class LayerGraph:
    """A network's layers (downcast), each tensor's producer and readers."""

    def __init__(self, network: object) -> None:
        self.layers = {}
        self.producer: dict[str, object] = {}
        self.readers: dict[str, list[object]] = {}
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            if layer.type in CLASSES:
                layer.__class__ = CLASSES[layer.type]
            self.layers[layer.name] = layer
            for j in range(layer.num_outputs):
                self.producer[layer.get_output(j).name] = layer
            for j in range(layer.num_inputs):
                t = layer.get_input(j)
                if t is not None:
                    self.readers.setdefault(t.name, []).append(layer)
        self.outputs = {network.get_output(i).name for i in range(network.num_outputs)}
        self.unique = len(self.layers) == network.num_layers

    def source(self, layer: object, j: int, kind: object) -> object | None:
        """The producer of ``layer``'s input ``j`` where it is a ``kind`` layer whose output
        only ``layer`` reads (and no network output), else None."""
        t = layer.get_input(j) if j < layer.num_inputs else None
        p = None if t is None else self.producer.get(t.name)
        if p is None or p.type != kind or t.name in self.outputs:
            return None
        return p if len(self.readers.get(t.name, [])) == 1 else None

    def weight_reader(self, layer: object) -> object | None:
        """The one product reading ``layer``'s output as its transposed matrix (input 1):
        ``x @ W^T``; other layers may read it too. None where there is none or several."""
        name = layer.get_output(0).name
        found = [
            r
            for r in self.readers.get(name, [])
            if product_of_transposed(r) and r.get_input(1).name == name
        ]
        return found[0] if len(found) == 1 else None

    def only_reader(self, layer: object) -> object | None:
        """The one layer reading ``layer``'s output 0 (no network output), else None."""
        name = layer.get_output(0).name
        readers = self.readers.get(name, [])
        return readers[0] if len(readers) == 1 and name not in self.outputs else None


def product_of_transposed(layer: object | None) -> bool:
    """Whether ``layer`` is a matrix product ``x @ W^T``."""
    m = trt.MatrixOperation
    return (
        layer is not None
        and layer.type == L.MATRIX_MULTIPLY
        and (layer.op0, layer.op1) == (m.NONE, m.TRANSPOSE)
    )


_SPLIT = (0, 1, 2, 3), (0, 2, 1, 3)  # [B, S, N, H] -> [B, N, S, H]: first, second transpose
_MERGE = (0, 2, 1, 3), (0, 1, 2)  # [B, N, S, H] -> [B, S, N, H], then N*H


def heads_split(shuffle: object) -> tuple[int, int] | None:
    """``(N, H)`` where ``shuffle`` takes ``[B, S, N*H]`` to heads ``[B, N, S, H]`` (reshape
    ``(0, 0, N, H)``, then transpose ``(0, 2, 1, 3)``), else None."""
    dims = tuple(shuffle.reshape_dims)
    shape = tuple(shuffle.get_input(0).shape)
    if (
        shuffle.num_inputs != 1
        or len(dims) != 4
        or len(shape) != 3
        or dims[:2] != (0, 0)
        or min(dims[2:]) < 1
        or shape[2] != dims[2] * dims[3]
        or not shuffle.zero_is_placeholder
        or (tuple(shuffle.first_transpose)[:4], tuple(shuffle.second_transpose)[:4]) != _SPLIT
    ):
        return None
    return dims[2], dims[3]


def heads_merged(shuffle: object) -> int | None:
    """``N*H`` where ``shuffle`` takes ``[B, N, S, H]`` to ``[B, S, N*H]``, else None."""
    dims = tuple(shuffle.reshape_dims)
    if (
        shuffle.num_inputs != 1
        or len(dims) != 3
        or dims[:2] != (0, 0)
        or len(tuple(shuffle.get_input(0).shape)) != 4
        or not shuffle.zero_is_placeholder
        or (tuple(shuffle.first_transpose)[:4], tuple(shuffle.second_transpose)[:3]) != _MERGE
    ):
        return None
    return dims[2]
