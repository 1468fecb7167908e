"""Add in-place KV-cache updates to a strongly-typed TensorRT network.

The cache is a network input ``[B, N, S_max, H]`` with a static ``S_max``; the updated cache
is a marked network output that TensorRT aliases to that input (same device address), so
the runtime binds both names to one buffer. Everything is validated before TensorRT sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trt_kv import dtypes
from trt_kv._trt import FEATURES, trt
from trt_kv.errors import (
    ArgumentError,
    DTypeError,
    NetworkError,
    ShapeError,
    check_int,
    mismatch,
)
from trt_kv.reference.ops import CACHE_DTYPES, INDEX_DTYPES

Method = Literal["auto", "layer", "plugin"]
METHODS = ("auto", "layer", "plugin")


@dataclass(frozen=True)
class CacheAlias:
    """One (cache input, updated output) pair; ``shape`` is ``[B, N, S_max, H]``, B may be -1."""

    input: str
    output: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {
            "input": self.input,
            "output": self.output,
            "shape": list(self.shape),
            "dtype": self.dtype,
        }

    @classmethod
    def from_json(cls, d: dict) -> CacheAlias:
        return cls(d["input"], d["output"], tuple(d["shape"]), d["dtype"])


@dataclass(frozen=True)
class CacheUpdate:
    """What :func:`add_kv_cache_update` added: the updated cache tensor and its alias record."""

    output: object  # trt.ITensor, [B, N, S_max, H]
    alias: CacheAlias


def _dims(t: object) -> tuple[int, ...]:
    return tuple(t.shape)


def _same_dim(tensor: str, axis: str, expected: int, actual: int) -> None:
    if expected != -1 and actual != -1 and expected != actual:
        raise ShapeError(mismatch(tensor, axis, expected, actual))


def check_strongly_typed(network: object) -> None:
    """Raise NetworkError unless the network was created STRONGLY_TYPED."""
    if not network.get_flag(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED):
        raise NetworkError(
            mismatch("network", "creation flag", "STRONGLY_TYPED", "not strongly typed")
        )


def validate_cache_update(
    network: object,
    cache: object,
    update: object,
    write_indices: object,
    update_lengths: object | None = None,
    method: Method = "layer",
) -> None:
    """Check the operands of one KV-cache update; raise before TensorRT sees anything.

    Raises:
        NetworkError: network not strongly typed; an operand that is not an ITensor; cache not
            a network input.
        ShapeError: dynamic S_max; a zero or negative cache dimension; B, N or H mismatch;
            S > S_max; bad index or length shapes; packed update without ``update_lengths``.
        DTypeError: cache not float32/float16/bfloat16; update dtype differs from the cache;
            indices not int32/int64.
    """
    check_strongly_typed(network)
    operands = {"cache": cache, "update": update, "write_indices": write_indices}
    if update_lengths is not None:
        operands["update_lengths"] = update_lengths
    for role, tensor in operands.items():
        if not isinstance(tensor, trt.ITensor):
            raise NetworkError(mismatch(role, "a TensorRT ITensor", "", type(tensor).__name__))
    if not cache.is_network_input:
        raise NetworkError(
            mismatch(cache.name, "a network input as cache", "input", "a layer output")
        )
    c = _dims(cache)
    if len(c) != 4:
        raise ShapeError(mismatch(cache.name, "rank ([B, N, S_max, H])", 4, len(c)))
    b, n, s_max, h = c
    if s_max == -1:
        raise ShapeError(mismatch(cache.name, "static S_max (axis 2)", "a positive size", -1))
    for axis, d in (
        ("B (axis 0)", b),
        ("N (axis 1)", n),
        ("S_max (axis 2)", s_max),
        ("H (axis 3)", h),
    ):
        if d == 0 or d < -1:
            raise ShapeError(mismatch(cache.name, axis, "a positive size (or -1)", d))
    cache_dtype = dtypes.name_of(cache.dtype)
    if cache_dtype not in CACHE_DTYPES:
        raise DTypeError(mismatch(cache.name, "dtype", CACHE_DTYPES, cache_dtype))
    update_dtype = dtypes.name_of(update.dtype)
    if update_dtype != cache_dtype:
        raise DTypeError(
            mismatch(update.name, "dtype (same as the cache)", cache_dtype, update_dtype)
        )

    u = _dims(update)
    if update_lengths is None:
        if len(u) == 3:
            raise ShapeError(
                mismatch(
                    update.name,
                    "update_lengths [B + 1] with a packed [T, N, H] update",
                    "a tensor",
                    None,
                )
            )
        if len(u) != 4:
            raise ShapeError(mismatch(update.name, "rank ([B, N, S, H])", 4, len(u)))
        _same_dim(update.name, "B (axis 0)", b, u[0])
        _same_dim(update.name, "N (axis 1)", n, u[1])
        _same_dim(update.name, "H (axis 3)", h, u[3])
        if u[2] > s_max:
            raise ShapeError(mismatch(update.name, f"S <= S_max = {s_max} (axis 2)", "", u[2]))
    else:
        if method == "layer" and not FEATURES.packed_update_form:
            raise NetworkError(
                mismatch(
                    update.name,
                    "packed update support in",
                    "TensorRT >= 10.15",
                    f"{FEATURES.module} {FEATURES.version}",
                )
            )
        if len(u) != 3:
            raise ShapeError(
                mismatch(update.name, "rank of the packed form ([T, N, H])", 3, len(u))
            )
        _same_dim(update.name, "N (axis 1)", n, u[1])
        _same_dim(update.name, "H (axis 2)", h, u[2])
        lengths_dtype = dtypes.name_of(update_lengths.dtype)
        if lengths_dtype != "int32":  # the layer takes INT32 lengths only
            raise DTypeError(mismatch(update_lengths.name, "dtype", "int32", lengths_dtype))
        lengths = _dims(update_lengths)
        if len(lengths) != 1:
            raise ShapeError(mismatch(update_lengths.name, "shape", "[B + 1]", list(lengths)))
        if b != -1 and lengths[0] != -1 and lengths[0] != b + 1:
            raise ShapeError(mismatch(update_lengths.name, "shape [B + 1]", [b + 1], list(lengths)))

    index_dtype = dtypes.name_of(write_indices.dtype)
    if index_dtype not in INDEX_DTYPES:
        raise DTypeError(mismatch(write_indices.name, "dtype", INDEX_DTYPES, index_dtype))
    w = _dims(write_indices)
    if len(w) != 1:
        raise ShapeError(mismatch(write_indices.name, "shape", "[B]", list(w)))
    _same_dim(write_indices.name, "B (axis 0)", b, w[0])


def layer_write_indices(network: object, write_indices: object) -> object:
    """``write_indices`` as the layer can take it: int64 indices are cast to int32 where the
    TensorRT module rejects int64 (lossless: indices are below S_max)."""
    if FEATURES.int64_write_indices or dtypes.name_of(write_indices.dtype) != "int64":
        return write_indices
    cast = network.add_cast(write_indices, trt.int32)
    cast.name = f"cast_int32:{write_indices.name}"
    return cast.get_output(0)


def source_input(network: object, tensor: object) -> object:
    """The network input behind ``tensor``, looking through trt_kv's index casts."""
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == trt.LayerType.CAST and layer.get_output(0).name == tensor.name:
            return source_input(network, layer.get_input(0))
    return tensor


