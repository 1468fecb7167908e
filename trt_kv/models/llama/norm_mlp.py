"""RMSNorm and the gated MLP in the network, with the family switches (norm offset,
activation): the network's counterparts of ``trt_kv.reference.ops.rms_norm`` / ``gated_mlp``.
"""

from __future__ import annotations

import numpy as np

from trt_kv._trt import trt
from trt_kv.models.layers.graph import Graph

# gated MLP activation -> TensorRT activation (SiLU is x * sigmoid(x), built from SIGMOID)
_ACTIVATIONS = {"gelu_tanh": trt.ActivationType.GELU_TANH}


def rms_norm(g: Graph, x: object, weight: np.ndarray, eps: float, offset: float = 0.0) -> object:
    """RMSNorm over the last axis of ``x [..., D]`` (any rank), normalized in float32 as
    Hugging Face does. ``offset`` 0 (Llama): rounded to ``g.dtype``, then times ``weight``
    there; otherwise (Gemma): times ``offset + weight`` in float32, then rounded."""
    rank = len(tuple(x.shape))
    x32 = g.cast(x, "float32")
    mean = g.network.add_reduce(g.mul(x32, x32), trt.ReduceOperation.AVG, 1 << (rank - 1), True)
    var = g.add(mean.get_output(0), g.const(np.full((1,) * rank, eps), "float32"))
    rms = g.network.add_unary(var, trt.UnaryOperation.SQRT).get_output(0)
    normed = g.eltwise(x32, rms, trt.ElementWiseOperation.DIV)
    shape = (1,) * (rank - 1) + (-1,)
    if offset:
        scale = g.const((weight.astype(np.float32) + np.float32(offset)).reshape(shape), "float32")
        return g.cast(g.mul(normed, scale), g.dtype)
    return g.mul(g.cast(normed, g.dtype), g.const(weight.reshape(shape)))


def gated_mlp(
    g: Graph, x: object, w_gate: object, w_up: object, w_down: object, activation: str
) -> object:
    """``(act(x Wg^T) * x Wu^T) Wd^T``, ``[B, S, D] -> [B, S, D]``; the weights are
    constants ``[1, Out, In]``; ``activation`` "silu" (SwiGLU) or "gelu_tanh"."""
    gate = g.linear(x, w_gate)
    up = g.linear(x, w_up)
    if activation == "silu":
        sig = g.network.add_activation(gate, trt.ActivationType.SIGMOID).get_output(0)
        act = g.mul(gate, sig)
    else:
        act = g.network.add_activation(gate, _ACTIVATIONS[activation]).get_output(0)
    return g.linear(g.mul(act, up), w_down)
