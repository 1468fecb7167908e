"""Small ONNX decoders written with ``onnx.helper``: one attention layer over a growing cache
(past ``[B, N, P, H]`` -> present ``[B, N, P + S, H]``), as a Concat + MatMul + Softmax graph
or as an opset-23 ``Attention`` node taking ``past_key`` / ``past_value``; and the broken
variants the refusal tests feed."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h

V, D, N, H, P_MAX = 23, 8, 2, 4, 128  # vocabulary, width, heads, head size, position table
LOWEST = float(np.finfo(np.float32).min)


def _weights(seed: int) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(seed)
    arrays = {
        "embed": rng.normal(0, 1, (V, D)),
        "pos_embed": rng.normal(0, 1, (P_MAX, D)),
        "wq": rng.normal(0, 0.5, (D, D)),
        "wk": rng.normal(0, 0.5, (D, D)),
        "wv": rng.normal(0, 0.5, (D, D)),
        "wo": rng.normal(0, 1, (D, V)),
    }
    consts = {
        "heads_shape": np.array([0, 0, N, H], np.int64),
        "width_shape": np.array([0, 0, D], np.int64),
        "scale": np.array(H**-0.5, np.float32),
        "zero_f": np.array(0.0, np.float32),
        "lowest": np.array(LOWEST, np.float32),
        "axes_13": np.array([1, 3], np.int64),
        "axes_12": np.array([1, 2], np.int64),
        "two": np.array([2], np.int64),
        "i0": np.array(0, np.int64),
        "i1": np.array(1, np.int64),
    }
    out = [
        h.make_tensor(k, T.FLOAT, v.shape, v.astype(np.float32).ravel()) for k, v in arrays.items()
    ]
    return out + [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()]


def _heads(name: str, x: str) -> list[onnx.NodeProto]:
    """``x [B, S, D]`` @ ``w{name}`` -> ``{name} [B, N, S, H]``."""
    return [
        h.make_node("MatMul", [x, f"w{name}"], [f"{name}_flat"]),
        h.make_node("Reshape", [f"{name}_flat", "heads_shape"], [f"{name}_bshh"]),
        h.make_node("Transpose", [f"{name}_bshh"], [name], perm=[0, 2, 1, 3]),
    ]


def _mask(*keys: str) -> list[onnx.NodeProto]:
    """``mask [B, 1, S, T]``: 0 where key j <= the token's position and attention_mask[b, j],
    else the lowest float; T the sum of the lengths (axis 2) of ``keys``."""
    lengths = [
        node
        for i, k in enumerate(keys)
        for node in (
            h.make_node("Shape", [k], [f"shape{i}"]),
            h.make_node("Gather", [f"shape{i}", "two"], [f"length{i}"]),
        )
    ]
    total = (
        h.make_node("Add", ["length0", "length1"], ["total1"])
        if len(keys) == 2
        else h.make_node("Identity", ["length0"], ["total1"])
    )
    return [
        *lengths,
        total,
        h.make_node("Squeeze", ["total1"], ["total"]),
        h.make_node("Range", ["i0", "total", "i1"], ["rows"]),
        h.make_node("Unsqueeze", ["position_ids", "axes_13"], ["pos4"]),
        h.make_node("LessOrEqual", ["rows", "pos4"], ["causal"]),
        h.make_node("Cast", ["attention_mask"], ["mask_bool"], to=T.BOOL),
        h.make_node("Unsqueeze", ["mask_bool", "axes_12"], ["mask4"]),
        h.make_node("And", ["causal", "mask4"], ["seen"]),
        h.make_node("Where", ["seen", "zero_f", "lowest"], ["mask"]),
    ]


def toy_decoder(
    kind: str = "matmul", *, heads: object = N, past: bool = True, seed: int = 0
) -> onnx.ModelProto:
    """One-layer decoder, caches ``past_key_values.0.key/value`` -> ``present.0.key/value``.

    ``kind``: ``"matmul"`` (Concat, MatMul, Add mask, Softmax) or ``"attention"`` (one
    opset-23 ``Attention`` node with ``past_key`` / ``past_value``). ``heads``: the caches'
    declared N (a string: a dynamic head count). ``past=False``: no cache at all."""
    nodes = [
        h.make_node("Gather", ["embed", "input_ids"], ["tok_x"]),
        h.make_node("Gather", ["pos_embed", "position_ids"], ["pos_x"]),
        h.make_node("Add", ["tok_x", "pos_x"], ["x"]),
        *_heads("q", "x"),
        *_heads("k", "x"),
        *_heads("v", "x"),
    ]
    k_all, v_all = ("present.0.key", "present.0.value") if past else ("k", "v")
    if kind == "attention":
        nodes += [
            *_mask("past_key_values.0.key", "k"),
            h.make_node(
                "Attention",
                ["q", "k", "v", "mask", "past_key_values.0.key", "past_key_values.0.value"],
                ["attn", "present.0.key", "present.0.value"],
                name="attention_0",
                scale=H**-0.5,
            ),
        ]
    else:
        if past:
            nodes += [
                h.make_node("Concat", ["past_key_values.0.key", "k"], [k_all], axis=2),
                h.make_node("Concat", ["past_key_values.0.value", "v"], [v_all], axis=-2),
            ]
        nodes += [
            *_mask(k_all),
            h.make_node("Transpose", [k_all], ["k_t"], perm=[0, 1, 3, 2]),
            h.make_node("MatMul", ["q", "k_t"], ["qk"]),
            h.make_node("Mul", ["qk", "scale"], ["scores"]),
            h.make_node("Add", ["scores", "mask"], ["masked"]),
            h.make_node("Softmax", ["masked"], ["probs"], axis=-1),
            h.make_node("MatMul", ["probs", v_all], ["attn"]),
        ]
    nodes += [
        h.make_node("Transpose", ["attn"], ["attn_bshh"], perm=[0, 2, 1, 3]),
        h.make_node("Reshape", ["attn_bshh", "width_shape"], ["y"]),
        h.make_node("MatMul", ["y", "wo"], ["logits"]),
    ]
    inputs = [
        h.make_tensor_value_info("input_ids", T.INT64, ["batch", "sequence"]),
        h.make_tensor_value_info("attention_mask", T.INT64, ["batch", "total"]),
        h.make_tensor_value_info("position_ids", T.INT64, ["batch", "sequence"]),
    ]
    outputs = [h.make_tensor_value_info("logits", T.FLOAT, ["batch", "sequence", V])]
    if past:
        for kv in ("key", "value"):
            shape = ["batch", heads, "past", H]
            inputs.append(h.make_tensor_value_info(f"past_key_values.0.{kv}", T.FLOAT, shape))
            outputs.append(
                h.make_tensor_value_info(f"present.0.{kv}", T.FLOAT, ["batch", heads, "total", H])
            )
    graph = h.make_graph(nodes, f"toy_{kind}", inputs, outputs, initializer=_weights(seed))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 23)], ir_version=10)
