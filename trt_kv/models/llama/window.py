"""Sliding-window attention over the LINEAR cache: a window keep-mask, nothing else changes.

Query at position p sees keys j with ``p - window < j <= p`` (Hugging Face's sliding-window
mask); the cache stays ``[B, N_kv, S_max, H]`` and keys that fell out of the window stay in
it, unread through the mask (docs/models.md gives the cost against a ring buffer).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from trt_kv._trt import trt
from trt_kv.models.layers.attention import Masks
from trt_kv.models.layers.graph import Graph


def window_masks(
    g: Graph, masks: Masks, position_ids: object, window: int, max_seq_len: int
) -> Masks:
    """``masks`` with the causal keep-mask ``[B, 1, S, S_max]`` narrowed to the window:
    ``keep[b, 0, s, j] &= j > position_ids[b, s] - window`` (``position_ids [B, S]`` int64)."""
    j = g.const(np.arange(max_seq_len).reshape(1, 1, 1, -1) + window, "int64")  # j + window
    pos = g.shuffle(position_ids, (0, 1, -1, 1))  # [B, 1, S, 1]
    inside = g.eltwise(j, pos, trt.ElementWiseOperation.GREATER)  # j + window > p
    keep = g.eltwise(masks.keep, inside, trt.ElementWiseOperation.AND)
    return replace(masks, keep=keep)
