"""The one place that imports TensorRT.

``import tensorrt`` (TensorRT >= 10.15 has the native KV-cache update layer) or else
``tensorrt_rtx`` (TensorRT-RTX, which installs from PyPI and builds engines on the CPU).
Set ``TRT_KV_TRT_MODULE=tensorrt`` or ``=tensorrt_rtx`` to force one. The rest of trt_kv
branches on :data:`FEATURES`, never on version strings, and Polygraphy is pointed at the same
module through ``POLYGRAPHY_USE_TENSORRT_RTX`` before it is first imported.
"""

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import NamedTuple

from trt_kv.errors import TrtKvError

ENV_VAR = "TRT_KV_TRT_MODULE"
_CANDIDATES = ("tensorrt", "tensorrt_rtx")


class Features(NamedTuple):
    """What the imported TensorRT module can do (a NamedTuple: no dataclasses import, which
    would cost ``trt-kv --help`` ~10 ms; and this module has no ``from __future__ import
    annotations``, under which NamedTuple compiles each field's string annotation, ~0.3 ms)."""

    module: str
    version: str
    kv_cache_update_layer: bool
    packed_update_form: bool
    attention_v2: bool
    attention: bool  # add_attention (TensorRT >= 10.14): causal flag and mask, no lengths
    # trt.CausalMaskKind and IAttention.causal_kind (TensorRT 11, TensorRT-RTX); TensorRT
    # 10.14/10.15 have only the boolean IAttention.causal.
    causal_mask_kind: bool
    # trt.AttentionIOForm and IAttention.query_form / key_value_form (TensorRT 11, RTX).
    attention_io_forms: bool
    attention_kv_lengths: bool  # IAttention.key_value_lengths (TensorRT 11, TensorRT-RTX)
    rotary_embedding: bool
    aliased_tensor_query: bool
    python_plugins: bool
    squeeze_layers: bool  # add_squeeze / add_unsqueeze (not in every TensorRT 10.x)
    # ITensor.set_dimension_name: inputs' dimensions named alike are equal at run time, which
    # lets the builder share one compiled kernel across layers (see the Llama network).
    dimension_names: bool
    # Whether the layer takes int64 write indices as documented. TensorRT-RTX 1.7.1's
    # compiler rejects them ("Write indices must be of type int32"); trt_kv then casts.
    int64_write_indices: bool

    @property
    def is_rtx(self) -> bool:
        return self.module == "tensorrt_rtx"


