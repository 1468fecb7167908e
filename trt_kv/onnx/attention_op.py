"""ONNX ``Attention`` (opset 23) nodes that take ``past_key`` / ``past_value``, written as the
growing-cache graph an exporter gives (TensorRT's parser refuses them: "Setting past_key for
the Attention node is not supported"), so :func:`~trt_kv.onnx.rewrite.rewrite_decoder` then
rewrites their caches like any other::

    Attention(Q, K, V, mask, past_key, past_value) -> Y, present_key, present_value
    =>  present_key = Concat(past_key, K, axis 2)          (present_value alike)
        Y = Softmax(Q @ present_key^T * scale + mask) @ present_value

Inputs ``[B, N, S, H]`` (4-D) with as many query heads as key heads.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_kv.errors import UnsupportedLayerError, mismatch

_PAST_KEY, _PAST_VALUE, _MASK = 4, 5, 3  # Attention's input slots


def _refuse(node: gs.Node, what: str, got: object) -> UnsupportedLayerError:
    return UnsupportedLayerError(mismatch(f"ONNX node {node.name} (Attention)", what, "", got))


def _check(node: gs.Node) -> None:
    """Raises UnsupportedLayerError for what the decomposition does not write."""
    if len(node.inputs) <= _PAST_VALUE or not all(node.inputs[i].name for i in (4, 5)):
        raise _refuse(node, "both past_key and past_value (a growing cache)", "one of them")
    if node.attrs.get("softcap", 0.0) not in (0, 0.0):
        raise _refuse(node, "softcap 0", node.attrs["softcap"])
    if len(node.outputs) > 3 and node.outputs[3].name and node.outputs[3].outputs:
        raise _refuse(node, "no qk_matmul_output read", "one read")
    ranks = {len(t.shape) for t in node.inputs[:3] if t.shape is not None}
    if ranks - {4}:
        raise _refuse(node, "4-D Q, K, V [B, N, S, H]", f"ranks {sorted(ranks)}")
    heads = [node.attrs.get(a) for a in ("q_num_heads", "kv_num_heads")]
    if None not in heads and heads[0] != heads[1]:
        raise _refuse(node, "as many query heads as key heads", f"{heads[0]} and {heads[1]}")


def decompose_attention(graph: gs.Graph) -> int:
    """Every ``Attention`` node of ``graph`` with a past written as Concat, MatMul, Add,
    Softmax, MatMul (in place); returns how many.

    Raises:
        UnsupportedLayerError: naming the node: only one of past_key and past_value, a
            softcap, its qk_matmul_output read, inputs not 4-D, fewer key than query heads.
    """
    count = 0
    for node in [n for n in graph.nodes if n.op == "Attention" and len(n.inputs) > _PAST_KEY]:
        if node.inputs[_PAST_KEY].name:
            _check(node)
            _write_out(graph, node)
            count += 1
    return count


def _write_out(graph: gs.Graph, node: gs.Node) -> None:
    """``node`` replaced by Concat (each cache), MatMul, Mul (scale), Add (mask), Softmax,
    MatMul; its outputs keep their names."""
    q, k, v = node.inputs[:3]
    past_k, past_v = node.inputs[_PAST_KEY], node.inputs[_PAST_VALUE]
    y, present_k, present_v = node.outputs[:3]
    name = node.name or y.name
    scale = node.attrs.get("scale") or float(past_k.shape[3]) ** -0.5
    dtype = np.dtype(past_k.dtype)
    mask = node.inputs[_MASK] if len(node.inputs) > _MASK and node.inputs[_MASK].name else None
    if mask is None or mask.dtype == np.bool_:  # an Add all the same: the rewrite's mask goes there
        mask = gs.Constant(f"{name}.no_mask", np.zeros(1, dtype))
    node.outputs.clear()
    node.inputs.clear()

    def add(
        op: str, step: str, inputs: list, out: gs.Tensor | None = None, **attrs: object
    ) -> gs.Variable:
        outputs = [out if out is not None else f"{name}.{step}"]
        return graph.layer(
            op=op, name=f"{name}.{step}", inputs=inputs, outputs=outputs, attrs=attrs
        )[0]

    add("Concat", "keys", [past_k, k], present_k, axis=2)
    add("Concat", "values", [past_v, v], present_v, axis=2)
    k_t = add("Transpose", "k_t", [present_k], perm=[0, 1, 3, 2])
    scores = add("Mul", "scores", [add("MatMul", "qk", [q, k_t]), np.array(scale, dtype)])
    probs = add("Softmax", "probs", [add("Add", "masked", [scores, mask])], axis=-1)
    add("MatMul", "out", [probs, present_v], y)
