"""The Python ``IPluginV3`` behind ``method="plugin"``, its creator and registration.

Inputs ``(cache [B, N, S_max, H], update [B, N, S, H] | [T, N, H], write_indices [B]
[, update_lengths [B + 1]])``; output 0 is the updated cache, same shape and dtype as input 0.
With ``IPluginV3OneBuildV2`` (TensorRT >= 10.3) output 0 is declared aliased to input 0, so
TensorRT hands ``enqueue`` one buffer and the kernel writes only the new rows; the builder
config must then enable ``PreviewFeature.ALIASED_PLUGIN_IO_10_03`` (:func:`enable_aliased_io`).
Without it, ``enqueue`` copies the cache to the output first (copy semantics; same result).
"""

from __future__ import annotations

import numpy as np

from trt_kv import dtypes
from trt_kv._trt import trt
from trt_kv.errors import NetworkError, mismatch
from trt_kv.plugin import launch
from trt_kv.plugin.kernels import FORMS, KernelLaunch, plan_launch

PLUGIN_NAME = "TrtKvCacheUpdate"
PLUGIN_NAMESPACE = "trt_kv"
PLUGIN_VERSION = "1"
MODES = ("linear",)
FIELDS = ("mode", "form")
NUM_INPUTS = {"padded": 3, "packed": 4}
CACHE_TYPES = (trt.float32, trt.float16, trt.bfloat16)
INDEX_TYPES = (trt.int32, trt.int64)

ALIASED_IO = hasattr(trt, "IPluginV3OneBuildV2") and hasattr(
    trt.PreviewFeature, "ALIASED_PLUGIN_IO_10_03"
)
_BUILD_BASE = trt.IPluginV3OneBuildV2 if ALIASED_IO else trt.IPluginV3OneBuild


def enable_aliased_io(config: object) -> bool:
    """Turn on ``ALIASED_PLUGIN_IO_10_03`` in a ``trt.IBuilderConfig``; False when absent."""
    if not ALIASED_IO:
        return False
    config.set_preview_feature(trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03, True)
    return True


def plan_from_descs(form: str, input_desc: list) -> KernelLaunch:
    """The kernel launch for the runtime ``trt.PluginTensorDesc`` list of one ``enqueue``."""
    lengths = dtypes.name_of(input_desc[3].type) if form == "packed" else None
    return plan_launch(
        tuple(input_desc[0].dims),
        tuple(input_desc[1].dims),
        dtypes.name_of(input_desc[0].type),
        dtypes.name_of(input_desc[2].type),
        lengths,
    )


class KvCacheUpdatePlugin(
    trt.IPluginV3, trt.IPluginV3OneCore, _BUILD_BASE, trt.IPluginV3OneRuntime
):
    """LINEAR KV-cache update; ``form`` is "padded" or "packed" (which fixes the input count)."""

    def __init__(self, form: str = "padded", mode: str = "linear", phase: object = None) -> None:
        if form not in FORMS:
            raise ValueError(mismatch("form", "one of", FORMS, form))
        if mode not in MODES:
            raise ValueError(mismatch("mode", "one of", MODES, mode))
        trt.IPluginV3.__init__(self)
        trt.IPluginV3OneCore.__init__(self)
        _BUILD_BASE.__init__(self)
        trt.IPluginV3OneRuntime.__init__(self)
        self.plugin_name = PLUGIN_NAME
        self.plugin_namespace = PLUGIN_NAMESPACE
        self.plugin_version = PLUGIN_VERSION
        self.num_outputs = 1
        self.form = form
        self.mode = mode
        self.phase = phase

    # IPluginV3
    def get_capability_interface(self, capability: object) -> object:
        return self

    def clone(self) -> KvCacheUpdatePlugin:
        return KvCacheUpdatePlugin(self.form, self.mode, self.phase)

    # IPluginV3OneBuild(V2)
    def get_aliased_input(self, output_index: int) -> int:
        """Input index that output ``output_index`` aliases: 0 (the cache) for output 0."""
        return 0 if output_index == 0 and ALIASED_IO else -1

    def get_output_data_types(self, input_types: list) -> list:
        return [input_types[0]]

    def get_output_shapes(self, inputs: list, shape_inputs: list, expr_builder: object) -> list:
        """Output 0 is ``[B, N, S_max, H]``, the cache's own dimension expressions."""
        return [trt.DimsExprs(inputs[0])]

    def supports_format_combination(self, pos: int, in_out: list, num_inputs: int) -> bool:
        """LINEAR everywhere; cache float32/float16/bfloat16; update and output the cache's
        dtype; write_indices and update_lengths int32/int64."""
        if num_inputs != NUM_INPUTS[self.form]:
            return False
        desc = in_out[pos].desc
        if desc.format != trt.TensorFormat.LINEAR:
            return False
        if pos == 0:
            return desc.type in CACHE_TYPES
        if pos in (1, num_inputs):
            return desc.type == in_out[0].desc.type
        return desc.type in INDEX_TYPES

    def configure_plugin(self, inputs: list, outputs: list) -> None:
        pass

    def get_workspace_size(self, inputs: list, outputs: list) -> int:
        return 0

    def get_valid_tactics(self) -> list:
        return []

    # IPluginV3OneRuntime
    def set_tactic(self, tactic: int) -> None:
        pass

    def on_shape_change(self, inputs: list, outputs: list) -> None:
        pass

    def attach_to_context(self, context: object) -> KvCacheUpdatePlugin:
        return self.clone()

    def get_fields_to_serialize(self) -> object:
        return fields(self.form, self.mode)

    def enqueue(
        self,
        input_desc: list,
        output_desc: list,
        inputs: list,
        outputs: list,
        workspace: int,
        stream: int,
    ) -> None:
        """Copy the cache to output 0 unless aliased (same pointer), then scatter the update."""
        plan = plan_from_descs(self.form, input_desc)
        launch.copy_cache(outputs[0], inputs[0], plan.cache_bytes, stream)
        launch.launch(plan, [outputs[0], *inputs[1:]], stream)


