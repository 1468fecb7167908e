"""Emulated ``EngineInspector`` (``ICudaEngine.create_engine_inspector()``): TensorRT's
per-layer engine information for an emulated engine.

What it follows from TensorRT's documentation (``IEngineInspector`` in ``NvInferRuntime.h``,
the Python ``EngineInspector`` and the "Engine Inspector" guide):

- the detail depends on the ``ProfilingVerbosity`` the engine was built with:
  ``LAYER_NAMES_ONLY`` (TensorRT's default, and what trt_kv builds with) prints layer names
  only, ``DETAILED`` names and parameters, ``NONE`` no layer information (here: ``""`` per
  layer and an empty ``"Layers"`` list; TensorRT documents no exact text for it);
- ``get_layer_information(layer_index, format)``: ``layer_index`` "must lie in range
  [0, engine.getNbLayers())"; outside it the emulator logs an error and returns None (a null
  ``char const*`` as the Python binding hands it back; what TensorRT returns there is not
  documented);
- ``get_engine_information(format)``: every layer, then the I/O tensors, as JSON
  ``{"Layers": [...], "I/O Tensors": [...]}`` (the TensorRT 11 schema, which TensorRT-RTX
  follows; TensorRT 10 had ``"Bindings": [names]``) or ONELINE (one line per entry);
- ``execution_context``: "Setting the execution context and specifying all the input shapes
  allows the inspector to calculate concrete dimensions for any dynamic shapes and display
  their format information. Otherwise, values dependent on input shapes will be displayed as
  -1 and format information will not be shown." Only a context of this engine is accepted;
  ``None`` removes it.

What it cannot know, and how it marks it: an emulated engine runs the network as built,
layer by layer, so its layers are the ``INetworkDefinition``'s (names, layer types, tensors,
dtypes), unfused. A real build fuses layers (``"a + b + c"`` names), inserts reformats, picks
each layer's tactic and tensor formats, and may name the engine's layers differently; none
of that exists here. ``DETAILED`` output therefore gives ``"LayerType"`` as the network
layer's type (``trt.LayerType`` name), ``"TacticName"`` and the format part of
``"Format/Datatype"`` as :data:`UNKNOWN`, and the engine information carries
``"Emulated": NOTE``. Intermediate tensors keep -1 for dynamic dimensions even with a context
(the emulator infers shapes only by running the network); their format shows as TensorRT
shows an unresolved one, ``"N/A due to dynamic shapes"``.
"""

from __future__ import annotations

import json

from trt_kv._trt import trt
from trt_kv.emulator.engines import LayerRecord, LayerTensor
from trt_kv.emulator.tensorrt_log import log_error

UNKNOWN = "unknown (emulated: decided by a real TensorRT build)"
NOTE = (
    "emulated engine: the network's layers, unfused; a real build fuses layers and picks "
    "tactics and formats (marked 'unknown (emulated...)')"
)
DYNAMIC = "N/A due to dynamic shapes"
_DATATYPE = {  # TensorRT's DataType as its inspector names it
    "FLOAT": ("Float", "FP32"),
    "HALF": ("Half", "FP16"),
    "BF16": ("BFloat16", "BF16"),
    "INT8": ("Int8", "INT8"),
    "INT32": ("Int32", "INT32"),
    "INT64": ("Int64", "INT64"),
    "BOOL": ("Bool", "BOOL"),
    "UINT8": ("UInt8", "UINT8"),
    "FP8": ("FP8", "FP8"),
}


def _type_name(dtype: str) -> str:
    return _DATATYPE.get(dtype, (dtype, dtype))[0]


