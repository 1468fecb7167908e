"""Find a decoder's growing caches in an ONNX graph: each ``Concat`` along the sequence axis of
a past input ``[B, N, P, H]`` (``past_key_values.{i}.key``) and the step's new keys or values
``[B, N, S, H]`` into an output ``[B, N, P + S, H]`` (``present.{i}.key``), the layout Optimum,
transformers.js and ``torch.onnx.export`` of a flat cache give."""

from __future__ import annotations

import re
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from trt_kv.errors import NetworkError, ShapeError, mismatch

PASSTHROUGH = (
    "Identity",
    "Concat",
)  # one-input nodes an exporter leaves between a cache and its concat
_LAYER = re.compile(r"\.(\d+)\.")


@dataclass(frozen=True)
class GrowingCache:
    """One cache: ``past`` (graph input ``[B, N, P, H]``) concatenated with ``new``
    (``[B, N, S, H]``) by ``concat`` into ``present`` (graph output ``[B, N, P + S, H]``)."""

    past: gs.Variable
    new: gs.Tensor
    concat: gs.Node
    present: gs.Variable

    @property
    def heads(self) -> tuple[int, int]:
        """(N, H): the static head count and head size."""
        return self.past.shape[1], self.past.shape[3]

    @property
    def layer(self) -> int | None:
        """The layer index in the names (``past_key_values.3.key``: 3), else None."""
        found = _LAYER.search(f".{self.past.name}.")
        return int(found.group(1)) if found else None


def _traced_input(tensor: gs.Tensor, inputs: dict[str, gs.Variable]) -> gs.Variable | None:
    """The graph input ``tensor`` is, through one-input Identity/Concat nodes, else None."""
    while tensor.name not in inputs:
        if len(tensor.inputs) != 1 or tensor.inputs[0].op not in PASSTHROUGH:
            return None
        node = tensor.inputs[0]
        if len(node.inputs) != 1:
            return None
        tensor = node.inputs[0]
    return inputs[tensor.name]


def _sequence_axis(node: gs.Node) -> bool:
    axis = node.attrs.get("axis")
    return axis in (2, -2)


def find_caches(graph: gs.Graph) -> list[GrowingCache]:
    """Every growing cache of ``graph``, in the order of its outputs.

    Raises:
        NetworkError: no growing cache (no output is a concatenation of an input along axis
            2); an output concatenating something other than a graph input on axis 2 (caches
            the rewrite cannot pair); a past input (rank 4, ``past`` in its name) no such
            concatenation reads.
        ShapeError: a cache whose head count N or head size H (axes 1, 3) is not static.
    """
    inputs = {t.name: t for t in graph.inputs}
    found = []
    for out in graph.outputs:
        node = out.inputs[0] if len(out.inputs) == 1 else None
        if node is None or node.op != "Concat" or len(node.inputs) != 2:
            continue
        if not _sequence_axis(node):
            continue
        past = _traced_input(node.inputs[0], inputs)
        if past is None:
            what = f"{node.inputs[0].name} (made by {_maker(node.inputs[0])})"
            raise NetworkError(
                mismatch(f"cache output {out.name}", "a concatenation of a graph input", "", what)
            )
        found.append(GrowingCache(past, node.inputs[1], node, out))
    if not found:
        raise NetworkError(
            mismatch(
                "ONNX graph",
                "a growing cache (an output concatenating a past input along axis 2, "
                "past_key_values.{i}.key -> present.{i}.key)",
                "",
                "none",
            )
        )
    paired = {c.past.name for c in found}
    for t in graph.inputs:
        if "past" in t.name and t.shape is not None and len(t.shape) == 4 and t.name not in paired:
            raise NetworkError(
                mismatch(
                    f"cache input {t.name}", "concatenated into an output on axis 2", "", "not"
                )
            )
    for c in found:
        n, h = c.heads
        if not isinstance(n, int) or not isinstance(h, int) or n < 1 or h < 1:
            raise ShapeError(
                mismatch(
                    f"cache input {c.past.name}",
                    "a static head count and head size [B, N, P, H]",
                    "",
                    list(c.past.shape),
                )
            )
    return found


def _maker(tensor: gs.Tensor) -> str:
    return f"{tensor.inputs[0].op} node {tensor.inputs[0].name}" if tensor.inputs else "nothing"