def _reraise_interrupt(err: ImportError) -> None:
    """Raise KeyboardInterrupt where Ctrl-C interrupted a module's initialization: pybind11
    reports any exception of a module's init, KeyboardInterrupt too, as ``ImportError:
    initialization failed`` raised from it, which would read as a broken install."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, KeyboardInterrupt):
            raise KeyboardInterrupt from err
        cause = cause.__cause__ or cause.__context__


def _import() -> ModuleType:
    forced = os.environ.get(ENV_VAR)
    if forced:
        if forced not in _CANDIDATES:
            raise TrtKvError(f"{ENV_VAR}: expected one of {_CANDIDATES}, got {forced!r}")
        try:
            return importlib.import_module(forced)
        except ImportError as err:
            _reraise_interrupt(err)
            raise TrtKvError(
                f"{ENV_VAR}: expected an installed module, got {forced!r} ({err})"
            ) from err
    broken: list[str] = []  # installed modules that did not load: a missing library, memory, ...
    for name in _CANDIDATES:
        try:
            return importlib.import_module(name)
        except ImportError as err:
            _reraise_interrupt(err)
            if importlib.util.find_spec(name) is not None:
                broken.append(f"{name!r} is installed but did not load ({err})")
    if broken:
        raise TrtKvError(f"TensorRT: expected a module that loads, got {'; '.join(broken)}")
    raise TrtKvError(
        "no TensorRT module found: expected 'tensorrt' (>= 10.15) or 'tensorrt_rtx' "
        "(pip install tensorrt-rtx)"
    )


def _features(mod: ModuleType) -> Features:
    net_cls = mod.INetworkDefinition
    kv_layer = getattr(mod, "IKVCacheUpdateLayer", None)
    attention = getattr(mod, "IAttention", None)
    return Features(
        module=mod.__name__,
        version=mod.__version__,
        kv_cache_update_layer=hasattr(net_cls, "add_kv_cache_update"),
        packed_update_form=kv_layer is not None and hasattr(kv_layer, "update_form"),
        attention_v2=hasattr(net_cls, "add_attention_v2"),
        attention=hasattr(net_cls, "add_attention"),
        causal_mask_kind=hasattr(mod, "CausalMaskKind") and hasattr(attention, "causal_kind"),
        attention_io_forms=hasattr(mod, "AttentionIOForm") and hasattr(attention, "query_form"),
        attention_kv_lengths=hasattr(attention, "key_value_lengths"),
        rotary_embedding=hasattr(net_cls, "add_rotary_embedding"),
        aliased_tensor_query=hasattr(mod.ICudaEngine, "get_aliased_input_tensor"),
        python_plugins=hasattr(net_cls, "add_plugin_v3"),
        squeeze_layers=hasattr(net_cls, "add_squeeze"),
        dimension_names=hasattr(mod.ITensor, "set_dimension_name"),
        int64_write_indices=mod.__name__ != "tensorrt_rtx",
    )


def _first_installed() -> str | None:
    """The module :func:`_import` will try first, found without importing anything."""
    forced = os.environ.get(ENV_VAR)
    if forced:
        return forced
    return next((n for n in _CANDIDATES if importlib.util.find_spec(n) is not None), None)


POLYGRAPHY_SWITCH = "POLYGRAPHY_USE_TENSORRT_RTX"


def _point_polygraphy(module: str) -> None:
    """Set Polygraphy's TensorRT switch to ``module``, in both directions (a user's stale
    ``POLYGRAPHY_USE_TENSORRT_RTX=1`` next to full TensorRT would make ``TrtRunner`` load the
    wrong module); a Polygraphy imported already is switched too."""
    rtx = module == "tensorrt_rtx"
    os.environ[POLYGRAPHY_SWITCH] = "1" if rtx else "0"
    config = sys.modules.get("polygraphy.config")
    if config is not None:
        config.USE_TENSORRT_RTX = rtx


# Polygraphy reads its switch once, when first imported: point it at our module now, cheaply
# (and again at the module really imported, on first use).
_FIRST = _first_installed()
if _FIRST in _CANDIDATES:
    _point_polygraphy(_FIRST)

trt: ModuleType
FEATURES: Features


def __getattr__(name: str) -> object:
    """``trt`` and ``FEATURES`` are imported on first use (PEP 562), so ``import trt_kv``
    and ``trt-kv --help`` do not pay for TensorRT. Raises TrtKvError without a module."""
    if name not in ("trt", "FEATURES"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    global trt, FEATURES
    trt = _import()
    FEATURES = _features(trt)
    _point_polygraphy(trt.__name__)
    return globals()[name]


_LOGGER = None


def logger() -> object:
    """The process-wide TensorRT logger: warnings and errors as ``[TRT] [W|E] message`` lines
    on stderr (``trt.Logger`` prints to stdout, where ``--json`` output goes). It counts the
    errors (``error_count``) and keeps the newest (``last_error``) for trt_kv's messages."""
    global _LOGGER
    if _LOGGER is None:
        mod = __getattr__("trt")
        severity = mod.ILogger.Severity
        tags = {severity.INTERNAL_ERROR: "F", severity.ERROR: "E", severity.WARNING: "W"}

        class StderrLogger(mod.ILogger):
            def __init__(self) -> None:
                mod.ILogger.__init__(self)
                self.error_count = 0
                self.last_error: str | None = None

            def log(self, level: object, msg: str) -> None:
                tag = tags.get(level)
                if tag is None:  # info and verbose: not shown
                    return
                if tag != "W":
                    self.error_count += 1
                    self.last_error = msg
                print(f"[TRT] [{tag}] {msg}", file=sys.stderr, flush=True)

        _LOGGER = StderrLogger()
    return _LOGGER
