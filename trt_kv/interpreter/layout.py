"""Products of one row against several constant matrices, run as one (a fast plan's layout
of those matrices).

:func:`fuse_one_row_products` rewrites the compiled steps of
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

from trt_kv.interpreter.linalg import row_dots


def fuse_one_row_products(steps: list) -> None:
    """Store the constant matrices of the products that read one input (a decoder block's
    Q, K and V projections; its gate and up projections) one above the other in one
    ``[sum N, K]`` array, each constant becoming a view of its rows: the same values, the
    same row-major layout, no extra memory. With one row in the input, the first of those
    products runs them all as one dot product per matrix row
    (:func:`~trt_kv.interpreter.linalg.row_dots`, as each product alone would: the same
    bits) and the others take their part of it; with more
    rows each runs on its own, as before.
    """
    constants = {
        step.outputs[0][0]: i
        for i, step in enumerate(steps)
        if step.kernel.rounded and not step.inputs and len(step.outputs) == 1
    }
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
        shared = _OneRowProduct(joined)
        lo = 0
        for k, name, matrix in group:
            hi = lo + matrix.shape[0]
            i = constants[name]
            shape = steps[i].kernel.fn(()).shape  # [1.., N, K]
            view = joined[lo:hi].reshape(shape)
            steps[i] = replace(steps[i], kernel=replace(steps[i].kernel, fn=lambda x, v=view: v))
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


class _OneRowProduct:
    """``joined @ x`` for the one-row input last seen, shared by the products of a group."""

    def __init__(self, joined: np.ndarray) -> None:
        self.joined = joined
        # (input, its values, product): the input is held, so its identity cannot be reused,
        # and its values are kept, so a caller's array changed in place between runs is not
        # served the old product; one tuple, swapped whole, so plans run from several threads
        # never pair one's input with another's product
        self.last: tuple[np.ndarray | None, ...] = (None, None, None)

    def rows(self, fn: Callable, lo: int, hi: int) -> Callable:
        """``fn`` (one product of the group, rows ``lo:hi`` of the joined matrix), one-row
        inputs served from the shared product."""

        def run(x: list) -> np.ndarray:
            a = x[0]
            if a.ndim < 2 or a.size != a.shape[-1] or a.dtype != self.joined.dtype:
                return fn(x)
            last = self.last
            if last[0] is not a or not np.array_equal(last[1], a):
                last = self.last = (a, a.copy(), row_dots(self.joined, a.reshape(-1)))
            return last[2][lo:hi].reshape(*a.shape[:-1], hi - lo)

        return run
