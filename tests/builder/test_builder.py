"""KV-cache builder: real TensorRT-RTX engine builds on the CPU, and every validation error."""

import numpy as np
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


def _inner_named(net, tensor, name):
    """An identity of ``tensor`` named ``name`` (a tensor that is no network input)."""
    inner = net.add_identity(tensor).get_output(0)
    inner.name = name
    return inner


def _a_second_cache(net, ops):
    """The padded update already written as ``present``; a second cache to write next."""
    add_kv_cache_update(
        net, ops["cache"], ops["update"], ops["write_indices"], output_name="present"
    )
    other = add_cache_input(
        net, "past2", num_heads=N, max_seq_len=S_MAX, head_dim=H, dtype="float16", batch=B
    )
    return {"cache": other, "output_name": "present"}


def _an_inner_tensor_named_taken(net, ops):
    """An identity of the update named ``taken``, the name the case asks for its output."""
    _inner_named(net, ops["update"], "taken")
    return {"output_name": "taken"}


# add_kv_cache_update on the padded network (B, N, S_MAX, H = 2, 3, 16, 8; float16 cache and
# update, int32 write_indices, output "o") with what a case replaces, made on that network.
REFUSED_UPDATES = [
    pytest.param(
        lambda net, ops: {"cache": _inner_named(net, ops["cache"], "copied_cache")},
        NetworkError,
        "copied_cache: expected a network input as cache",
        id="cache_not_a_network_input",
    ),
    pytest.param(
        lambda net, ops: {"cache": net.add_input("dyn", trt.float16, (B, N, -1, H))},
        ShapeError,
        r"dyn: expected static S_max \(axis 2\) a positive size, got -1",
        id="dynamic_s_max",
    ),
    pytest.param(
        lambda net, ops: {
            "cache": net.add_input("icache", trt.int32, (B, N, S_MAX, H)),
            "update": net.add_input("iupdate", trt.int32, (B, N, 1, H)),
        },
        DTypeError,
        r"icache: expected dtype \('float32', 'float16', 'bfloat16'\), got int32",
        id="cache_dtype_not_float",
    ),
    pytest.param(
        lambda net, ops: {"cache": net.add_input("zero_h", trt.float16, (B, N, S_MAX, 0))},
        ShapeError,
        r"zero_h: expected H \(axis 3\) a positive size \(or -1\), got 0",
        id="zero_head_size_in_a_hand_made_cache",
    ),
    pytest.param(
        lambda net, ops: {"update": net.add_input("u32", trt.float32, (B, N, 1, H))},
        DTypeError,
        r"u32: expected dtype \(same as the cache\) float16, got float32",
        id="update_dtype_differs_from_cache",
    ),
    pytest.param(
        lambda net, ops: {"update": net.add_input("bad", trt.float16, (B + 1, N, 1, H))},
        ShapeError,
        r"bad: expected B \(axis \d\) 2, got 3",
        id="batch_mismatch",
    ),
    pytest.param(
        lambda net, ops: {"update": net.add_input("bad", trt.float16, (B, N + 1, 1, H))},
        ShapeError,
        r"bad: expected N \(axis \d\) 3, got 4",
        id="heads_mismatch",
    ),
    pytest.param(
        lambda net, ops: {"update": net.add_input("bad", trt.float16, (B, N, 1, H + 2))},
        ShapeError,
        r"bad: expected H \(axis \d\) 8, got 10",
        id="head_size_mismatch",
    ),
    pytest.param(
        lambda net, ops: {"update": net.add_input("long", trt.float16, (B, N, S_MAX + 1, H))},
        ShapeError,
        r"long: expected S <= S_max = 16 \(axis 2\), got 17",
        id="update_longer_than_s_max",
    ),
    pytest.param(
        lambda net, ops: {"write_indices": net.add_input("fidx", trt.float32, (B,))},
        DTypeError,
        r"fidx: expected dtype \('int32', 'int64'\), got float32",
        id="write_indices_of_wrong_dtype",
    ),
    pytest.param(
        lambda net, ops: {"write_indices": net.add_input("idx2d", trt.int32, (B, 1))},
        ShapeError,
        r"idx2d: expected shape \[B\], got \[2, 1\]",
        id="write_indices_of_wrong_shape",
    ),
    pytest.param(
        lambda net, ops: {"write_indices": net.add_input("idx3", trt.int32, (B + 1,))},
        ShapeError,
        r"idx3: expected B \(axis 0\) 2, got 3",
        id="write_indices_of_wrong_batch",
    ),
    pytest.param(
        lambda net, ops: {"write_indices": np.zeros(B, np.int32)},
        NetworkError,
        "write_indices: expected a TensorRT ITensor, got ndarray",
        id="write_indices_not_a_tensor",
    ),
    pytest.param(
        lambda net, ops: {"update": net.add_input("packed", trt.float16, (-1, N, H))},
        ShapeError,
        r"packed: expected update_lengths \[B \+ 1\] with a packed",
        id="packed_form_without_lengths",
    ),
    pytest.param(
        lambda net, ops: {
            "update": net.add_input("packed", trt.float16, (-1, N, H)),
            "update_lengths": net.add_input("lens", trt.int32, (B,)),
        },
        ShapeError,
        r"lens: expected shape \[B \+ 1\] \[3\], got \[2\]",
        id="packed_lengths_of_wrong_shape",
    ),
    pytest.param(
        lambda net, ops: {
            "update": net.add_input("packed", trt.float16, (-1, N, H)),
            "update_lengths": net.add_input("lens64", trt.int64, (B + 1,)),
        },
        DTypeError,
        r"lens64: expected dtype int32, got int64",
        id="packed_lengths_not_int32",
    ),
    pytest.param(
        lambda net, ops: {"output_name": "past"},
        NetworkError,
        "output_name: expected a name no network input or output has, got past",
        id="output_name_of_the_input_past",
    ),
    pytest.param(
        lambda net, ops: {"output_name": "update"},
        NetworkError,
        "output_name: expected a name no network input or output has, got update",
        id="output_name_of_the_input_update",
    ),
    pytest.param(
        lambda net, ops: {"output_name": "write_indices"},
        NetworkError,
        "output_name: expected a name no network input or output has, got write_indices",
        id="output_name_of_the_input_write_indices",
    ),
    pytest.param(
        _a_second_cache,
        NetworkError,
        "output_name: expected a name no network input or output has, got present",
        id="output_name_of_another_output",
    ),
    pytest.param(  # nothing added, nothing marked: no alias names a missing tensor
        _an_inner_tensor_named_taken,
        NetworkError,
        "output_name: expected a name no other tensor has, got taken",
        id="output_name_held_by_an_inner_tensor",
    ),
    pytest.param(
        lambda net, ops: {"method": "fast"},
        ArgumentError,
        "method: expected one of",
        id="unknown_method",
    ),
]


