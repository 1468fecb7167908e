"""KV-cache builder: real TensorRT-RTX engine builds on the CPU, and every validation error."""

import pytest

from trt_kv import FEATURES, dtypes, trt
from trt_kv.builder import (
    Profile,
    add_cache_input,
    add_kv_cache_update,
    add_model_caches,
    build_engine,
    cache_aliases,
    create_network,
)
from trt_kv.errors import ArgumentError, DTypeError, NetworkError, ShapeError

B, N, S_MAX, H = 2, 3, 16, 8


def _padded(dtype="float16", index_dtype="int32"):
    builder, net = create_network()
    cache = add_cache_input(
        net, "past", num_heads=N, max_seq_len=S_MAX, head_dim=H, dtype=dtype, batch=B
    )
    update = net.add_input("update", dtypes.to_trt(dtype), (B, N, -1, H))
    idx = net.add_input("write_indices", dtypes.to_trt(index_dtype), (B,))
    return builder, net, cache, update, idx


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_padded_update_builds_an_engine(dtype, index_dtype):
    builder, net, cache, update, idx = _padded(dtype, index_dtype)
    done = add_kv_cache_update(net, cache, update, idx, output_name="present")
    assert done.alias.input == "past" and done.alias.output == "present"
    assert done.output.is_network_output
    profile = Profile("p", {"update": ((B, N, 1, H), (B, N, 1, H), (B, N, S_MAX, H))})
    assert len(build_engine(builder, net, [profile]).data) > 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_packed_update_builds_an_engine(dtype, index_dtype):
    builder, net = create_network()
    cache = add_cache_input(
        net, "past", num_heads=N, max_seq_len=S_MAX, head_dim=H, dtype=dtype, batch=B
    )
    update = net.add_input("update", dtypes.to_trt(dtype), (-1, N, H))
    idx = net.add_input("write_indices", dtypes.to_trt(index_dtype), (B,))
    lengths = net.add_input("update_lengths", trt.int32, (B + 1,))
    add_kv_cache_update(net, cache, update, idx, output_name="present", update_lengths=lengths)
    layer = net.get_layer(net.num_layers - 1)
    layer.__class__ = trt.IKVCacheUpdateLayer
    assert layer.update_form == trt.AttentionIOForm.PACKED_NHD
    profile = Profile("p", {"update": ((1, N, H), (B, N, H), (B * S_MAX, N, H))})
    assert len(build_engine(builder, net, [profile]).data) > 0


def test_model_caches_name_every_layer_and_share_write_indices():
    _, net = create_network()
    caches = add_model_caches(
        net, num_layers=2, num_kv_heads=N, head_dim=H, max_seq_len=S_MAX, dtype="float16"
    )
    for i in range(2):
        k = net.add_input(f"k{i}", trt.float16, (-1, N, -1, H))
        v = net.add_input(f"v{i}", trt.float16, (-1, N, -1, H))
        caches.update(i, k, v)
    pairs = [(a.input, a.output) for a in cache_aliases(net)]
    assert pairs == [
        ("past_key.0", "present_key.0"),
        ("past_value.0", "present_value.0"),
        ("past_key.1", "present_key.1"),
        ("past_value.1", "present_value.1"),
    ]
    assert pairs == [(a.input, a.output) for a in caches.aliases]
    for i in range(net.num_layers):
        assert net.get_layer(i).get_input(2).name == "write_indices"


def _raises(exc, pattern, fn, net):
    """The call raises ``exc`` matching ``pattern`` and adds nothing to ``net``."""
    before = (net.num_layers, net.num_outputs)
    with pytest.raises(exc, match=pattern):
        fn()
    assert (net.num_layers, net.num_outputs) == before