def fields(form: str, mode: str = "linear") -> object:
    """The ``trt.PluginFieldCollection`` that recreates a plugin: ``mode`` and ``form`` as
    int32 indices into :data:`MODES` and :data:`~trt_kv.plugin.kernels.FORMS`."""
    return trt.PluginFieldCollection(
        [
            trt.PluginField(
                "mode", np.array([MODES.index(mode)], np.int32), trt.PluginFieldType.INT32
            ),
            trt.PluginField(
                "form", np.array([FORMS.index(form)], np.int32), trt.PluginFieldType.INT32
            ),
        ]
    )


def parse_fields(collection: object) -> dict[str, str]:
    """``{"mode": ..., "form": ...}`` from a field collection; raises ValueError when a field
    is unknown, missing or out of range."""
    choices = {"mode": MODES, "form": FORMS}
    found = {}
    for field in collection:
        if field.name not in choices:
            raise ValueError(mismatch(f"plugin field {field.name!r}", "one of", FIELDS, field.name))
        index = int(np.asarray(field.data).reshape(-1)[0])
        if not 0 <= index < len(choices[field.name]):
            raise ValueError(
                mismatch(
                    f"plugin field {field.name!r}", "an index into", choices[field.name], index
                )
            )
        found[field.name] = choices[field.name][index]
    missing = [name for name in FIELDS if name not in found]
    if missing:
        raise ValueError(mismatch("plugin fields", "all of", FIELDS, sorted(found)))
    return found


class KvCacheUpdatePluginCreator(trt.IPluginCreatorV3One):
    """Creates :class:`KvCacheUpdatePlugin` from fields (network build and engine load)."""

    def __init__(self) -> None:
        trt.IPluginCreatorV3One.__init__(self)
        self.name = PLUGIN_NAME
        self.plugin_namespace = PLUGIN_NAMESPACE
        self.plugin_version = PLUGIN_VERSION
        self.field_names = trt.PluginFieldCollection(
            [
                trt.PluginField(name, np.array([], np.int32), trt.PluginFieldType.INT32)
                for name in FIELDS
            ]
        )

    def create_plugin(self, name: str, collection: object, phase: object) -> KvCacheUpdatePlugin:
        return KvCacheUpdatePlugin(**parse_fields(collection), phase=phase)


_KEEP_ALIVE: list[KvCacheUpdatePluginCreator] = []


def register_creator() -> object:
    """Register the creator with ``trt.get_plugin_registry()`` once; returns the registered
    creator. Call before building a plugin network and before deserializing its engine.

    Raises:
        NetworkError: the registry refused the creator.
    """
    registry = trt.get_plugin_registry()
    existing = registry.get_creator(PLUGIN_NAME, PLUGIN_VERSION, PLUGIN_NAMESPACE)
    if existing is not None:
        return existing
    creator = KvCacheUpdatePluginCreator()
    if not registry.register_creator(creator, PLUGIN_NAMESPACE):
        raise NetworkError(
            mismatch(
                "plugin registry",
                f"to register {PLUGIN_NAMESPACE}::{PLUGIN_NAME} v{PLUGIN_VERSION}",
                True,
                False,
            )
        )
    _KEEP_ALIVE.append(creator)
    return creator


def create_plugin(form: str) -> KvCacheUpdatePlugin:
    """A build-phase plugin made by the registered creator from serialized fields."""
    creator = register_creator()
    return creator.create_plugin(PLUGIN_NAME, fields(form), trt.TensorRTPhase.BUILD)
