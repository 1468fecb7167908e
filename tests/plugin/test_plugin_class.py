"""The Python IPluginV3 and its creator, driven through the real TensorRT Python bindings as far
as they go without a builder; and what fails where TensorRT has no ``add_plugin_v3``."""

from __future__ import annotations

import numpy as np
import pytest

from trt_kv import dtypes
from trt_kv._trt import FEATURES, trt
from trt_kv.builder import add_cache_input, add_kv_cache_update, create_network
from trt_kv.errors import GpuUnavailableError, NetworkError
from trt_kv.plugin import (
    ALIASED_IO,
    PLUGIN_NAME,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    KvCacheUpdatePlugin,
    KvCacheUpdatePluginCreator,
    add_plugin_cache_update,
    create_plugin,
    enable_aliased_io,
    is_plugin_cache_update,
    launch,
    register_creator,
)
from trt_kv.plugin.plugin import fields, parse_fields, plan_from_descs

F32, F16, BF16, I32, I64 = trt.float32, trt.float16, trt.bfloat16, trt.int32, trt.int64
LINEAR = trt.TensorFormat.LINEAR


def desc(dtype, dims=(1,), fmt=LINEAR):
    d = trt.PluginTensorDesc()
    d.type, d.format, d.dims = dtype, fmt, trt.Dims(list(dims))
    return d


def dyn(dtype, fmt=LINEAR):
    d = trt.DynamicPluginTensorDesc()
    d.desc = desc(dtype, fmt=fmt)
    return d


def int_field(name, value):
    return trt.PluginField(name, np.array([value], np.int32), trt.PluginFieldType.INT32)


def padded_network():
    _, network = create_network()
    cache = add_cache_input(
        network, "cache_k", num_heads=2, max_seq_len=8, head_dim=4, dtype="float16"
    )
    update = network.add_input("new_k", trt.float16, (-1, 2, -1, 4))
    w = network.add_input("write_indices", trt.int32, (-1,))
    return network, cache, update, w


# --- identity, fields, creator, registry -------------------------------------------------------


def test_plugin_identifies_as_trt_kv_cache_update():
    plugin = KvCacheUpdatePlugin("packed")
    assert (plugin.plugin_name, plugin.plugin_namespace, plugin.plugin_version) == (
        "TrtKvCacheUpdate",
        "trt_kv",
        "1",
    )
    assert plugin.num_outputs == 1
    assert (plugin.form, plugin.mode) == ("packed", "linear")
    assert isinstance(plugin, trt.IPluginV3)


@pytest.mark.parametrize(
    ("kwargs", "word"), [({"form": "ragged"}, "form"), ({"mode": "x"}, "mode")]
)
def test_plugin_rejects_unknown_form_or_mode(kwargs, word):
    with pytest.raises(ValueError, match=word):
        KvCacheUpdatePlugin(**kwargs)


def test_creator_advertises_mode_and_form_int32_fields():
    creator = KvCacheUpdatePluginCreator()
    assert (creator.name, creator.plugin_namespace, creator.plugin_version) == (
        PLUGIN_NAME,
        PLUGIN_NAMESPACE,
        PLUGIN_VERSION,
    )
    assert [(f.name, f.type) for f in creator.field_names] == [
        ("mode", trt.PluginFieldType.INT32),
        ("form", trt.PluginFieldType.INT32),
    ]


def test_serialized_fields_are_int32_indices():
    collection = KvCacheUpdatePlugin("packed").get_fields_to_serialize()
    assert [(f.name, f.data.tolist()) for f in collection] == [("mode", [0]), ("form", [1])]


@pytest.mark.parametrize("form", ["padded", "packed"])
def test_fields_round_trip_through_the_creator(form):
    original = KvCacheUpdatePlugin(form)
    again = KvCacheUpdatePluginCreator().create_plugin(
        PLUGIN_NAME, original.get_fields_to_serialize(), trt.TensorRTPhase.RUNTIME
    )
    assert (again.form, again.mode, again.phase) == (form, "linear", trt.TensorRTPhase.RUNTIME)