def _oneline(value: object) -> str:
    """A JSON value on one line, unquoted: ``[ { Name: x, Dimensions: [2,3] } ]``."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k}: {_oneline(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        if all(isinstance(v, int) for v in value):
            return "[" + ",".join(map(str, value)) + "]"
        return "[ " + ", ".join(_oneline(v) for v in value) + " ]"
    return str(value)


class EngineInspector:
    """Stand-in for ``trt.EngineInspector`` of an emulated ``ICudaEngine``."""

    def __init__(self, engine: object, layers: tuple[LayerRecord, ...], logger: object) -> None:
        self._engine = engine
        self._layers = layers
        self._logger = logger
        self._context = None
        self._recorder = None

    # -- properties of the binding ----------------------------------------------------------
    @property
    def execution_context(self) -> object:
        return self._context

    @execution_context.setter
    def execution_context(self, context: object) -> None:
        # setExecutionContext returns whether it succeeded; the Python property drops the
        # bool: a refused context leaves the previous one and an error on the logger.
        if context is not None and getattr(context, "engine", None) is not self._engine:
            log_error(self._logger, "EngineInspector: the context is not of this engine")
            return
        self._context = context

    @property
    def error_recorder(self) -> object:
        return self._recorder

    @error_recorder.setter
    def error_recorder(self, recorder: object) -> None:
        self._recorder = recorder

    # -- information ------------------------------------------------------------------------
    def get_layer_information(self, layer_index: int, format: object) -> str | None:
        """Layer ``layer_index`` as ``format`` (``LayerInformationFormat``) says; None and an
        error on the logger outside ``[0, engine.num_layers)``."""
        if not 0 <= layer_index < len(self._layers):
            log_error(
                self._logger,
                f"getLayerInformation: layer index {layer_index} outside [0, {len(self._layers)})",
            )
            return None
        entry = self._entry(self._layers[layer_index])
        return self._format_one(entry, format)

    def get_engine_information(self, format: object) -> str:
        """Every layer, then the I/O tensors, as ``format`` says."""
        entries = [self._entry(layer) for layer in self._layers]
        if self._verbosity() == trt.ProfilingVerbosity.NONE:
            entries = []
        io = self._io_tensors()
        if format == trt.LayerInformationFormat.JSON:
            return json.dumps({"Layers": entries, "I/O Tensors": io, "Emulated": NOTE})
        lines = ["Layers:", *(self._format_one(e, format) for e in entries), "I/O Tensors:"]
        lines += [t["Name"] for t in io]
        return "\n".join(lines) + "\n"

    # -- helpers ------------------------------------------------------------------------------
    def _verbosity(self) -> object:
        return self._engine.profiling_verbosity

    def _format_one(self, entry: object, format: object) -> str:
        if format == trt.LayerInformationFormat.JSON:
            return json.dumps(entry)
        if isinstance(entry, str):
            return entry
        return ", ".join(f"{k}: {_oneline(v)}" for k, v in entry.items())

    def _entry(self, layer: LayerRecord) -> object:
        """A name (LAYER_NAMES_ONLY), "" (NONE) or the detailed dict (DETAILED)."""
        verbosity = self._verbosity()
        if verbosity == trt.ProfilingVerbosity.NONE:
            return ""
        if verbosity != trt.ProfilingVerbosity.DETAILED:
            return layer.name
        return {
            "Name": layer.name,
            "LayerType": layer.kind,
            "Inputs": [self._tensor(t) for t in layer.inputs],
            "Outputs": [self._tensor(t) for t in layer.outputs],
            "TacticName": UNKNOWN,
            "StreamId": 0,
            "Metadata": "",
        }

    def _resolved(self, t: LayerTensor) -> tuple[int, ...]:
        """``t``'s dimensions: concrete for an engine I/O tensor when the context has every
        input shape (outputs: as the context last computed them), else as declared."""
        context = self._context
        if context is None or -1 not in t.shape or not context.all_binding_shapes_specified:
            return t.shape
        if self._engine.get_tensor_mode(t.name) == trt.TensorIOMode.NONE:
            return t.shape
        return tuple(context.get_tensor_shape(t.name))

    def _tensor(self, t: LayerTensor) -> dict:
        dims = self._resolved(t)
        known = f"{_type_name(t.dtype)}, format {UNKNOWN}"
        return {
            "Name": t.name,
            "Location": "Device",
            "Dimensions": list(dims),
            "Format/Datatype": DYNAMIC if -1 in dims else known,
        }

    def _io_tensors(self) -> list[dict]:
        """The engine's I/O tensors as TensorRT 11's ``"I/O Tensors"`` (formats: LINEAR, the
        only one the emulated engine reports)."""
        engine = self._engine
        out = []
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            dtype = engine.get_tensor_dtype(name).name
            linear = f"Row major linear {_DATATYPE.get(dtype, (dtype, dtype))[1]} format (kLINEAR)"
            entry = {
                "Name": name,
                "IOMode": "Input" if is_input else "Output",
                "DataType": _type_name(dtype),
                "Dimensions": list(engine.get_tensor_shape(name)),
                "Location": "Device",
                "IsShapeInferenceIO": False,
            }
            if is_input:
                entry["ProfileInfo"] = [
                    dict(
                        zip(
                            ("MinShape", "OptShape", "MaxShape"),
                            (list(s) for s in engine.get_tensor_profile_shape(name, p)),
                        ),
                        Format=linear,
                    )
                    for p in range(engine.num_optimization_profiles)
                ]
            out.append(entry)
        return out