def add_cache_input(
    network: object,
    name: str,
    *,
    num_heads: int,
    max_seq_len: int,
    head_dim: int,
    dtype: str,
    batch: int = -1,
) -> object:
    """Add the cache input ``name``: ``[B, N, S_max, H]`` with static ``S_max``.

    Raises:
        ArgumentError: an empty name; N, S_max or H not a positive integer; B neither -1 nor
            a positive integer.
        NetworkError: ``name`` is already a network input.
        DTypeError: ``dtype`` not float32/float16/bfloat16.
    """
    if not isinstance(name, str) or not name:
        raise ArgumentError(mismatch("name", "a non-empty tensor name", "", repr(name)))
    if dtype not in CACHE_DTYPES:
        raise DTypeError(mismatch(name, "dtype", CACHE_DTYPES, dtype))
    if max_seq_len == -1:
        raise ShapeError(mismatch(name, "static S_max", "a positive size", max_seq_len))
    dims = (
        batch if batch == -1 else check_int(f"{name} batch", batch, 1),
        check_int(f"{name} num_heads", num_heads, 1),
        check_int(f"{name} max_seq_len", max_seq_len, 1),
        check_int(f"{name} head_dim", head_dim, 1),
    )
    inputs = input_names(network)
    if name in inputs:
        raise NetworkError(mismatch(name, "a name no other network input has", "", inputs))
    return network.add_input(name, dtypes.to_trt(dtype), dims)


def input_names(network: object) -> list[str]:
    """Names of the network inputs, in order."""
    return [network.get_input(i).name for i in range(network.num_inputs)]


