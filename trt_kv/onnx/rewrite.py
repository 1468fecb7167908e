"""Rewrite a growing-cache ONNX decoder to the decoder contract: static-``S_max`` caches updated
in place, attention masked by each token's position, the contract's inputs.

Before (each layer, ``torch.onnx.export`` / Optimum)::

    past_key_values.{i}.key [B, N, P, H] ─┐
    new keys            [B, N, S, H] ─ Concat(axis 2) ─ present.{i}.key [B, N, P + S, H]
    attention_mask [B, P + S] ─ (mask, positions from P) ─ Add ─ Softmax

After::

    past_key_values.{i}.key [B, N, S_max, H] ─┐
    new keys [B, N, S, H] ─ TensorScatter(write_indices) ─ present.{i}.key [B, N, S_max, H]
    position_ids [B, S] ─ (key row j <= position ? 0 : lowest) ─ Add ─ Softmax

The update is ONNX's ``TensorScatter`` (opset 24, ``mode="linear"``, ``axis=-2``), which
TensorRT's parser imports as its KV cache update layer (the output aliases the input) and
onnxruntime also runs; or ``TRT_KVCacheUpdate`` (``update_form="padded_bhnd"``), which only
TensorRT (>= 11.0, TensorRT-RTX) imports. Token ids come in as ``input_ids [B, S]`` int32 (the
contract's dtype) and one ``Cast`` to int64 feeds what read the export's int64 ids;
``write_indices [B]`` int32 is cast to int64 for ``TensorScatter``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trt_kv.errors import ArgumentError, NetworkError, check_int, mismatch
from trt_kv.onnx.attention_op import decompose_attention
from trt_kv.onnx.match import GrowingCache, find_caches

UPDATE_OPS = ("TensorScatter", "TRT_KVCacheUpdate")  # ONNX's (opset 24), TensorRT's own
SCATTER_OPSET = 24  # TensorScatter's first opset
METADATA_KEY = "trt_kv.rewrite"  # the report, in the rewritten model's metadata_props
TOKENS, POSITIONS, WRITE_INDICES = "input_ids", "position_ids", "write_indices"
_METADATA_OPS = ("Shape", "Size")  # their outputs carry no data of their inputs


@dataclass(frozen=True)
class RewriteReport:
    """What :func:`rewrite_decoder` changed: each cache ``(input, output, layer)``, the mask
    inputs it replaced, the update op, ``S_max``, and the inputs the graph lost."""

    caches: tuple[tuple[str, str, int | None], ...]
    masked_softmaxes: int
    update_op: str
    max_seq_len: int
    removed_inputs: tuple[str, ...]
    attention_nodes: int = 0  # opset-23 Attention nodes with a past, written out first

    @property
    def layers(self) -> list[int]:
        """The layers with a cache (from the names), sorted."""
        return sorted({layer for *_, layer in self.caches if layer is not None})

    def summary(self) -> str:
        """``"4 caches (layers 0, 1) -> TensorScatter, S_max 64; 2 attention masks from
        position_ids; removed inputs ['attention_mask']"``."""
        layers = self.layers
        span = f"layers {', '.join(map(str, layers))}" if layers else "layers unnamed"
        removed = f"; removed inputs {list(self.removed_inputs)}" if self.removed_inputs else ""
        if self.attention_nodes:
            removed += f"; {self.attention_nodes} Attention nodes written out"
        return (
            f"{len(self.caches)} caches ({span}) -> {self.update_op}, S_max {self.max_seq_len};"
            f" {self.masked_softmaxes} attention masks from position_ids{removed}"
        )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> RewriteReport:
        caches = tuple(tuple(c) for c in d["caches"])
        return cls(**{**d, "caches": caches, "removed_inputs": tuple(d["removed_inputs"])})


def rewritten_report(model: onnx.ModelProto) -> RewriteReport | None:
    """The report a rewritten model carries in its metadata, else None (not rewritten)."""
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            return RewriteReport.from_json(json.loads(prop.value))
    return None


