"""Layer handlers: one function per TensorRT layer type, looked up by ``LayerType``.

A handler runs once per layer at compile time. It reads the layer's attributes (after
downcasting it to its concrete class) and returns a :class:`Kernel`, the function that
computes the layer's outputs from its input arrays on every run. Handlers register with
:func:`handles`; the executor never needs to know which layer types exist.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from trt_kv.errors import NetworkError, UnsupportedLayerError

Array = np.ndarray
Inputs = Sequence[Array | None]
KernelFn = Callable[[Inputs], Array | tuple[Array, ...]]
# A step bound to its input arrays: its outputs (as ``fn`` returns them, buffers it holds) and
# ``call()``, which computes them in place from those arrays' current values and returns True,
# or returns False (nothing written) where ``fn`` must run instead (:mod:`.bound`).
Bound = tuple[Array | tuple[Array, ...], Callable[[], bool]]
Binder = Callable[[list], Bound | None]
T = TypeVar("T")


@dataclass(frozen=True)
class Kernel:
    """What runs for one layer on every call.

    ``fn`` takes the layer's inputs in TensorRT's input order (``None`` for an absent
    optional input) and returns its output(s). Float inputs arrive in the compute dtype,
    except those listed in ``raw_inputs``, which arrive exactly as stored (for an in-place
    cache update: the caller's own array). ``aliases`` maps an output index to the input index
    whose array it returns unchanged, which the executor then hands back to the caller as is.
    ``rounded`` says the outputs already hold values of their declared dtype (constants), so
    the executor skips rounding them on every run. ``moves`` says every output element is an
    element of a float input (shuffle, gather, concatenation...): when those inputs are
    declared in the output's dtype, a fast plan skips the rounding, which would change nothing.
    ``linear`` says the layer is ``input0 @ input1^T`` over the last two axes (a matrix
    multiply with ops NONE, TRANSPOSE), which a fast plan may run together with the other
    products of the same input 0 (see :mod:`trt_kv.interpreter.layout`). ``halves``, where
    given, is ``fn`` with its one output rounded to float16 values (round_any's bits) in the
    same call: a fast float32 plan runs it for an output declared float16 instead of ``fn``
    and a rounding of its own (the compiled helper rounds where it computes). ``bind``, where
    given, binds the step to its input arrays (:data:`Binder`; None where it cannot: ``fn``
    runs), for a decode step bound once (:mod:`~trt_kv.interpreter.bound`).
    """

    fn: KernelFn
    raw_inputs: frozenset[int] = field(default_factory=frozenset)
    aliases: dict[int, int] = field(default_factory=dict)
    rounded: bool = False
    moves: bool = False
    linear: bool = False
    halves: KernelFn | None = None
    bind: Binder | None = None


@dataclass(frozen=True)
class Context:
    """Compile-time facts a handler may need besides the layer itself."""

    compute: np.dtype  # float32 or float64: the dtype floats are computed in
    layer_name: str
    layer_type: str
    fast: bool = True  # False: the plain kernels, the yardstick of the fast paths
    onnx_node: str | None = None  # the ONNX node TensorRT's ONNX parser made the layer for

    @property
    def label(self) -> str:
        """``'name' (TYPE)``, with ``, ONNX node '...'`` for a layer of a parsed ONNX graph."""
        node = "" if self.onnx_node is None else f", ONNX node {self.onnx_node!r}"
        return f"{self.layer_name!r} ({self.layer_type}{node})"

    def unsupported(self, setting: str) -> UnsupportedLayerError:
        """The error for a layer setting the interpreter does not execute."""
        return UnsupportedLayerError(f"layer {self.label}: unsupported setting: {setting}")

    def pick(self, table: Mapping[object, T], key: object, what: str) -> T:
        """``table[key]``, or the unsupported-setting error naming ``what`` and ``key``."""
        if key not in table:
            raise self.unsupported(f"{what} {key}")
        return table[key]


Handler = Callable[[object, Context], Kernel | KernelFn]

_HANDLERS: dict[object, tuple[type | None, Handler]] = {}


def handles(layer_type: object, layer_class: type | None) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``layer_type``.

    ``layer_class`` is the ``trt.I*Layer`` class the layer is downcast to before the handler
    sees it (Polygraphy's trick: ``network.get_layer`` returns a base ``ILayer``).
    """

    def register(fn: Handler) -> Handler:
        _HANDLERS[layer_type] = (layer_class, fn)
        return fn

    return register


def handles_optional(
    feature: str, layer_type: str, layer_class: str
) -> Callable[[Handler], Handler]:
    """:func:`handles` for a layer only some TensorRT versions have: ``trt.LayerType.<layer_type>``
    and ``trt.<layer_class>`` are read only when ``FEATURES.<feature>`` says the installed
    module has them; otherwise nothing is registered (no network of that module can hold the
    layer)."""
    from trt_kv import _trt

    if not getattr(_trt.FEATURES, feature):
        return lambda fn: fn
    return handles(getattr(_trt.trt.LayerType, layer_type), getattr(_trt.trt, layer_class))


_ONNX_PREFIX, _ONNX_SUFFIX = "[ONNX Layer: ", "]"


def onnx_node(layer: object) -> str | None:
    """The ONNX node a layer was parsed from: TensorRT's ONNX parser writes
    ``[ONNX Layer: <node name>]`` into the layer's ``metadata`` (an unnamed node is named
    ``node_of_<first output>``). None for a layer without it (built by hand, or a helper
    layer the parser added: its name starts with ``ONNXTRT_`` or reads ``(Unnamed Layer*``)."""
    meta = getattr(layer, "metadata", "") or ""
    if meta.startswith(_ONNX_PREFIX) and meta.endswith(_ONNX_SUFFIX):
        return meta[len(_ONNX_PREFIX) : -len(_ONNX_SUFFIX)]
    return None


def type_name(layer: object) -> str:
    """``"SHUFFLE"`` for a shuffle layer: the ``LayerType`` member name."""
    return str(layer.type).rsplit(".", 1)[-1]


def compile_layer(layer: object, compute: np.dtype, fast: bool = True) -> Kernel:
    """Downcast ``layer``, run its handler and return its kernel (``fast``: see
    :class:`Context`).

    Raises:
        UnsupportedLayerError: no handler for the layer type, or a setting the handler refuses.
        NetworkError: TensorRT itself cannot infer the layer's output (an invalid network).
    """
    ctx = Context(np.dtype(compute), layer.name, type_name(layer), fast, onnx_node(layer))
    entry = _HANDLERS.get(layer.type)
    if entry is None:
        raise UnsupportedLayerError(
            f"layer {ctx.label}: layer type not supported by the interpreter"
        )
    layer_class, fn = entry
    if layer_class is not None:
        layer.__class__ = layer_class
    try:
        kernel = fn(layer, ctx)
    except UnsupportedLayerError:  # a NotImplementedError, hence a RuntimeError too
        raise
    except RuntimeError as err:  # e.g. "Could not get tensor shape": TensorRT rejects the layer
        raise NetworkError(
            f"layer {ctx.label}: TensorRT cannot describe it ({err}); see the TensorRT log"
        ) from err
    return kernel if isinstance(kernel, Kernel) else Kernel(kernel)


def axes_of(mask: int, rank: int) -> tuple[int, ...]:
    """Axis indices set in a TensorRT axes bitmask (bit i is axis i)."""
    return tuple(i for i in range(rank) if mask >> i & 1)


def rank_of(tensor: object) -> int:
    """Rank of a TensorRT tensor as declared in the network."""
    return len(tuple(tensor.shape))


def is_float(dtype: np.dtype) -> bool:
    """True for float32/float16/bfloat16 (and float64), the dtypes computed in float."""
    return np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16"


def arg(x: Inputs, index: int) -> Array | None:
    """Input ``index`` of a kernel call, or None when absent (optional inputs may be missing)."""
    return x[index] if index < len(x) else None


def input_or_none(layer: object, index: int) -> object | None:
    """``layer.get_input(index)``, or None when the layer has fewer inputs or it is unset."""
    return layer.get_input(index) if index < layer.num_inputs else None