def test_rtx_networks_are_always_strongly_typed_else_not_strongly_typed_raises():
    builder = trt.Builder(trt.Logger())
    net = builder.create_network(0)
    cache = net.add_input("past", trt.float16, (B, N, S_MAX, H))
    update = net.add_input("update", trt.float16, (B, N, 1, H))
    idx = net.add_input("write_indices", trt.int32, (B,))
    if FEATURES.is_rtx:  # TensorRT-RTX has only strongly typed networks
        assert net.get_flag(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        add_kv_cache_update(net, cache, update, idx, output_name="present")
    else:
        _raises(
            NetworkError,
            "network: expected creation flag STRONGLY_TYPED",
            lambda: add_kv_cache_update(net, cache, update, idx, output_name="o"),
            net,
        )


def test_cache_not_a_network_input_raises():
    _, net, cache, update, idx = _padded()
    not_input = net.add_identity(cache).get_output(0)
    not_input.name = "copied_cache"
    _raises(
        NetworkError,
        "copied_cache: expected a network input as cache",
        lambda: add_kv_cache_update(net, not_input, update, idx, output_name="o"),
        net,
    )


def test_dynamic_s_max_raises():
    _, net, _, update, idx = _padded()
    cache = net.add_input("dyn", trt.float16, (B, N, -1, H))
    _raises(
        ShapeError,
        r"dyn: expected static S_max \(axis 2\) a positive size, got -1",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="o"),
        net,
    )


def test_cache_dtype_not_float_raises():
    _, net, _, _, idx = _padded()
    cache = net.add_input("icache", trt.int32, (B, N, S_MAX, H))
    update = net.add_input("iupdate", trt.int32, (B, N, 1, H))
    _raises(
        DTypeError,
        r"icache: expected dtype \('float32', 'float16', 'bfloat16'\), got int32",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="o"),
        net,
    )


def test_update_dtype_differs_from_cache_raises():
    _, net, cache, _, idx = _padded("float16")
    update = net.add_input("u32", trt.float32, (B, N, 1, H))
    _raises(
        DTypeError,
        r"u32: expected dtype \(same as the cache\) float16, got float32",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="o"),
        net,
    )


@pytest.mark.parametrize(
    ("shape", "axis", "expected", "actual"),
    [
        ((B + 1, N, 1, H), "B", B, B + 1),
        ((B, N + 1, 1, H), "N", N, N + 1),
        ((B, N, 1, H + 2), "H", H, H + 2),
    ],
)
def test_batch_heads_or_head_size_mismatch_raises(shape, axis, expected, actual):
    _, net, cache, _, idx = _padded()
    update = net.add_input("bad", trt.float16, shape)
    _raises(
        ShapeError,
        rf"bad: expected {axis} \(axis \d\) {expected}, got {actual}",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="o"),
        net,
    )


def test_update_longer_than_s_max_raises():
    _, net, cache, _, idx = _padded()
    update = net.add_input("long", trt.float16, (B, N, S_MAX + 1, H))
    _raises(
        ShapeError,
        rf"long: expected S <= S_max = {S_MAX} \(axis 2\), got {S_MAX + 1}",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="o"),
        net,
    )


def test_write_indices_of_wrong_dtype_raises():
    _, net, cache, update, _ = _padded()
    idx = net.add_input("fidx", trt.float32, (B,))
    _raises(
        DTypeError,
        r"fidx: expected dtype \('int32', 'int64'\), got float32",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="o"),
        net,
    )


def test_write_indices_of_wrong_shape_raises():
    _, net, cache, update, _ = _padded()
    idx = net.add_input("idx2d", trt.int32, (B, 1))
    _raises(
        ShapeError,
        r"idx2d: expected shape \[B\], got \[2, 1\]",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="o"),
        net,
    )


def test_write_indices_of_wrong_batch_raises():
    _, net, cache, update, _ = _padded()
    idx = net.add_input("idx3", trt.int32, (B + 1,))
    _raises(
        ShapeError,
        rf"idx3: expected B \(axis 0\) {B}, got {B + 1}",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="o"),
        net,
    )


def test_packed_form_without_lengths_raises():
    _, net, cache, _, idx = _padded()
    update = net.add_input("packed", trt.float16, (-1, N, H))
    _raises(
        ShapeError,
        r"packed: expected update_lengths \[B \+ 1\] with a packed",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="o"),
        net,
    )


def test_packed_lengths_of_wrong_shape_raises():
    _, net, cache, _, idx = _padded()
    update = net.add_input("packed", trt.float16, (-1, N, H))
    lengths = net.add_input("lens", trt.int32, (B,))
    _raises(
        ShapeError,
        rf"lens: expected shape \[B \+ 1\] \[{B + 1}\], got \[{B}\]",
        lambda: add_kv_cache_update(
            net, cache, update, idx, output_name="o", update_lengths=lengths
        ),
        net,
    )