def rewrite_decoder(
    model: onnx.ModelProto, max_seq_len: int, update_op: str = "TensorScatter"
) -> tuple[onnx.ModelProto, RewriteReport]:
    """``model`` (a growing-cache decoder, left unchanged) rewritten to the decoder contract
    with caches ``[B, N, max_seq_len, H]``, and what was rewritten.

    Raises:
        ArgumentError: ``max_seq_len`` not an integer >= 1, ``update_op`` not in
            :data:`UPDATE_OPS`.
        NetworkError, ShapeError: as :func:`~trt_kv.onnx.match.find_caches`; no
            ``input_ids`` or ``position_ids`` input (positions computed from the past length
            cannot be mapped); an attention ``Softmax`` over a cache without an ``Add`` of a
            mask before it; something other than its update still reading a cache input
            (a ``Shape`` of one is mapped: :func:`_past_lengths`) or ``attention_mask``.
    """
    check_int("max_seq_len", max_seq_len, 1)
    if update_op not in UPDATE_OPS:
        raise ArgumentError(mismatch("update_op", "one of", list(UPDATE_OPS), repr(update_op)))
    graph = gs.import_onnx(model)
    attention_nodes = decompose_attention(graph)
    caches = find_caches(graph)
    inputs = {t.name: t for t in graph.inputs}
    for name in (TOKENS, POSITIONS):
        if name not in inputs:
            raise NetworkError(
                mismatch("ONNX graph inputs", "an input named", name, sorted(inputs))
            )
    tokens = _int32_tokens(graph, inputs[TOKENS])
    write_indices = gs.Variable(WRITE_INDICES, np.int32, ["batch"])
    rows = _updates(graph, caches, write_indices, max_seq_len, update_op)
    rows |= _past_lengths(graph, caches, tokens, max_seq_len)
    masked = _mask_attention(graph, caches, inputs[POSITIONS], tokens, max_seq_len)
    graph.inputs = [tokens, inputs[POSITIONS], write_indices, *(c.past for c in caches)]
    graph.cleanup(remove_unused_graph_inputs=True).toposort()
    _check_no_past_length(graph, caches, rows)
    removed = tuple(n for n in inputs if n not in {t.name for t in graph.inputs})
    report = RewriteReport(
        caches=tuple((c.past.name, c.present.name, c.layer) for c in caches),
        masked_softmaxes=masked,
        update_op=update_op,
        max_seq_len=max_seq_len,
        removed_inputs=removed,
        attention_nodes=attention_nodes,
    )
    out = gs.export_onnx(graph)
    _set_opsets(out, model, update_op)
    out.metadata_props.add(key=METADATA_KEY, value=json.dumps(report.to_json()))
    return out, report


def _int32_tokens(graph: gs.Graph, old: gs.Variable) -> gs.Variable:
    """A new ``input_ids [B, S]`` int32 input, cast to the export's dtype for its readers."""
    tokens = gs.Variable(TOKENS, np.int32, ["batch", "sequence"])
    old.name = f"{TOKENS}.{np.dtype(old.dtype).name}"
    graph.layer(
        op="Cast",
        name="trt_kv.tokens_cast",
        inputs=[tokens],
        outputs=[old],
        attrs={"to": onnx.helper.np_dtype_to_tensor_dtype(np.dtype(old.dtype))},
    )
    return tokens


def _updates(
    graph: gs.Graph,
    caches: list[GrowingCache],
    write_indices: gs.Variable,
    s_max: int,
    update_op: str,
) -> set[str]:
    """Each concat replaced by ``update_op`` on the static-``S_max`` cache; the names of the
    update nodes."""
    rows = write_indices
    if update_op == "TensorScatter":
        rows = graph.layer(
            op="Cast",
            name="trt_kv.write_indices_int64",
            inputs=[write_indices],
            outputs=[gs.Variable("write_indices.int64", np.int64, ["batch"])],
            attrs={"to": onnx.TensorProto.INT64},
        )[0]
    attrs = {"axis": -2, "mode": "linear"}
    if update_op == "TRT_KVCacheUpdate":
        attrs["update_form"] = "padded_bhnd"
    names = set()
    for c in caches:
        n, h = c.heads
        shape = ["batch", n, s_max, h]
        c.past.shape, c.present.shape = shape, shape
        c.concat.outputs.clear()
        name = f"trt_kv.update.{c.present.name}"
        graph.layer(
            op=update_op, name=name, inputs=[c.past, c.new, rows], outputs=[c.present], attrs=attrs
        )
        names.add(name)
    return names


def _past_lengths(
    graph: gs.Graph, caches: list[GrowingCache], tokens: gs.Variable, s_max: int
) -> set[str]:
    """Each ``Shape`` node reading a cache input (the dynamo exporter reads the past length P
    there, then adds S for the total) made to read the cache's rows ``[:S_max - S]``
    ``[B, N, S_max - S, H]``: P + S is then the cache's S_max. The names of those slices."""
    readers = [(c, n) for c in caches for n in list(c.past.outputs) if n.op == "Shape"]
    if not readers:
        return set()
    i64 = np.int64
    step = graph.layer(
        op="Shape",
        name="trt_kv.past.step",
        inputs=[tokens],
        outputs=[gs.Variable("trt_kv.past.step", i64, [1])],
        attrs={"start": 1, "end": 2},
    )[0]
    s_max_rows = gs.Constant("trt_kv.past.s_max", np.array([s_max], i64))
    past = gs.Variable("trt_kv.past.length", i64, [1])
    graph.layer(op="Sub", name=past.name, inputs=[s_max_rows, step], outputs=[past])
    zero, axis = (
        gs.Constant(f"trt_kv.past.{n}", np.array([v], i64)) for n, v in (("0", 0), ("2", 2))
    )
    slices: dict[str, gs.Variable] = {}
    for c, node in readers:
        name = f"trt_kv.past.{c.past.name}"
        if name not in slices:
            out = gs.Variable(name, c.past.dtype)
            slices[name] = graph.layer(
                op="Slice", name=name, inputs=[c.past, zero, past, axis], outputs=[out]
            )[0]
        node.inputs[0] = slices[name]
    return set(slices)


