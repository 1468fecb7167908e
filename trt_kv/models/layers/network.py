"""What every decoder network builder does before its first layer: check its sizes, then add
the step's inputs (token ids, positions, key lengths), the caches and the attention masks."""

from __future__ import annotations

from dataclasses import dataclass

from trt_kv import build_defaults as defaults
from trt_kv._trt import trt
from trt_kv.builder import add_model_caches
from trt_kv.builder.model_caches import ModelCaches
from trt_kv.builder.routes import Routes
from trt_kv.contract import INPUT_ROLES
from trt_kv.errors import ShapeError, check_int, mismatch
from trt_kv.models.layers.attention import Masks, add_masks
from trt_kv.models.layers.graph import Graph


def check_step_sizes(max_seq_len: int, max_batch: int, max_step_tokens: int | None) -> int:
    """``max_step_tokens`` (None: :func:`trt_kv.build_defaults.default_step_tokens`) once
    the sizes of a decoder network are checked.

    Raises:
        ArgumentError: a size not an integer >= 1; ``max_seq_len`` past 2^31 - 1 (int32
            write indices and lengths).
        ShapeError: ``max_step_tokens > max_seq_len``.
    """
    check_int("max_seq_len", max_seq_len, 1, 2**31 - 1)
    check_int("max_batch", max_batch, 1)
    if max_step_tokens is None:
        max_step_tokens = defaults.default_step_tokens(max_seq_len)
    check_int("max_step_tokens", max_step_tokens, 1)
    if max_step_tokens > max_seq_len:
        raise ShapeError(
            mismatch("max_step_tokens", f"<= max_seq_len = {max_seq_len}", "", max_step_tokens)
        )
    return max_step_tokens


@dataclass
class StepInputs:
    """A decoder's step inputs (named by the contract's defaults), caches and masks."""

    input_ids: object  # [B, S] int32
    position_ids: object  # [B, S] int64 (the cache row of each token)
    kv_lengths: object | None  # [B] int32, where the routes read key lengths
    caches: ModelCaches  # [B, N, S_max, H] each, with their updates' aliased outputs
    masks: Masks


def add_step_inputs(
    g: Graph,
    routes: Routes,
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    max_seq_len: int,
    dtype: str,
) -> StepInputs:
    """Add ``input_ids`` ``[B, S]``, ``position_ids`` ``[B, S]``, the caches of
    ``num_layers`` layers (``[B, num_kv_heads, max_seq_len, head_dim]``), ``key_value_lengths``
    ``[B]`` where ``routes`` read it, and the masks built from them."""
    network = g.network
    input_ids = network.add_input(INPUT_ROLES["token_ids"].default_name, trt.int32, (-1, -1))
    position_ids = network.add_input(INPUT_ROLES["positions"].default_name, trt.int64, (-1, -1))
    caches = add_model_caches(
        network,
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_seq_len=max_seq_len,
        dtype=dtype,
        method=routes.cache_update,
    )
    kv_lengths = None
    if routes.key_value_lengths:
        name = INPUT_ROLES["kv_lengths"].default_name
        kv_lengths = network.add_input(name, trt.int32, (-1,))
    masks = add_masks(g, routes, position_ids, kv_lengths, max_seq_len)
    return StepInputs(input_ids, position_ids, kv_lengths, caches, masks)