def test_layer_method_is_the_auto_choice_with_tensorrt_rtx():
    _, net, cache, update, idx = _padded()
    add_kv_cache_update(net, cache, update, idx, output_name="o", method="auto")
    assert net.get_layer(net.num_layers - 1).type == trt.LayerType.KV_CACHE_UPDATE


def test_profile_missing_a_dynamic_input_raises():
    builder, net, cache, update, idx = _padded()
    add_kv_cache_update(net, cache, update, idx, output_name="o")
    with pytest.raises(ShapeError, match=r"profile 'p': expected shapes for dynamic inputs"):
        build_engine(builder, net, [Profile("p", {})])


def test_int64_write_indices_cast_once_for_all_layers_where_the_layer_needs_int32():
    builder, net = create_network()
    caches = add_model_caches(
        net,
        num_layers=3,
        num_kv_heads=N,
        head_dim=H,
        max_seq_len=S_MAX,
        dtype="float16",
        index_dtype="int64",
    )
    for i in range(3):
        kv = net.add_input(f"kv{i}", trt.float16, (-1, N, -1, H))
        caches.update(i, kv, kv)
    casts = [
        net.get_layer(i)
        for i in range(net.num_layers)
        if net.get_layer(i).type == trt.LayerType.CAST
    ]
    assert net.get_input(0).name == "write_indices"
    assert dtypes.name_of(net.get_input(0).dtype) == "int64"
    assert len(casts) == (0 if FEATURES.int64_write_indices else 1)
    shapes = {f"kv{i}": ((1, N, 1, H), (1, N, 1, H), (2, N, 4, H)) for i in range(3)}
    shapes["write_indices"] = ((1,), (1,), (2,))
    shapes.update(
        {
            n: ((1, N, S_MAX, H),) * 2 + ((2, N, S_MAX, H),)
            for a in caches.aliases
            for n in [a.input]
        }
    )
    assert build_engine(builder, net, [Profile("p", shapes)]).data


def test_packed_lengths_must_be_int32():
    _, net, cache, _, idx = _padded()
    update = net.add_input("packed", trt.float16, (-1, N, H))
    lengths = net.add_input("lens64", trt.int64, (B + 1,))
    _raises(
        DTypeError,
        r"lens64: expected dtype int32, got int64",
        lambda: add_kv_cache_update(
            net, cache, update, idx, output_name="o", update_lengths=lengths
        ),
        net,
    )


def _io(net):
    inputs = [net.get_input(i).name for i in range(net.num_inputs)]
    return inputs, [net.get_output(i).name for i in range(net.num_outputs)]


@pytest.mark.parametrize("name", ["past", "update", "write_indices"])
def test_output_name_of_a_network_input_is_refused(name):
    _, net, cache, update, idx = _padded()
    _raises(
        NetworkError,
        f"output_name: expected a name no network input or output has, got {name}",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name=name),
        net,
    )


def test_output_name_of_another_output_is_refused():
    _, net, cache, update, idx = _padded()
    add_kv_cache_update(net, cache, update, idx, output_name="present")
    other = add_cache_input(
        net, "past2", num_heads=N, max_seq_len=S_MAX, head_dim=H, dtype="float16", batch=B
    )
    _raises(
        NetworkError,
        "output_name: expected a name no network input or output has, got present",
        lambda: add_kv_cache_update(net, other, update, idx, output_name="present"),
        net,
    )


def test_output_name_held_by_an_inner_tensor_is_refused_by_its_real_name():
    _, net, cache, update, idx = _padded()
    inner = net.add_identity(update).get_output(0)
    inner.name = "taken"
    _raises(
        NetworkError,
        "output_name: expected a name no other tensor has, got taken",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="taken"),
        net,
    )  # nothing added, nothing marked: no alias names a missing tensor


def test_alias_names_the_real_tensors():
    _, net, cache, update, idx = _padded()
    done = add_kv_cache_update(net, cache, update, idx, output_name="present")
    inputs, outputs = _io(net)
    assert done.alias.input in inputs and done.alias.output in outputs
    assert done.alias.output == done.output.name == "present"
    assert cache_aliases(net) == [done.alias]


