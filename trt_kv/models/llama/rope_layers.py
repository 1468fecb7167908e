"""RoPE in the network, by route: TensorRT's rotary layer, or elementwise layers.

Both read the float32 tables of :mod:`trt_kv.models.llama.rope`, stored in the compute dtype
(Hugging Face casts cos/sin to the activations' dtype too).

- ``rotary_layer``: ``add_rotary_embedding(x, cos [S_max, H/2], sin, position_ids [B, S])``.
- ``elementwise``: ``x * cos[pos] + rotate_half(x) * sin[pos]`` as Hugging Face writes it:
  rotate-half is a gather of ``x`` along H with constant indices, its sign folds into a signed
  sine table ``[-sin, sin]``, and cos/sin rows ``[B, 1, S, H]`` are gathered by position once
  per network. Every product and the sum round once, as in Hugging Face's float16 forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_kv.models.llama.config import LlamaConfig
from trt_kv.models.llama.graph import Graph
from trt_kv.models.llama.rope import rope_tables


@dataclass(frozen=True)
class Rope:
    """The per-network tensors every RoPE application reads."""

    route: str  # "rotary_layer" or "elementwise"
    position_ids: object  # [B, S] int64
    cos: object  # rotary_layer: [S_max, H/2]; elementwise: [B, 1, S, H]
    sin: object  # rotary_layer: [S_max, H/2]; elementwise: [B, 1, S, H], signed
    rotate: object | None  # elementwise: [H] int32, the rotate-half source of each dim


def rotate_half_tables(
    cos: np.ndarray, sin: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(cos_full [P, H], signed_sin [P, H], rotate [H])`` for ``cos, sin [P, H/2]``:
    ``rotate_half(x) * sin == x[..., rotate] * signed_sin`` with Hugging Face's rotate-half
    (first half takes ``-x2``, second half ``x1``)."""
    half = cos.shape[1]
    rotate = np.concatenate([np.arange(half, 2 * half), np.arange(half)]).astype(np.int32)
    return np.concatenate([cos, cos], 1), np.concatenate([-sin, sin], 1), rotate


def add_rope(
    g: Graph, route: str, config: LlamaConfig, position_ids: object, max_seq_len: int
) -> Rope:
    """The RoPE tensors of ``route`` for positions ``position_ids [B, S]`` int64 below
    ``max_seq_len``."""
    cos, sin = rope_tables(config, max_seq_len)  # [S_max, H/2] float32
    if route == "rotary_layer":
        return Rope(route, position_ids, g.const(cos), g.const(sin), None)
    cos_full, signed_sin, rotate = rotate_half_tables(cos, sin)
    h = config.head_dim

    def rows(table: np.ndarray) -> object:  # [S_max, H] gathered by position -> [B, 1, S, H]
        return g.shuffle(g.gather(g.const(table), position_ids, 0), (0, 1, -1, h))

    return Rope(route, position_ids, rows(cos_full), rows(signed_sin), g.const(rotate, "int32"))


def apply_rope(g: Graph, rope: Rope, x: object) -> object:
    """Rotary embedding of ``x [B, N, S, H]`` (rotate-half pairs, the whole head)."""
    if rope.route == "rotary_layer":
        layer = g.network.add_rotary_embedding(x, rope.cos, rope.sin, False, 0)
        layer.set_input(3, rope.position_ids)
        return layer.get_output(0)
    rotated = g.gather(x, rope.rotate, 3)  # [B, N, S, H]: (x2, x1)
    return g.add(g.mul(x, rope.cos), g.mul(rotated, rope.sin))
