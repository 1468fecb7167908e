"""RoPE in the network, by route: TensorRT's rotary layer, or elementwise layers.

Both read the float32 tables of :mod:`trt_kv.models.llama.rope`, stored in the compute dtype
(Hugging Face casts cos/sin to the activations' dtype too). With longrope past its original
length the tables stack short and long rows ``[2 * S_max, R/2]``, and both routes read the row
``position + S_max * (rope_lengths[b] > original_max_position_embeddings)``: the choice of
table is made in the network, per sequence and per step.

- ``rotary_layer``: ``add_rotary_embedding(x, cos [T, R/2], sin, rows [B, S])``.
- ``elementwise``: ``x * cos[pos] + rotate_half(x) * sin[pos]`` as Hugging Face writes it:
  rotate-half is a gather of ``x`` along H with constant indices, its sign folds into a signed
  sine table ``[-sin, sin]``, and cos/sin rows ``[B, 1, S, H]`` are gathered by position once
  per network. Every product and the sum round once, as in Hugging Face's float16 forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_kv._trt import trt
from trt_kv.errors import ArgumentError, mismatch
from trt_kv.models.layers.graph import Graph
from trt_kv.models.llama.config import LlamaConfig
from trt_kv.models.llama.rope import long_rope_after, rope_rows

_GREATER = trt.ElementWiseOperation.GREATER


@dataclass(frozen=True)
class Rope:
    """The per-network tensors every RoPE application reads; ``table_rows [B, S]`` int64 are
    the cos/sin table rows of the tokens (not their positions once longrope's long table is
    stacked after the short one)."""

    route: str  # "rotary_layer" or "elementwise"
    table_rows: object  # [B, S] int64: each token's row of cos/sin [T, R/2], its position,
    # or position + S_max where longrope's long table applies (rows S_max..2 S_max - 1)
    cos: object  # rotary_layer: [T, R/2]; elementwise: [B, 1, S, H]
    sin: object  # rotary_layer: [T, R/2]; elementwise: [B, 1, S, H], signed
    rotate: object | None  # elementwise: [H] int32, the rotate-half source of each dim
    rotary_dim: int  # rotary_layer: R, the leading dims that rotate (0: all H)


def rotate_half_tables(
    cos: np.ndarray, sin: np.ndarray, head_dim: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(cos_full [P, H], signed_sin [P, H], rotate [H])`` for ``cos, sin [P, R/2]``:
    ``rotate_half(x) * sin == x[..., rotate] * signed_sin`` with Hugging Face's rotate-half
    (first half takes ``-x2``, second half ``x1``) on the leading R dims; the H - R dims
    past them (partial rotary; ``head_dim`` H, default R) pass through (cos 1, sin 0)."""
    half = cos.shape[1]
    rest = np.arange(2 * half, head_dim or 2 * half)
    rotate = np.concatenate([np.arange(half, 2 * half), np.arange(half), rest]).astype(np.int32)
    ones, zeros = (
        np.ones((cos.shape[0], len(rest)), cos.dtype),
        np.zeros((cos.shape[0], len(rest)), cos.dtype),
    )
    return np.concatenate([cos, cos, ones], 1), np.concatenate([-sin, sin, zeros], 1), rotate