@pytest.mark.parametrize(
    ("sizes", "match"),
    [
        ({"num_heads": 0}, "c num_heads: expected an integer >= 1, got 0"),
        ({"head_dim": 0}, "c head_dim: expected an integer >= 1, got 0"),
        ({"head_dim": -3}, "c head_dim: expected an integer >= 1, got -3"),
        ({"max_seq_len": 0}, "c max_seq_len: expected an integer >= 1, got 0"),
        ({"max_seq_len": 8.0}, "c max_seq_len: expected an integer >= 1, got 8.0"),
        ({"batch": 0}, "c batch: expected an integer >= 1, got 0"),
    ],
)
def test_cache_input_sizes_must_be_positive_integers(sizes, match):
    _, net = create_network()
    args = {"num_heads": N, "max_seq_len": S_MAX, "head_dim": H, "dtype": "float16", **sizes}
    with pytest.raises(ArgumentError, match=match):
        add_cache_input(net, "c", **args)
    assert net.num_inputs == 0


def test_duplicate_cache_input_name_is_refused():
    _, net, *_ = _padded()
    with pytest.raises(NetworkError, match=r"past: expected a name no other network input has"):
        add_cache_input(net, "past", num_heads=N, max_seq_len=S_MAX, head_dim=H, dtype="float16")
    assert net.num_inputs == 3


def test_zero_head_size_in_a_hand_made_cache_is_refused():
    _, net, _, update, idx = _padded()
    cache = net.add_input("zero_h", trt.float16, (B, N, S_MAX, 0))
    _raises(
        ShapeError,
        r"zero_h: expected H \(axis 3\) a positive size \(or -1\), got 0",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="o"),
        net,
    )


def test_unknown_method_is_refused_before_anything_is_added():
    _, net, cache, update, idx = _padded()
    _raises(
        ArgumentError,
        "method: expected one of",
        lambda: add_kv_cache_update(net, cache, update, idx, output_name="o", method="fast"),
        net,
    )


def test_model_caches_refuse_bad_sizes_and_a_second_call():
    _, net = create_network()
    with pytest.raises(ArgumentError, match="num_layers: expected an integer >= 1, got 0"):
        add_model_caches(net, num_layers=0, num_kv_heads=N, head_dim=H, max_seq_len=S_MAX)
    with pytest.raises(DTypeError, match="index_dtype: expected one of"):
        add_model_caches(
            net, num_layers=1, num_kv_heads=N, head_dim=H, max_seq_len=S_MAX, index_dtype="int8"
        )
    assert net.num_inputs == 0
    add_model_caches(net, num_layers=1, num_kv_heads=N, head_dim=H, max_seq_len=S_MAX)
    with pytest.raises(NetworkError, match="network: expected no model caches yet"):
        add_model_caches(net, num_layers=1, num_kv_heads=N, head_dim=H, max_seq_len=S_MAX)


def test_profile_growing_a_padded_update_past_s_max_is_refused():
    builder, net, cache, update, idx = _padded()
    add_kv_cache_update(net, cache, update, idx, output_name="present")
    too_wide = Profile("p", {"update": ((B, N, 1, H), (B, N, 1, H), (B, N, S_MAX + 1, H))})
    with pytest.raises(
        ShapeError, match=rf"update in profile 'p': expected max S \(axis 2\) <= S_max = {S_MAX}"
    ):
        build_engine(builder, net, [too_wide])


def _dynamic_update(form):
    """A cache update whose N and H are dynamic: an input, padded ``[B, N, S, H]`` or packed
    ``[T, N, H]``, or ``neg_x``, computed from a dynamic input ``x``."""
    builder, net = create_network()
    cache = add_cache_input(
        net, "past", num_heads=N, max_seq_len=S_MAX, head_dim=H, dtype="float16", batch=B
    )
    idx = net.add_input("write_indices", trt.int32, (B,))
    lengths = None
    if form == "packed":
        update = net.add_input("update", trt.float16, (-1, -1, -1))
        lengths = net.add_input("update_lengths", trt.int32, (B + 1,))
    elif form == "padded":
        update = net.add_input("update", trt.float16, (B, -1, -1, -1))
    else:
        x = net.add_input("x", trt.float16, (B, -1, -1, -1))
        update = net.add_unary(x, trt.UnaryOperation.NEG).get_output(0)
        update.name = "neg_x"
    add_kv_cache_update(net, cache, update, idx, output_name="present", update_lengths=lengths)
    return builder, net