@pytest.mark.parametrize(("replace", "exc", "message"), REFUSED_UPDATES)
def test_a_bad_cache_update_is_refused_and_adds_nothing(replace, exc, message):
    _, net, cache, update, idx = _padded()
    ops = {"cache": cache, "update": update, "write_indices": idx, "output_name": "o"}
    ops.update(replace(net, ops))
    _raises(exc, message, lambda: add_kv_cache_update(net, **ops), net)


UPDATE = ((B, N, 1, H), (B, N, 1, H), (B, N, S_MAX, H))  # a good profile's min, opt, max

# build_engine(builder, net, profiles, **options) on the padded network, its update written
REFUSED_BUILDS = [
    pytest.param(
        [Profile("p", {})],
        {},
        ShapeError,
        r"profile 'p': expected shapes for dynamic inputs",
        id="profile_missing_a_dynamic_input",
    ),
    pytest.param(
        [Profile("p", {"update": ((B, N, 1, H), (B, N, 1, H), (B, N, S_MAX + 1, H))})],
        {},
        ShapeError,
        r"update in profile 'p': expected max S \(axis 2\) <= S_max = 16",
        id="profile_growing_a_padded_update_past_s_max",
    ),
    pytest.param(
        [Profile("p", {"update": ((B, N, 4, H), (B, N, 2, H), (B, N, 1, H))})],
        {},
        ShapeError,
        "expected min <= opt <= max on every axis",
        id="profile_with_min_above_max",
    ),
    pytest.param(
        [Profile("p", {"update": ((B, N, -1, H), (B, N, 1, H), (B, N, 2, H))})],
        {},
        ShapeError,
        "expected sizes that are integers >= 0",
        id="profile_with_negative_sizes",
    ),
    pytest.param(
        [Profile("p", {"update": ((B, N, 1, H), (B, N, S_MAX, H))})],
        {},
        ShapeError,
        r"update in profile 'p': expected \(min, opt, max\)",
        id="profile_entries_not_three_shapes",
    ),
    pytest.param(
        [Profile("p", {"update": UPDATE})],
        {"optimization_level": 9},
        ArgumentError,
        r"optimization_level: expected an integer in \[0, 5\]",
        id="optimization_level_9",
    ),
    pytest.param(
        Profile("p", {"update": UPDATE}),
        {},
        ArgumentError,
        "profiles: expected a list of Profile",
        id="profiles_not_a_list",
    ),
]


