"""The emulated ``EngineInspector``: what TensorRT documents for ``create_engine_inspector()``
(detail by profiling verbosity, layer index range, the execution context), on engines built by
the real TensorRT-RTX builder under the emulator."""

import json

import pytest

from tests.support.trt_log import Log
from trt_kv._trt import trt
from trt_kv.builder import build_engine, create_network
from trt_kv.builder.doc_example import doc_example_network
from trt_kv.emulator import emulated_gpu
from trt_kv.emulator.tensorrt_inspector import UNKNOWN

JSON = trt.LayerInformationFormat.JSON
ONELINE = trt.LayerInformationFormat.ONELINE


def negate_engine(log, verbosity):
    """``y = -x``, x ``[-1, 3]`` float32 (profile 1..4 rows), its one layer named "negate"."""
    builder, network = create_network()
    x = network.add_input("x", trt.float32, (-1, 3))
    layer = network.add_unary(x, trt.UnaryOperation.NEG)
    layer.name = "negate"
    layer.get_output(0).name = "y"
    network.mark_output(layer.get_output(0))
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 3), (2, 3), (4, 3))
    config.add_optimization_profile(profile)
    if verbosity is not None:
        config.profiling_verbosity = verbosity
    data = builder.build_serialized_network(network, config)
    return trt.Runtime(log).deserialize_cuda_engine(data)


@pytest.fixture
def log():
    with emulated_gpu():
        yield Log()


def test_tensorrt_builds_with_layer_names_only_unless_told():
    # What the emulator assumes for engines it rebuilds from a sidecar (trt_kv sets none).
    builder, _ = create_network()
    verbosity = builder.create_builder_config().profiling_verbosity
    assert verbosity == trt.ProfilingVerbosity.LAYER_NAMES_ONLY


def test_default_verbosity_gives_the_layer_names_only(log):
    builder, network, profiles = doc_example_network()
    names = [network.get_layer(i).name for i in range(network.num_layers)]
    engine = trt.Runtime(log).deserialize_cuda_engine(build_engine(builder, network, profiles).data)
    inspector = engine.create_engine_inspector()
    assert engine.profiling_verbosity == trt.ProfilingVerbosity.LAYER_NAMES_ONLY
    assert names == ["kv_cache_update:cache_out"]  # trt_kv names its cache-update layer
    assert inspector.get_layer_information(0, ONELINE) == "kv_cache_update:cache_out"
    assert json.loads(inspector.get_layer_information(0, JSON)) == "kv_cache_update:cache_out"
    info = json.loads(inspector.get_engine_information(JSON))
    assert info["Layers"] == ["kv_cache_update:cache_out"]
    # the I/O tensors as TensorRT 11 lists them (the doc example: static, float32 cache)
    cache, update, indices, out = info["I/O Tensors"]
    assert cache == {
        "Name": "cache",
        "IOMode": "Input",
        "DataType": "Float",
        "Dimensions": [4, 2, 8, 1],
        "Location": "Device",
        "IsShapeInferenceIO": False,
        "ProfileInfo": [
            {
                "MinShape": [4, 2, 8, 1],
                "OptShape": [4, 2, 8, 1],
                "MaxShape": [4, 2, 8, 1],
                "Format": "Row major linear FP32 format (kLINEAR)",
            }
        ],
    }
    assert (update["Name"], indices["Name"], indices["DataType"]) == (
        "update",
        "write_indices",
        "Int32",
    )
    assert (out["Name"], out["IOMode"], "ProfileInfo" in out) == ("cache_out", "Output", False)
    assert "unfused" in info["Emulated"]
    oneline = inspector.get_engine_information(ONELINE).splitlines()
    io = ["cache", "update", "write_indices", "cache_out"]
    assert oneline == ["Layers:", "kv_cache_update:cache_out", "I/O Tensors:", *io]


@pytest.mark.parametrize("index", [-1, 1, 2**31 - 1])
def test_a_layer_index_outside_the_engine_is_none_and_an_error(log, index):
    inspector = negate_engine(log, None).create_engine_inspector()
    assert inspector.get_layer_information(index, JSON) is None
    assert f"layer index {index} outside [0, 1)" in log.errors[-1]


def test_detailed_gives_type_tensors_and_marks_what_only_a_real_build_knows(log):
    engine = negate_engine(log, trt.ProfilingVerbosity.DETAILED)
    inspector = engine.create_engine_inspector()
    unresolved = {
        "Location": "Device",
        "Dimensions": [-1, 3],
        "Format/Datatype": "N/A due to dynamic shapes",
    }
    assert json.loads(inspector.get_layer_information(0, JSON)) == {
        "Name": "negate",
        "LayerType": "UNARY",  # the network layer's type: a real build names its kernel
        "Inputs": [{"Name": "x", **unresolved}],
        "Outputs": [{"Name": "y", **unresolved}],
        "TacticName": UNKNOWN,
        "StreamId": 0,
        "Metadata": "",
    }
    assert inspector.get_layer_information(0, ONELINE).startswith(
        "Name: negate, LayerType: UNARY, Inputs: [ { Name: x, Location: Device, "
        "Dimensions: [-1,3], Format/Datatype: N/A due to dynamic shapes } ], "
    )


def test_a_context_with_its_input_shapes_resolves_dynamic_dimensions(log):
    engine = negate_engine(log, trt.ProfilingVerbosity.DETAILED)
    inspector = engine.create_engine_inspector()
    context = engine.create_execution_context()
    inspector.execution_context = context
    assert inspector.execution_context is context
    layer = json.loads(inspector.get_layer_information(0, JSON))
    assert layer["Inputs"][0]["Dimensions"] == [-1, 3]  # shapes not set yet
    assert context.set_input_shape("x", (2, 3))
    layer = json.loads(inspector.get_layer_information(0, JSON))
    assert layer["Inputs"][0]["Dimensions"] == [2, 3]
    assert layer["Inputs"][0]["Format/Datatype"] == f"Float, format {UNKNOWN}"
    inspector.execution_context = None  # "Passing nullptr will remove any association"
    assert json.loads(inspector.get_layer_information(0, JSON))["Inputs"][0]["Dimensions"] == [
        -1,
        3,
    ]


def test_a_context_of_another_engine_is_refused(log):
    inspector = negate_engine(log, None).create_engine_inspector()
    other = negate_engine(log, None).create_execution_context()
    inspector.execution_context = other
    assert inspector.execution_context is None
    assert "not of this engine" in log.errors[-1]


def test_verbosity_none_gives_no_layer_information(log):
    inspector = negate_engine(log, trt.ProfilingVerbosity.NONE).create_engine_inspector()
    assert inspector.get_layer_information(0, ONELINE) == ""
    assert json.loads(inspector.get_engine_information(JSON))["Layers"] == []