def test_profile_of_a_padded_update_whose_n_differs_from_the_cache_is_refused_by_name():
    """TensorRT's own error named neither the update nor the cache, nor the sizes."""
    builder, net = _dynamic_update("padded")
    wide = Profile("p", {"update": ((B, N, 1, H), (B, N, 1, H), (B, N + 1, S_MAX, H))})
    with pytest.raises(
        ShapeError,
        match=rf"^update in profile 'p': expected max N \(axis 1\) of cache past {N}, got {N + 1}$",
    ):
        build_engine(builder, net, [wide])


def test_profile_of_a_packed_update_whose_h_differs_from_the_cache_is_refused_by_name():
    """TensorRT's own error said "the same number of heads" for a head size that differs."""
    builder, net = _dynamic_update("packed")
    wide = Profile("p", {"update": ((1, N, H), (B, N, H + 1), (B * S_MAX, N, H + 1))})
    with pytest.raises(
        ShapeError,
        match=rf"^update in profile 'p': expected opt H \(axis 2\) of cache past {H}, got {H + 1}$",
    ):
        build_engine(builder, net, [wide])


def test_a_computed_update_whose_n_or_h_differs_from_the_cache_names_both():
    """An update computed in the network has no profile of its own: TensorRT finds the
    disagreement; the error names the update, the cache and the sizes it must have."""
    builder, net = _dynamic_update("computed")
    profile = Profile("p", {"x": ((B, N, 1, H), (B, N, 1, H + 2), (B, N, S_MAX, H + 2))})
    with pytest.raises(
        ShapeError,
        match=rf"^neg_x \(update of cache past\): expected N \(axis 1\) and H \(axis 3\) "
        rf"of the cache {N} and {H} in every profile, got other sizes \(TensorRT: .*heads",
    ):
        build_engine(builder, net, [profile])


def test_profile_with_min_above_max_or_negative_sizes_is_refused():
    builder, net, cache, update, idx = _padded()
    add_kv_cache_update(net, cache, update, idx, output_name="present")
    upside_down = Profile("p", {"update": ((B, N, 4, H), (B, N, 2, H), (B, N, 1, H))})
    with pytest.raises(ShapeError, match="expected min <= opt <= max on every axis"):
        build_engine(builder, net, [upside_down])
    negative = Profile("p", {"update": ((B, N, -1, H), (B, N, 1, H), (B, N, 2, H))})
    with pytest.raises(ShapeError, match="expected sizes that are integers >= 0"):
        build_engine(builder, net, [negative])


def test_build_options_are_checked():
    builder, net, cache, update, idx = _padded()
    add_kv_cache_update(net, cache, update, idx, output_name="present")
    profile = Profile("p", {"update": ((B, N, 1, H), (B, N, 1, H), (B, N, S_MAX, H))})
    with pytest.raises(ArgumentError, match=r"optimization_level: expected an integer in \[0, 5\]"):
        build_engine(builder, net, [profile], optimization_level=9)
    with pytest.raises(ArgumentError, match="profiles: expected a list of Profile"):
        build_engine(builder, net, profile)


def test_operands_that_are_not_tensors_are_refused():
    import numpy as np

    _, net, cache, update, _ = _padded()
    _raises(
        NetworkError,
        "write_indices: expected a TensorRT ITensor, got ndarray",
        lambda: add_kv_cache_update(net, cache, update, np.zeros(B, np.int32), output_name="o"),
        net,
    )


def test_updating_one_layer_twice_is_refused_by_output_name():
    _, net = create_network()
    caches = add_model_caches(net, num_layers=1, num_kv_heads=N, head_dim=H, max_seq_len=S_MAX)
    k = net.add_input("k", trt.float16, (-1, N, -1, H))
    caches.update(0, k, k)
    _raises(
        NetworkError,
        "output_name: expected a name no network input or output has, got present_key.0",
        lambda: caches.update(0, k, k),
        net,
    )


def test_profile_entries_must_be_three_shapes():
    builder, net, cache, update, idx = _padded()
    add_kv_cache_update(net, cache, update, idx, output_name="present")
    two = Profile("p", {"update": ((B, N, 1, H), (B, N, S_MAX, H))})
    with pytest.raises(ShapeError, match=r"update in profile 'p': expected \(min, opt, max\)"):
        build_engine(builder, net, [two])
