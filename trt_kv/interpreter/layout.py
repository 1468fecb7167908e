"""A fast plan's layout of its constant matrices: float16 weights kept as stored, and
products of one input against several matrices run as one.

:func:`keep_float16_weights` and :func:`fuse_shared_products` rewrite the compiled steps of
:class:`~trt_kv.interpreter.executor.Plan` (:class:`~trt_kv.interpreter.program.Step`
records: ``kernel``, ``inputs``, ``outputs``) in place. The values every layer computes
stay the same; only which memory the products read, and how many calls they take, change.
Every other constant keeps the layout the network gives it: a weight stored
``nn.Linear``-style (``[N, K]``, read transposed) is the layout
:func:`~trt_kv.interpreter.linalg.matrix_multiply` runs fastest for one row and for a few
(a decode step's batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from trt_kv.interpreter import half, products
from trt_kv.interpreter.program import identity

_F16, _F32 = np.dtype(np.float16), np.dtype(np.float32)


def _constants(steps: list) -> dict[str, int]:
    """Constant tensor name -> index of the step that holds it (run once, at compile time)."""
    return {
        step.outputs[0][0]: i
        for i, step in enumerate(steps)
        if step.kernel.rounded and not step.inputs and len(step.outputs) == 1
    }


def _with_value(step: object, value: np.ndarray) -> object:
    return replace(step, kernel=replace(step.kernel, fn=lambda x, v=value: v))


def fold_constants(
    steps: list, compute: np.dtype, declared: dict[str, np.dtype], kept: set[str]
) -> list:
    """``steps`` with every step whose inputs are all constants (a weight dequantized from
    its INT8/INT4 codes, say) run once, here, and held as a constant of its result, rounded
    to its ``declared`` dtype as on every run (float16 results stay float16, for
    :func:`keep_float16_weights` to place); constants that only such steps read are dropped
    (but not the tensors in ``kept``: network outputs)."""
    values = {name: steps[i].kernel.fn(()) for name, i in _constants(steps).items()}
    out = []
    for step in steps:
        names = [name for name, _ in step.inputs]
        k = step.kernel
        if not names or k.aliases or k.raw_inputs or not all(n in values for n in names):
            out.append(step)
            continue
        args = [values[n].astype(compute) if values[n].dtype == _F16 else values[n] for n in names]
        result = k.fn(args)
        result = result if isinstance(result, tuple) else (result,)
        done = []
        for (name, finish), value in zip(step.outputs, result):
            value = finish(value)
            if declared[name] == _F16 and compute == _F32:
                value = value.astype(_F16)
            # ascontiguousarray makes a 0-d value 1-d: keep the shape (an ONNX scalar)
            values[name] = _read_only(np.ascontiguousarray(value).reshape(np.shape(value)))
            kernel = replace(k, fn=lambda x, v=values[name]: v, rounded=True)
            done.append(replace(step, kernel=kernel, inputs=(), outputs=((name, identity),)))
        out.extend(done)
    read = {name for step in out for name, _ in step.inputs} | kept
    return [s for s in out if s.inputs or not s.kernel.rounded or s.outputs[0][0] in read]


def keep_float16_weights(steps: list) -> None:
    """Place the float16 constants a fast float32 plan compiled as float16
    (:func:`~trt_kv.interpreter.weights.constant_array`): a matrix that only linear products
    read as their weight (``x @ W^T``, ``W [1.., N, K]``) stays float16, and those products
    read it as stored (:func:`~trt_kv.interpreter.products.narrow_weight_product`: a decode
    step moves half the bytes); every other one is widened here, once, as before. A matrix
    that other layers read too (a tied embedding, gathered and read by the output head) is
    widened for them, and its products get a float16 copy. Without the compiled helper
    (:data:`~trt_kv.interpreter.half.NATIVE` False) every float16 constant is widened."""
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, step in enumerate(steps):
        for j, (name, _) in enumerate(step.inputs):
            readers.setdefault(name, []).append((k, j))
    for name, i in _constants(steps).items():
        value = steps[i].kernel.fn(())
        if value.dtype != _F16:
            continue
        uses = readers.get(name, [])
        products = [k for k, j in uses if j == 1 and steps[k].kernel.linear]
        if not (half.NATIVE and _matrix(value) is not None):
            products = []
        shared = len(products) < len(uses)  # other readers: they get it widened
        if shared:
            steps[i] = _with_value(steps[i], _read_only(half.widen(value)))
        for k in products:
            if shared:  # the product reads its own float16 copy in place of the constant
                fn = steps[k].kernel.fn
                narrow = lambda x, f=fn, w=value: f([x[0], w])  # noqa: E731
                steps[k] = replace(steps[k], kernel=replace(steps[k].kernel, fn=narrow))
            else:  # read as stored: no cast to the compute dtype on the way in
                inputs = list(steps[k].inputs)
                inputs[1] = (inputs[1][0], False)
                steps[k] = replace(steps[k], inputs=tuple(inputs))


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def fuse_shared_products(steps: list) -> None:
    """Store the constant matrices of the products that read one input (a decoder block's
    Q, K and V projections; its gate and up projections) one above the other in one
    ``[sum N, K]`` array, each constant becoming a view of its rows: the same values, the
    same row-major layout, no extra memory. With a few rows in the input (the STACKED
    routes of :func:`~trt_kv.interpreter.products.choose`: up to 8 float32, 16 float16; one
    without the native helper), the first of those products runs them all as one call
    (:func:`~trt_kv.interpreter.native.product`, else
    :func:`~trt_kv.interpreter.products.row_dots`; each element's sum is the one the product
    alone computes: the same bits) and the others take their part of it; with more rows
    each runs on its own, as before.
    """
    constants = _constants(steps)
    groups: dict[str, list[int]] = {}
    for k, step in enumerate(steps):
        if step.kernel.linear and len(step.inputs) == 2 and step.inputs[1][0] in constants:
            groups.setdefault(step.inputs[0][0], []).append(k)
    readers: dict[str, int] = {}
    for step in steps:
        for name, _ in step.inputs:
            readers[name] = readers.get(name, 0) + 1
    for members in groups.values():
        group = []  # (step index, constant name, [N, K] matrix) of the products that qualify
        for k in members:
            name = steps[k].inputs[1][0]
            matrix = _matrix(steps[constants[name]].kernel.fn(()))
            if matrix is not None and readers[name] == 1:  # read by this product alone
                group.append((k, name, matrix))
        if len(group) < 2 or len({(m.shape[1], m.dtype) for _, _, m in group}) != 1:
            continue  # nothing to share, or no common K and dtype
        joined = np.concatenate([m for _, _, m in group], axis=0)  # [sum N, K]
        joined.flags.writeable = False
        shared = _SharedProduct(joined)
        lo = 0
        for k, name, matrix in group:
            hi = lo + matrix.shape[0]
            i = constants[name]
            shape = steps[i].kernel.fn(()).shape  # [1.., N, K]
            view = joined[lo:hi].reshape(shape)
            steps[i] = _with_value(steps[i], view)
            fn = shared.rows(steps[k].kernel.fn, lo, hi)
            steps[k] = replace(steps[k], kernel=replace(steps[k].kernel, fn=fn))
            lo = hi
        del group


def _matrix(value: np.ndarray) -> np.ndarray | None:
    """The ``[N, K]`` matrix (a view) of a constant ``[1.., N, K]`` that a linear product
    reads transposed, or None when it has leading dims > 1."""
    if value.ndim < 2 or any(d != 1 for d in value.shape[:-2]):
        return None
    return value.reshape(value.shape[-2:])


class _SharedProduct:
    """``x @ joined^T`` for the input last seen, shared by the products of a group (inputs
    that :func:`~trt_kv.interpreter.products.choose` gives a STACKED route)."""

    def __init__(self, joined: np.ndarray) -> None:
        self.joined = joined
        # (input, its values, product): the input is held, so its identity cannot be reused,
        # and its values are kept, so a caller's array changed in place between runs is not
        # served the old product; one tuple, swapped whole, so plans run from several threads
        # never pair one's input with another's product
        self.last: tuple[np.ndarray | None, ...] = (None, None, None)

    def rows(self, fn: Callable, lo: int, hi: int) -> Callable:
        """``fn`` (one product of the group, rows ``lo:hi`` of the joined matrix), inputs of
        a few rows served from the shared product."""
        stacked, n, dtype = products.Weight.STACKED, self.joined.shape[0], self.joined.dtype

        def run(x: list) -> np.ndarray:
            a = x[0]
            k = a.shape[-1] if a.ndim >= 2 else 0
            route = products.choose(stacked, a.size // k, n, k, dtype, a.dtype) if k else None
            if route is None:
                return fn(x)
            last = self.last
            if last[0] is not a or not np.array_equal(last[1], a):
                product = products.multiply(route, a.reshape(-1, k), self.joined)
                last = self.last = (a, a.copy(), product)
            return last[2][:, lo:hi].reshape(*a.shape[:-1], hi - lo)

        return run
