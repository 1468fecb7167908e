"""Compile a TensorRT network into a list of NumPy steps once; run it many times.

``plan = compile_network(network)`` downcasts every layer, reads its attributes and converts
constant weights (to the compute dtype) once; ``plan.run(feed)`` then only does arithmetic,
which is what makes a decode loop on the CPU affordable.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from trt_kv import dtypes
from trt_kv._trt import trt
from trt_kv.errors import (
    ArgumentError,
    DTypeError,
    FeedError,
    NetworkError,
    ShapeError,
    UnsupportedLayerError,
    check_bool,
    mismatch,
)
from trt_kv.interpreter import (  # noqa: F401 (register the handlers)
    attention,
    attention_step,
    chains,
    elementwise,
    fused,
    linalg,
    quantize,
    scatter,
    shapes,
    transformer,
)
from trt_kv.interpreter.half import round_any
from trt_kv.interpreter.layout import (
    fold_constants,
    fuse_shared_products,
    keep_float16_weights,
)
from trt_kv.interpreter.program import SlotProgram, Step, identity, with_frees
from trt_kv.interpreter.registry import compile_layer, is_float, onnx_node, type_name

Precision = Literal["float32", "float64"]
_PRECISIONS = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}


@dataclass(frozen=True)
class _Input:
    name: str
    shape: tuple[int, ...]  # -1 for a dynamic dimension
    dtype: np.dtype


def _declared(tensor: object, layer: str, kind: str) -> np.dtype:
    if tensor.dtype == trt.int4:  # held unpacked: one value per int8
        return np.dtype(np.int8)
    try:
        return dtypes.to_numpy(tensor.dtype)
    except (TypeError, KeyError) as err:
        raise UnsupportedLayerError(
            f"layer {layer!r} ({kind}): unsupported tensor dtype {tensor.dtype} for {tensor.name!r}"
        ) from err


def _finisher(
    declared: np.dtype, compute: np.dtype, fast: bool = False
) -> Callable[[np.ndarray], np.ndarray]:
    """Round a layer output to its declared dtype, keep floats in the compute dtype
    (``fast``: float16 rounds through :func:`~trt_kv.interpreter.half.round_any`, the
    same bits as NumPy's casts)."""
    if not is_float(declared):
        return lambda a: np.asarray(a, dtype=declared)
    if declared == compute:
        return lambda a: np.asarray(a, dtype=compute)
    if fast and declared == _FLOAT16 and compute == _FLOAT32:
        return round_any
    # float16/bfloat16 (or float32 under float64 compute): round at the tensor boundary.
    return lambda a: np.asarray(a).astype(declared).astype(compute)


_FLOAT16, _FLOAT32 = np.dtype(np.float16), np.dtype(np.float32)


def _schedule(network: object, outputs: list[str]) -> list[int]:
    """Indices of the layers the outputs depend on, producers before consumers.

    TensorRT lists layers in insertion order, which ``set_input`` can make non-topological,
    so this sorts (ties broken by insertion order) and drops layers no output needs.
    """
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    producer = {}
    for i, layer in enumerate(layers):
        for j in range(layer.num_outputs):
            producer[layer.get_output(j).name] = i
    deps: list[set[int]] = []
    for layer in layers:
        names = (layer.get_input(j) for j in range(layer.num_inputs))
        deps.append({producer[t.name] for t in names if t is not None and t.name in producer})
    needed: set[int] = set()
    stack = [producer[name] for name in outputs if name in producer]
    while stack:
        i = stack.pop()
        if i not in needed:
            needed.add(i)
            stack.extend(deps[i])
    users: dict[int, list[int]] = {i: [] for i in needed}
    waiting = {i: len(deps[i]) for i in needed}
    for i in needed:
        for d in deps[i]:
            users[d].append(i)
    ready = [i for i in needed if waiting[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(needed):
        raise NetworkError("network: expected an acyclic layer graph, got a cycle")
    return order


class Plan:
    """A network compiled for repeated NumPy execution. Build with :func:`compile_network`."""

    def __init__(
        self,
        network: object,
        precision: Precision = "float32",
        fast: bool = True,
        wide_float16_caches: bool = False,
    ) -> None:
        if precision not in _PRECISIONS:
            raise ArgumentError(mismatch("precision", "one of", tuple(_PRECISIONS), precision))
        self.precision = precision
        self.fast = fast
        self.wide_float16_caches = wide_float16_caches
        compute = _PRECISIONS[precision]
        self._inputs = [
            _Input(t.name, tuple(t.shape), _declared(t, t.name, "network input"))
            for t in (network.get_input(i) for i in range(network.num_inputs))
        ]
        outs = [network.get_output(i) for i in range(network.num_outputs)]
        self._outputs = [(t.name, _declared(t, t.name, "network output")) for t in outs]
        self._aliased: set[str] = set()
        self._updated: set[str] = set()  # tensors a layer updates in place (KV caches)
        # Tensors that may hold floats other than the compute dtype: the caller's arrays and
        # arrays passed through as they are. Every other float is in the compute dtype.
        self._as_stored = set(self.input_names)
        self._dtypes: dict[str, np.dtype] = {}  # layer output -> its declared dtype
        steps = [
            self._compile(network.get_layer(i), compute)
            for i in _schedule(network, [name for name, _ in self._outputs])
        ]
        if fast:
            steps = fused.apply(steps, fused.find(network))
            steps = chains.apply(steps, chains.find(network), compute)
            steps = fold_constants(steps, compute, self._dtypes, set(self.output_names))
            keep_float16_weights(steps)
            fuse_shared_products(steps)
            steps = attention_step.apply(steps, attention_step.find(steps, network), compute)
        self._steps = with_frees(steps, {*self.input_names, *self.output_names})
        self._fed = {  # the dtype each input is fed in: declared, or float32 for wide caches
            i.name: _FLOAT32
            if wide_float16_caches and i.name in self._updated and i.dtype == _FLOAT16
            else i.dtype
            for i in self._inputs
        }
        if fast:
            self._slots = SlotProgram(
                self._steps, self.input_names, self.output_names, compute, self._updated
            )
        self._program = (
            []
            if fast
            else [
                (
                    step.kernel.fn,
                    tuple(name for name, _ in step.inputs),
                    tuple(j for j, (_, cast) in enumerate(step.inputs) if cast),
                    step.outputs,
                    step.free,
                )
                for step in self._steps
            ]
        )

    def _compile(self, layer: object, compute: np.dtype) -> Step:
        node = onnx_node(layer)  # a dtype refusal names the ONNX node too, as compile_layer's
        kind = type_name(layer) + ("" if node is None else f", ONNX node {node!r}")
        kernel = compile_layer(layer, compute, self.fast)
        inputs = []
        float_inputs = set()  # declared dtypes of the float inputs
        for j in range(layer.num_inputs):
            t = layer.get_input(j)
            if t is None:
                inputs.append((None, False))
            else:
                declared = _declared(t, layer.name, kind)
                float_inputs |= {declared} if is_float(declared) else set()
                cast = is_float(declared) and j not in kernel.raw_inputs
                inputs.append((t.name, cast and t.name in self._as_stored))
        outputs = []
        for j in range(layer.num_outputs):
            t = layer.get_output(j)
            self._dtypes[t.name] = _declared(t, layer.name, kind)
            if j in kernel.aliases:
                self._aliased.add(t.name)
                self._updated.add(layer.get_input(kernel.aliases[j]).name)
                self._as_stored.add(t.name)
                outputs.append((t.name, identity))
            elif kernel.rounded:
                self._as_stored.add(t.name)
                outputs.append((t.name, identity))
            elif self.fast and kernel.moves and float_inputs == {_declared(t, layer.name, kind)}:
                # elements of inputs rounded to this very dtype: rounding again changes nothing
                outputs.append((t.name, identity))
            else:
                declared = _declared(t, layer.name, kind)
                outputs.append((t.name, _finisher(declared, compute, self.fast)))
        if outputs and outputs[0][1] is round_any and kernel.halves and layer.num_outputs == 1:
            kernel = replace(kernel, fn=kernel.halves)  # rounded in its own call
            outputs = [(outputs[0][0], identity)]
        return Step(layer.name, kernel, tuple(inputs), tuple(outputs))

    @property
    def input_names(self) -> list[str]:
        """Network input names, in network order."""
        return [i.name for i in self._inputs]

    @property
    def output_names(self) -> list[str]:
        """Marked network output names, in network order."""
        return [name for name, _ in self._outputs]

    def _check_feed(self, feed: Mapping[str, np.ndarray]) -> None:
        unknown = sorted(set(feed) - set(self.input_names))
        if unknown:
            raise FeedError(mismatch("feed", "only network inputs", self.input_names, unknown))
        for spec in self._inputs:
            if spec.name not in feed:
                raise FeedError(mismatch(spec.name, "a feed array for network input", "", "none"))
            a, fed = feed[spec.name], self._fed[spec.name]
            if not isinstance(a, np.ndarray):
                raise DTypeError(mismatch(spec.name, "a NumPy array", fed, type(a)))
            if a.dtype != fed:
                what = "dtype" if fed == spec.dtype else "dtype (float16 cache held wide)"
                raise DTypeError(mismatch(spec.name, what, dtypes.name_of(fed), a.dtype.name))
            if a.ndim != len(spec.shape) or any(
                d != -1 and d != s for d, s in zip(spec.shape, a.shape)
            ):
                raise ShapeError(mismatch(spec.name, "shape", spec.shape, a.shape))
            if spec.name in self._updated and not a.flags.writeable:
                raise ArgumentError(mismatch(spec.name, "a writeable array", "", "read-only"))

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute the network on ``feed`` (input name -> array of the declared dtype; with
        ``wide_float16_caches``, a float16 cache the network updates in place is a float32
        array holding float16 values, see :func:`compile_network`).

        Returns:
            Output name -> array in the output's declared dtype. A KV-cache output is the
            caller's fed cache array itself, updated in place.

        Raises:
            FeedError: a network input is missing, or the feed names an unknown tensor.
            DTypeError, ShapeError: a feed array has the wrong dtype, rank or static dim.
            ArgumentError: a cache the network updates in place is read-only (nothing run).
            CacheOverflowError: a cache write would reach past S_max (nothing written).
        """
        self._check_feed(feed)
        values = self._slots.run(feed) if self.fast else self._run_plain(feed)
        return {
            name: values[name] if name in self._aliased else np.array(values[name], dtype=dt)
            for name, dt in self._outputs
        }

    def _run_plain(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every step in turn, tensors looked up by name: the yardstick of the fast plan."""
        values: dict[str, np.ndarray] = dict(feed)
        compute = _PRECISIONS[self.precision]
        for fn, names, casts, outputs, free in self._program:
            args = [None if name is None else values[name] for name in names]
            for j in casts:
                if args[j].dtype != compute:
                    args[j] = args[j].astype(compute)
            result = fn(args)
            del args
            if not isinstance(result, tuple):
                result = (result,)
            for (name, finish), value in zip(outputs, result):
                values[name] = finish(value)
            del result, value
            for name in free:  # peak memory: the live tensors only, not every one
                del values[name]
        return values

    __call__ = run


def compile_network(
    network: object,
    *,
    precision: Precision = "float32",
    fast: bool = True,
    wide_float16_caches: bool = False,
) -> Plan:
    """Compile ``network`` (an ``INetworkDefinition``) for :meth:`Plan.run`.

    Constant weights are read (and converted to the compute dtype) here, once: the arrays
    behind the network's ``trt.Weights`` must still be alive, since TensorRT does not copy
    them. The plan keeps no reference to the network afterwards.

    ``fast=False`` runs the plain kernels: attention over the whole cache window, one matrix
    product per batch entry, constants in their declared layout, tensors looked up by name,
    float16 through NumPy's casts. The default fast plan: attention reads the keys up to the
    last one a query may see; a product with a shared matrix runs on ``[rows, K]`` at once,
    against a weight stored ``nn.Linear``-style ``[N, K]`` through the compiled helper where
    it is built: a few rows (a decode step; Q/K/V and gate/up stacked, one call for all) each
    weight element read once, up to 128 rows (a prefill chunk) as its panel product (without
    it: a dot product per weight row for one row, blocks of weight rows for 2..16 rows;
    :mod:`~trt_kv.interpreter.products`); a float16 weight that only
    products read stays float16 where the compiled helper is built, read as stored up to 16
    rows (:func:`~trt_kv.interpreter.layout.keep_float16_weights`: half the bytes of a
    decode step, half the memory); constants are filled in once, and so are the layers that
    read only constants (a weight dequantized from INT8/INT4 codes: held as its float16
    result, like a float16 weight); float16 rounds and widens on the bits
    (:mod:`trt_kv.interpreter.half`, NumPy's bits exactly) and layers that only move
    elements skip a rounding that changes nothing; KV updates are checked on whole arrays;
    from the second run in a row of one feed signature (a decode loop: the same shapes, the
    same caches) the steps run bound once (:mod:`trt_kv.interpreter.bound`: buffers held
    between runs, at most 16 MiB; the helper's calls with their arguments taken once; the
    same bits). Results agree with the plain plan within the compute dtype's rounding (BLAS
    summation order; the tests run both on the same networks, bit-exact where no BLAS call
    differs); every layer of the network runs either way.

    ``wide_float16_caches``: each float16 cache the network updates in place (a KV-cache
    update's input 0) is fed as a float32 array ``[B, N, S_max, H]`` holding float16 values
    (``HostCaches(wide_float16_caches=True)``), and a float16 array is refused. An update
    is declared in its cache's dtype, so its values are float16 values (rounded where they
    are produced, like every float16 tensor) and the array keeps holding float16 values;
    the plan reads it as it is: a float16 cache would be widened to float32 for every
    product that reads it, per layer and step (the largest cost of a float16 decode step at
    a long context). Results are the same bits as feeding the float16 cache; the cache costs
    twice the memory.

    Raises:
        UnsupportedLayerError: a layer (type or setting) the interpreter does not execute;
            the message names the layer and its type.
        ArgumentError: ``network`` is not a network definition; ``wide_float16_caches`` is
            not a bool.
    """
    if not all(hasattr(network, a) for a in ("num_inputs", "num_layers", "num_outputs")):
        raise ArgumentError(
            mismatch("network", "an INetworkDefinition", "", type(network).__name__)
        )
    return Plan(network, precision, fast, check_bool("wide_float16_caches", wide_float16_caches))


def execute(
    network: object,
    feed: Mapping[str, np.ndarray],
    *,
    precision: Precision = "float32",
    fast: bool = True,
) -> dict[str, np.ndarray]:
    """Compile and run ``network`` once; see :meth:`Plan.run`. Use :func:`compile_network`
    for repeated runs (decode loops)."""
    return compile_network(network, precision=precision, fast=fast).run(feed)