def test_registered_creator_is_found_by_the_tensorrt_registry():
    creator = register_creator()
    found = trt.get_plugin_registry().get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    assert found is creator
    assert register_creator() is creator  # idempotent: a second call registers nothing
    plugin = found.create_plugin(PLUGIN_NAME, fields("packed"), trt.TensorRTPhase.BUILD)
    assert plugin.form == "packed"


def test_create_plugin_goes_through_the_fields():
    plugin = create_plugin("padded")
    assert (plugin.form, plugin.phase) == ("padded", trt.TensorRTPhase.BUILD)


@pytest.mark.parametrize(
    ("collection", "word"),
    [
        ([int_field("mode", 0), int_field("form", 0), int_field("page", 1)], "page"),
        ([int_field("mode", 0), int_field("form", 2)], "form"),
        ([int_field("mode", 0)], "form"),
    ],
)
def test_parse_fields_rejects_unknown_out_of_range_and_missing(collection, word):
    with pytest.raises(ValueError, match=word):
        parse_fields(trt.PluginFieldCollection(collection))


def test_clone_is_a_new_plugin_with_the_same_attributes():
    plugin = KvCacheUpdatePlugin("packed", phase=trt.TensorRTPhase.BUILD)
    twin = plugin.clone()
    assert twin is not plugin
    assert (twin.form, twin.mode, twin.phase, twin.plugin_name) == (
        "packed",
        "linear",
        trt.TensorRTPhase.BUILD,
        PLUGIN_NAME,
    )
    twin.form = "padded"
    assert plugin.form == "packed"


def test_attach_to_context_returns_a_clone():
    plugin = KvCacheUpdatePlugin("packed")
    attached = plugin.attach_to_context(None)
    assert attached is not plugin and attached.form == "packed"


def test_capability_interfaces_are_the_plugin_itself():
    plugin = KvCacheUpdatePlugin()
    for capability in (
        trt.PluginCapabilityType.CORE,
        trt.PluginCapabilityType.BUILD,
        trt.PluginCapabilityType.RUNTIME,
    ):
        assert plugin.get_capability_interface(capability) is plugin


# --- build-time answers --------------------------------------------------------------------------


def test_output_dtype_is_the_cache_dtype():
    assert KvCacheUpdatePlugin().get_output_data_types([BF16, BF16, I64]) == [BF16]


def test_output_shape_is_the_cache_dimension_expressions():
    cache_dims = trt.DimsExprs(4)
    shapes = KvCacheUpdatePlugin().get_output_shapes(
        [cache_dims, trt.DimsExprs(4), trt.DimsExprs(1)], [], None
    )
    assert len(shapes) == 1 and isinstance(shapes[0], trt.DimsExprs) and len(shapes[0]) == 4


def test_output_0_aliases_input_0_when_tensorrt_has_aliased_plugin_io():
    plugin = KvCacheUpdatePlugin()
    assert hasattr(trt, "IPluginV3OneBuildV2") == ALIASED_IO
    if ALIASED_IO:
        assert isinstance(plugin, trt.IPluginV3OneBuildV2)
        assert plugin.get_aliased_input(0) == 0
    else:
        assert plugin.get_aliased_input(0) == -1
    assert plugin.get_aliased_input(1) == -1


def test_enable_aliased_io_sets_the_preview_feature_on_a_real_builder_config():
    builder, _ = create_network()
    config = builder.create_builder_config()
    feature = trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03
    assert config.get_preview_feature(feature) is False
    assert enable_aliased_io(config) is True
    assert config.get_preview_feature(feature) is True


PADDED_OK = [F16, F16, I32, F16]
PACKED_OK = [BF16, BF16, I64, I32, BF16]


@pytest.mark.parametrize(
    ("form", "types", "expected"),
    [
        ("padded", PADDED_OK, [True] * 4),
        ("padded", [F32, F32, I64, F32], [True] * 4),
        ("packed", PACKED_OK, [True] * 5),
        ("padded", [I32, I32, I32, I32], [False, True, True, True]),  # int cache
        ("padded", [BF16, F16, I32, BF16], [True, False, True, True]),  # update dtype differs
        ("padded", [F16, F16, F32, F16], [True, True, False, True]),  # float write_indices
        ("padded", [F16, F16, I32, F32], [True, True, True, False]),  # output dtype differs
        ("packed", [BF16, BF16, I64, F16, BF16], [True, True, True, False, True]),  # lengths
    ],
)
def test_supports_format_combination_per_position(form, types, expected):
    plugin = KvCacheUpdatePlugin(form)
    in_out = [dyn(t) for t in types]
    num_inputs = len(types) - 1
    assert [
        plugin.supports_format_combination(p, in_out, num_inputs) for p in range(len(types))
    ] == (expected)


