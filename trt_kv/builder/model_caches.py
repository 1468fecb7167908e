"""The K and V caches of a whole decoder, with one naming scheme.

Inputs ``past_key.{i}`` / ``past_value.{i}`` ``[B, N_kv, S_max, H]``, outputs
``present_key.{i}`` / ``present_value.{i}`` aliasing them, one shared ``write_indices [B]``
(and ``update_lengths [B + 1]`` for the packed form).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trt_kv import dtypes
from trt_kv.builder.kv_cache import (
    CacheAlias,
    Method,
    add_cache_input,
    add_kv_cache_update,
    check_strongly_typed,
    io_names,
    layer_write_indices,
)
from trt_kv.errors import DTypeError, NetworkError, SlotError, check_int, mismatch
from trt_kv.reference.ops import CACHE_DTYPES, INDEX_DTYPES

WRITE_INDICES = "write_indices"
UPDATE_LENGTHS = "update_lengths"


def cache_names(layer: int) -> tuple[str, str, str, str]:
    """``(past_key, past_value, present_key, present_value)`` names of one layer."""
    return (
        f"past_key.{layer}",
        f"past_value.{layer}",
        f"present_key.{layer}",
        f"present_value.{layer}",
    )


def model_cache_aliases(
    num_layers: int, num_kv_heads: int, max_seq_len: int, head_dim: int, dtype: str
) -> list[CacheAlias]:
    """The alias records of a model's caches ``[B, N_kv, S_max, H]`` (B dynamic), named as
    :func:`cache_names`, in input order: what host storage for such a model is made from."""
    shape = (-1, num_kv_heads, max_seq_len, head_dim)
    out = []
    for i in range(num_layers):
        pk, pv, ok, ov = cache_names(i)
        out += [CacheAlias(pk, ok, shape, dtype), CacheAlias(pv, ov, shape, dtype)]
    return out


def layer_caches(window: dict, num_layers: int) -> list[tuple[object, object]]:
    """Per layer ``(K, V)`` of a storage window (input name -> ``[B, N_kv, S_max, H]``)."""
    return [(window[k], window[v]) for k, v, *_ in map(cache_names, range(num_layers))]


@dataclass
class ModelCaches:
    """Cache inputs of every layer; :meth:`update` adds one layer's K and V updates."""

    network: object
    num_layers: int
    write_indices: object  # ITensor [B]
    update_lengths: object | None  # ITensor [B + 1], packed form only
    past: list[tuple[object, object]]  # per layer (K, V) inputs [B, N_kv, S_max, H]
    method: Method = "auto"
    aliases: list[CacheAlias] = field(default_factory=list)

    def update(self, layer: int, key: object, value: object) -> tuple[object, object]:
        """Write this step's ``key``/``value`` (``[B, N_kv, S, H]``, or packed ``[T, N_kv, H]``)
        into layer ``layer``'s caches; returns the updated caches ``[B, N_kv, S_max, H]``."""
        if (
            isinstance(layer, bool)
            or not isinstance(layer, int)
            or not 0 <= layer < self.num_layers
        ):
            raise SlotError(mismatch("layer", f"an integer in [0, {self.num_layers})", "", layer))
        *_, present_k, present_v = cache_names(layer)
        outs = []
        for cache, update, name in zip(self.past[layer], (key, value), (present_k, present_v)):
            done = add_kv_cache_update(
                self.network,
                cache,
                update,
                self.write_indices,
                output_name=name,
                update_lengths=self.update_lengths,
                method=self.method,
            )
            self.aliases.append(done.alias)
            outs.append(done.output)
        return outs[0], outs[1]


def add_model_caches(
    network: object,
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    max_seq_len: int,
    dtype: str = "float16",
    index_dtype: str = "int32",
    packed: bool = False,
    batch: int = -1,
    method: Method = "auto",
) -> ModelCaches:
    """Add ``write_indices [B]`` and the K/V cache inputs of ``num_layers`` layers.

    Raises:
        ArgumentError: ``num_layers``, sizes or ``batch`` not positive integers.
        DTypeError: ``dtype`` not a cache dtype, ``index_dtype`` not int32/int64.
        NetworkError: not strongly typed, or the network already has these inputs.
    """
    check_strongly_typed(network)
    check_int("num_layers", num_layers, 1)
    for name, size in (
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("max_seq_len", max_seq_len),
    ):
        check_int(name, size, 1)
    if batch != -1:
        check_int("batch", batch, 1)
    if index_dtype not in INDEX_DTYPES:
        raise DTypeError(mismatch("index_dtype", "one of", INDEX_DTYPES, repr(index_dtype)))
    if dtype not in CACHE_DTYPES:
        raise DTypeError(mismatch("dtype", "one of", CACHE_DTYPES, repr(dtype)))
    taken = set(io_names(network)) & {WRITE_INDICES, UPDATE_LENGTHS, *cache_names(0)}
    if taken:
        raise NetworkError(mismatch("network", "no model caches yet", "", sorted(taken)))
    write_indices = network.add_input(WRITE_INDICES, dtypes.to_trt(index_dtype), (batch,))
    write_indices = layer_write_indices(network, write_indices)  # one cast for all layers
    update_lengths = None
    if packed:
        lengths_batch = -1 if batch == -1 else batch + 1
        update_lengths = network.add_input(UPDATE_LENGTHS, dtypes.to_trt("int32"), (lengths_batch,))
    past = []
    for i in range(num_layers):
        k_name, v_name, *_ = cache_names(i)
        past.append(
            tuple(
                add_cache_input(
                    network,
                    name,
                    num_heads=num_kv_heads,
                    max_seq_len=max_seq_len,
                    head_dim=head_dim,
                    dtype=dtype,
                    batch=batch,
                )
                for name in (k_name, v_name)
            )
        )
    return ModelCaches(network, num_layers, write_indices, update_lengths, past, method)
