"""A network's layers as a graph the fast plan's pattern passes read: each tensor's producer
and readers, the layers downcast to their classes (:mod:`~trt_kv.interpreter.fused`,
:mod:`~trt_kv.interpreter.chains`)."""

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