def test_supports_only_linear_format():
    in_out = [dyn(F16), dyn(F16, trt.TensorFormat.HWC8), dyn(I32), dyn(F16)]
    assert KvCacheUpdatePlugin().supports_format_combination(1, in_out, 3) is False


@pytest.mark.parametrize(("form", "num_inputs"), [("padded", 4), ("packed", 3)])
def test_rejects_an_input_count_that_does_not_match_the_form(form, num_inputs):
    in_out = [dyn(F16), dyn(F16), dyn(I32), dyn(I32), dyn(F16)][: num_inputs + 1]
    plugin = KvCacheUpdatePlugin(form)
    assert not any(plugin.supports_format_combination(p, in_out, num_inputs) for p in range(3))


# --- runtime: launch plan from real descriptors, and what fails without a GPU -------------------


def test_enqueue_plan_comes_from_the_runtime_descriptors():
    descs = [desc(BF16, (2, 4, 16, 8)), desc(BF16, (5, 4, 8)), desc(I64, (2,)), desc(I32, (3,))]
    plan = plan_from_descs("packed", descs)
    assert plan.name == "trt_kv_cache_update_packed_bf16_i64_i32"
    assert plan.sizes == (2, 4, 16, 8, 5)
    assert plan.cache_bytes == 2 * 4 * 16 * 8 * dtypes.to_numpy("bfloat16").itemsize


@pytest.mark.skipif(launch.gpu_count() > 0, reason="a CUDA device is present")
def test_enqueue_without_a_gpu_raises_gpu_unavailable():
    descs = [desc(F16, (1, 1, 4, 2)), desc(F16, (1, 1, 1, 2)), desc(I32, (1,))]
    with pytest.raises(GpuUnavailableError, match="cuInit"):
        KvCacheUpdatePlugin().enqueue(descs, descs[:1], [4096, 8192, 12288], [4096], 0, 0)


# --- networks ------------------------------------------------------------------------------------


def test_a_non_plugin_layer_is_not_a_plugin_cache_update_even_with_the_name():
    network, cache, _, _ = padded_network()
    layer = network.add_identity(cache)
    layer.name = "trt_kv_plugin:cache_k"
    assert is_plugin_cache_update(layer) is False


@pytest.mark.skipif(FEATURES.python_plugins, reason="this TensorRT has add_plugin_v3")
def test_add_plugin_cache_update_names_the_missing_add_plugin_v3():
    network, cache, update, w = padded_network()
    with pytest.raises(NetworkError, match=r"add_plugin_v3.*" + FEATURES.module):
        add_plugin_cache_update(network, cache, update, w)
    assert network.num_layers == 0


@pytest.mark.skipif(FEATURES.python_plugins, reason="this TensorRT has add_plugin_v3")
def test_builder_method_plugin_names_the_missing_add_plugin_v3():
    network, cache, update, w = padded_network()
    with pytest.raises(NetworkError, match="add_plugin_v3"):
        add_kv_cache_update(network, cache, update, w, output_name="cache_k_out", method="plugin")
    assert network.num_outputs == 0


@pytest.mark.skipif(not FEATURES.python_plugins, reason=f"{FEATURES.module} has no add_plugin_v3")
@pytest.mark.gpu  # full TensorRT needs a GPU to create a builder
def test_add_plugin_cache_update_adds_a_recognisable_plugin_layer():
    network, cache, update, w = padded_network()
    out = add_plugin_cache_update(network, cache, update, w)
    layer = network.get_layer(network.num_layers - 1)
    assert is_plugin_cache_update(layer)
    assert layer.name == "trt_kv_plugin:cache_k" and layer.num_inputs == 3
    assert tuple(out.shape) == tuple(cache.shape) and out.dtype == cache.dtype