def _reach(starts: Iterable[gs.Tensor]) -> set[str]:
    """Names of the tensors computed from ``starts`` by data (not through Shape/Size)."""
    seen, todo = set(), list(starts)
    while todo:
        t = todo.pop()
        if t.name in seen:
            continue
        seen.add(t.name)
        for node in t.outputs:
            if node.op not in _METADATA_OPS:
                todo.extend(node.outputs)
    return seen


def _mask_attention(
    graph: gs.Graph,
    caches: list[GrowingCache],
    positions: gs.Variable,
    tokens: gs.Variable,
    s_max: int,
) -> int:
    """The mask added before each Softmax over a cache replaced by one from ``positions``:
    key row j of token (b, s) is seen when ``j <= positions[b, s]``. Returns their count."""
    dtype = np.dtype(caches[0].past.dtype)
    pos = graph.layer(
        op="Unsqueeze",
        name="trt_kv.mask.positions",
        inputs=[positions, gs.Constant("trt_kv.mask.axes", np.array([1, 3], np.int64))],
        outputs=[gs.Variable("trt_kv.mask.positions4", np.int64)],
    )[0]  # [B, 1, S, 1]
    key_rows = gs.Constant(
        "trt_kv.mask.rows", np.arange(s_max, dtype=np.int64).reshape(1, 1, 1, -1)
    )
    seen = graph.layer(
        op="LessOrEqual",
        name="trt_kv.mask.seen",
        inputs=[key_rows, pos],
        outputs=[gs.Variable("trt_kv.mask.seen", np.bool_)],
    )[0]  # [B, 1, S, S_max]
    zero, lowest = (
        gs.Constant(f"trt_kv.mask.{n}", np.array(v, dtype))
        for n, v in (("zero", 0), ("lowest", np.finfo(dtype).min))
    )
    mask = graph.layer(
        op="Where",
        name="trt_kv.mask",
        inputs=[seen, zero, lowest],
        outputs=[gs.Variable("trt_kv.mask.additive", dtype)],
    )[0]
    from_caches = _reach(c.present for c in caches)
    from_tokens = _reach([tokens])
    masked = 0
    for node in [n for n in graph.nodes if n.op == "Softmax"]:
        if node.inputs[0].name not in from_caches:
            continue
        before = node.inputs[0].inputs[0] if node.inputs[0].inputs else None
        scores = [i for i, t in enumerate(before.inputs) if t.name in from_tokens] if before else []
        if before is None or before.op != "Add" or len(scores) != 1:
            got = f"{before.op} node {before.name}" if before is not None else "a graph input"
            raise NetworkError(
                mismatch(
                    f"Softmax node {node.name}", "an Add of scores and a mask before it", "", got
                )
            )
        before.inputs[1 - scores[0]] = mask
        masked += 1
    if masked == 0:
        raise NetworkError(mismatch("ONNX graph", "a Softmax over a cache (attention)", "", "none"))
    return masked


def _check_no_past_length(graph: gs.Graph, caches: list[GrowingCache], updates: set[str]) -> None:
    """NetworkError when something other than the cache updates (and the slices of
    :func:`_past_lengths`) still reads a cache input (its shape is now ``S_max``, not the past
    length) or the export's attention mask."""
    for c in caches:
        for node in c.past.outputs:
            if node.name not in updates:
                raise NetworkError(
                    mismatch(
                        f"cache input {c.past.name}",
                        "read only by its update (the past length cannot be mapped)",
                        "",
                        f"also read by {node.op} node {node.name}",
                    )
                )
    left = [t.name for t in graph.inputs if t.name == "attention_mask"]
    if left:
        raise NetworkError(mismatch("attention_mask", "read only by the replaced mask", "", "more"))


def _set_opsets(out: onnx.ModelProto, model: onnx.ModelProto, update_op: str) -> None:
    """The source's opsets, the default domain raised to 24 for ``TensorScatter``."""
    del out.opset_import[:]
    for opset in model.opset_import:
        version = opset.version
        if opset.domain in ("", "ai.onnx") and update_op == "TensorScatter":
            version = max(version, SCATTER_OPSET)
        out.opset_import.add(domain=opset.domain, version=version)
    out.ir_version = max(out.ir_version, model.ir_version, 10)