def io_names(network: object) -> set[str]:
    """Names of every network input and marked output."""
    outputs = {network.get_output(i).name for i in range(network.num_outputs)}
    return outputs | set(input_names(network))


def layer_output_names(network: object) -> set[str]:
    """Names of every layer output (intermediate tensors and marked outputs)."""
    names = set()
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        names.update(layer.get_output(j).name for j in range(layer.num_outputs))
    return names


def add_kv_cache_update(
    network: object,
    cache: object,
    update: object,
    write_indices: object,
    *,
    output_name: str,
    update_lengths: object | None = None,
    method: Method = "auto",
) -> CacheUpdate:
    """Write ``update`` into ``cache`` at ``write_indices`` and mark the result as an output.

    Args:
        cache: network input ``[B, N, S_max, H]``, float32/float16/bfloat16, static S_max.
        update: padded ``[B, N, S, H]`` or packed ``[T, N, H]`` (then ``update_lengths``
            ``[B + 1]`` cumulative counts is required); same dtype as the cache.
        write_indices: ``[B]`` int32/int64; sequence i is written from position
            ``write_indices[i]``. Usually one input shared by every cache of a model.
        output_name: name of the marked output that aliases ``cache``.
        method: "layer" (IKVCacheUpdateLayer), "plugin" (trt_kv's plugin, for TensorRT
            without the layer) or "auto" (the layer when present).

    Returns:
        The updated cache tensor ``[B, N, S_max, H]`` and the alias record, named from the
        tensor itself.

    Raises:
        ArgumentError: unknown ``method``; ``output_name`` empty.
        NetworkError: ``output_name`` is already the name of a network input or output, or
            of an intermediate tensor (all checked before anything is added).
        ShapeError, DTypeError: see :func:`validate_cache_update`.
    """
    if method not in METHODS:
        raise ArgumentError(mismatch("method", "one of", METHODS, repr(method)))
    if not isinstance(output_name, str) or not output_name:
        raise ArgumentError(
            mismatch("output_name", "a non-empty tensor name", "", repr(output_name))
        )
    if output_name in io_names(network):
        raise NetworkError(
            mismatch("output_name", "a name no network input or output has", "", output_name)
        )
    if output_name in layer_output_names(network):  # one scan of the layers, ~ms
        raise NetworkError(mismatch("output_name", "a name no other tensor has", "", output_name))
    if method == "auto":
        method = "layer" if FEATURES.kv_cache_update_layer else "plugin"
    if method == "layer" and not FEATURES.kv_cache_update_layer:
        raise NetworkError(
            mismatch(
                "method",
                "a TensorRT with IKVCacheUpdateLayer for 'layer'",
                ">= 10.15",
                f"{FEATURES.module} {FEATURES.version}",
            )
        )
    validate_cache_update(network, cache, update, write_indices, update_lengths, method)
    write_indices = layer_write_indices(network, write_indices)
    if method == "plugin":
        from trt_kv.plugin import add_plugin_cache_update

        out = add_plugin_cache_update(network, cache, update, write_indices, update_lengths)
    else:
        layer = network.add_kv_cache_update(cache, update, write_indices, trt.KVCacheMode.LINEAR)
        if update_lengths is not None:
            layer.update_form = trt.AttentionIOForm.PACKED_NHD
            layer.update_lengths = update_lengths
        layer.name = f"kv_cache_update:{output_name}"
        out = layer.get_output(0)
    out.name = output_name
    network.mark_output(out)
    alias = CacheAlias(cache.name, out.name, _dims(cache), dtypes.name_of(cache.dtype))
    return CacheUpdate(out, alias)


def cache_update_layers(network: object) -> list[tuple[str, object]]:
    """Every KV-cache update in ``network`` as ``("layer" | "plugin", layer)``; inputs are
    ``(cache, update, write_indices[, update_lengths])`` and output 0 the updated cache."""
    from trt_kv.plugin import is_plugin_cache_update

    found = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if FEATURES.kv_cache_update_layer and layer.type == trt.LayerType.KV_CACHE_UPDATE:
            found.append(("layer", layer))
        elif is_plugin_cache_update(layer):
            found.append(("plugin", layer))
    return found


def cache_aliases(network: object) -> list[CacheAlias]:
    """Every (cache input, updated output) pair in ``network``, read from its layers."""
    found = []
    for _, layer in cache_update_layers(network):
        cache, out = layer.get_input(0), layer.get_output(0)
        found.append(CacheAlias(cache.name, out.name, _dims(cache), dtypes.name_of(cache.dtype)))
    return found