def add_rope(
    g: Graph,
    route: str,
    config: LlamaConfig,
    position_ids: object,
    max_seq_len: int,
    rope_lengths: object | None = None,
) -> Rope:
    """The RoPE tensors of ``route`` for positions ``position_ids [B, S]`` int64 below
    ``max_seq_len``; ``rope_lengths [B]`` int32 picks longrope's table per sequence (needed
    when :func:`~trt_kv.models.llama.rope.long_rope_after` is set, else unused).

    Raises:
        ArgumentError: longrope's long table is in reach and ``rope_lengths`` is None
            (checked before any layer is added); NumPy runs out of memory making the tables
            (naming ``max_seq_len``; :func:`check_table_memory` checks first).
    """
    after = long_rope_after(config, max_seq_len)
    if after is not None and rope_lengths is None:
        raise ArgumentError(
            mismatch(
                "rope_lengths",
                f"a [B] int32 tensor (longrope with max_seq_len {max_seq_len} > original",
                f"{after})",
                None,
            )
        )
    cos, sin = _tables(config, max_seq_len)  # [T, R/2] float32
    rows = position_ids
    if after is not None:  # row = position + S_max where rope_lengths[b] > original
        long = g.eltwise(rope_lengths, g.const(np.full(1, after), "int32"), _GREATER)  # [B]
        shift = g.const(np.full(1, max_seq_len), "int64")
        offset = g.network.add_select(long, shift, g.const(np.zeros(1), "int64")).get_output(0)
        rows = g.add(position_ids, g.shuffle(offset, (-1, 1)))  # [B, S] + [B, 1]
    h = config.head_dim
    if route == "rotary_layer":
        dim = 0 if config.rotary_dim == h else config.rotary_dim  # 0: the whole head
        return Rope(route, rows, g.const(cos), g.const(sin), None, dim)
    cos_full, signed_sin, rotate = rotate_half_tables(cos, sin, h)

    def gathered(table: np.ndarray) -> object:  # [T, H] gathered by row -> [B, 1, S, H]
        return g.shuffle(g.gather(g.const(table), rows, 0), (0, 1, -1, h))

    rotate = g.const(rotate, "int32")
    return Rope(route, rows, gathered(cos_full), gathered(signed_sin), rotate, 0)


def table_bytes(config: LlamaConfig, max_seq_len: int) -> int:
    """Host bytes the RoPE tables of an S_max of ``max_seq_len`` take at least while an engine
    is built: cos and sin ``[T, H]`` float32 (T = S_max, 2 S_max with longrope's stacked
    tables), held by the network and again by the serialized engine."""
    rows = max_seq_len * (1 if long_rope_after(config, max_seq_len) is None else 2)
    return 2 * 2 * rows * config.head_dim * 4


def check_table_memory(config: LlamaConfig, max_seq_len: int, name: str = "max_seq_len") -> None:
    """Refuse an S_max whose :func:`table_bytes` exceed the host's available memory (Linux's
    MemAvailable; not checked where it is unknown), before anything is built.

    Raises:
        ArgumentError: naming ``name`` (the CLI: ``--max-seq-len``), the available and the
            needed bytes.
    """
    from trt_kv.runtime.host_memory import available_host_bytes  # runtime imports models

    free = available_host_bytes()
    if free is not None and table_bytes(config, max_seq_len) > free:
        raise _too_long(config, max_seq_len, f", {free / 2**30:.1f} GiB available", name)


def _too_long(config: LlamaConfig, max_seq_len: int, where: str, name: str) -> ArgumentError:
    need = table_bytes(config, max_seq_len) / 2**30
    return ArgumentError(
        mismatch(
            name,
            f"an S_max whose RoPE tables fit host memory{where}",
            "",
            f"{max_seq_len} (tables [S_max, H] of {need:.1f} GiB)",
        )
    )


def _tables(config: LlamaConfig, max_seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~trt_kv.models.llama.rope.rope_rows`; NumPy running out of memory making them
    is an ArgumentError naming ``max_seq_len``."""
    try:
        return rope_rows(config, max_seq_len)
    except MemoryError as err:
        raise _too_long(config, max_seq_len, "", "max_seq_len") from err


def apply_rope(g: Graph, rope: Rope, x: object) -> object:
    """Rotary embedding of ``x [B, N, S, H]`` (rotate-half pairs on the leading R dims)."""
    if rope.route == "rotary_layer":
        layer = g.network.add_rotary_embedding(x, rope.cos, rope.sin, False, rope.rotary_dim)
        layer.set_input(3, rope.table_rows)
        return layer.get_output(0)
    rotated = g.gather(x, rope.rotate, 3)  # [B, N, S, H]: (x2, x1)
    return g.add(g.mul(x, rope.cos), g.mul(rotated, rope.sin))