@pytest.mark.parametrize(("profiles", "options", "exc", "message"), REFUSED_BUILDS)
def test_a_bad_profile_or_build_option_is_refused(profiles, options, exc, message):
    builder, net, cache, update, idx = _padded()
    add_kv_cache_update(net, cache, update, idx, output_name="present")
    with pytest.raises(exc, match=message):
        build_engine(builder, net, profiles, **options)


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


# An update whose N or H (dynamic in the network) differs from the cache's (N = 3, H = 8).
DISAGREEING_UPDATES = [
    pytest.param(  # TensorRT's own error named neither the update nor the cache, nor the sizes
        "padded",
        Profile("p", {"update": ((B, N, 1, H), (B, N, 1, H), (B, N + 1, S_MAX, H))}),
        r"^update in profile 'p': expected max N \(axis 1\) of cache past 3, got 4$",
        id="padded_update_n_in_its_profile",
    ),
    pytest.param(  # TensorRT's own error said "the same number of heads" for a head size
        "packed",
        Profile("p", {"update": ((1, N, H), (B, N, H + 1), (B * S_MAX, N, H + 1))}),
        r"^update in profile 'p': expected opt H \(axis 2\) of cache past 8, got 9$",
        id="packed_update_h_in_its_profile",
    ),
    pytest.param(  # no profile of its own: TensorRT finds it, the error names both and sizes
        "computed",
        Profile("p", {"x": ((B, N, 1, H), (B, N, 1, H + 2), (B, N, S_MAX, H + 2))}),
        r"^neg_x \(update of cache past\): expected N \(axis 1\) and H \(axis 3\) "
        r"of the cache 3 and 8 in every profile, got other sizes \(TensorRT: .*heads",
        id="computed_update_n_or_h",
    ),
]


@pytest.mark.parametrize(("form", "profile", "message"), DISAGREEING_UPDATES)
def test_an_update_whose_n_or_h_differs_from_the_cache_is_refused_by_name(form, profile, message):
    builder, net = _dynamic_update(form)
    with pytest.raises(ShapeError, match=message):
        build_engine(builder, net, [profile])


def test_layer_method_is_the_auto_choice_with_tensorrt_rtx():
    _, net, cache, update, idx = _padded()
    add_kv_cache_update(net, cache, update, idx, output_name="o", method="auto")
    assert net.get_layer(net.num_layers - 1).type == trt.LayerType.KV_CACHE_UPDATE


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


def _io(net):
    inputs = [net.get_input(i).name for i in range(net.num_inputs)]
    return inputs, [net.get_output(i).name for i in range(net.num_outputs)]


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
