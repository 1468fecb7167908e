"""How a fast plan stores the constant matrices that matrix multiplies read: layouts BLAS
runs fastest, and products of one row against several matrices run as one.

Both rewrite the compiled steps of :class:`~trt_kv.interpreter.executor.Plan` (``_Step``
records: ``kernel``, ``inputs``, ``outputs``) in place. The values every layer computes stay
the same; only which memory BLAS reads, and how many calls it takes, change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np


def relayout_transposed_constants(steps: list) -> None:
    """Store each constant that every reader reads transposed (``Kernel.transposed_inputs``)
    with its last two axes transposed in memory: the same values, one copy, and the
    transpose the kernels take is C-contiguous (BLAS's fast non-transposed path). A constant
    also read as is (an embedding table gathered and tied to the head) keeps its layout, and
    when large, its transposed copy serves one-row products only (see :func:`_one_row_copy`).
    Replaces the steps in place, so each old array is freed as soon as its copy exists."""
    constants = {
        step.outputs[0][0]: i
        for i, step in enumerate(steps)
        if step.kernel.rounded and not step.inputs and len(step.outputs) == 1
    }
    transposed: set[str] = set()
    plain: set[str] = set()
    for step in steps:
        for j, (name, _) in enumerate(step.inputs):
            (transposed if j in step.kernel.transposed_inputs else plain).add(name)
    for name in transposed & set(constants):
        i = constants[name]
        value = steps[i].kernel.fn(())
        if value.ndim < 2 or _rows_contiguous(np.swapaxes(value, -1, -2)):
            continue  # already read as BLAS likes it (a column block of a joined matrix too)
        if name in plain and value.size < _ONE_ROW_COPY_MIN:
            continue
        stored = np.swapaxes(np.ascontiguousarray(np.swapaxes(value, -1, -2)), -1, -2)
        stored.flags.writeable = False
        if name in plain:
            for k, step in enumerate(steps):
                reads = [j for j, (n, _) in enumerate(step.inputs) if n == name]
                if reads == [1] and 1 in step.kernel.transposed_inputs:
                    fn = _one_row_copy(step.kernel.fn, stored)
                    steps[k] = replace(step, kernel=replace(step.kernel, fn=fn))
            continue
        kernel = replace(steps[i].kernel, fn=lambda x, v=stored: v)
        steps[i] = replace(steps[i], kernel=kernel)
        del value, stored, kernel


def _rows_contiguous(a: np.ndarray) -> bool:
    """Each row of the last two axes contiguous (BLAS reads it with a leading dimension)."""
    return a.strides[-1] == a.itemsize or a.shape[-1] == 1


_ONE_ROW_COPY_MIN = 1 << 24  # elements (64 MiB in float32): a vocabulary-sized tied head


def _one_row_copy(fn: Callable, stored: np.ndarray) -> Callable:
    """``fn`` (a matrix multiply reading its input 1 transposed) run on ``stored``, the same
    values transposed in memory, when input 0 has one row: BLAS's matrix-vector product is
    ~1.8x faster on that layout. Wider products keep the original layout, where BLAS is
    faster for them (``(W x^T)^T``)."""

    def run(x: list) -> np.ndarray:
        a = x[0]
        if a.ndim >= 2 and a.size == a.shape[-1]:
            return fn([a, stored, *x[2:]])
        return fn(x)

    return run


def fuse_one_row_products(steps: list) -> None:
    """Store the constant matrices of the products that read one input (a decoder block's
    Q, K and V projections; its gate and up projections) side by side in one ``[K, sum N]``
    array, each constant becoming a view of its columns: the same values, no extra memory.
    With one row in the input, the first of those products runs them all as one
    matrix-vector product (BLAS streams one wide matrix ~15% faster than three narrow
    ones, with the same sums per output) and the others take their columns of it; with more
    rows each runs on its own, as before. Runs before :func:`relayout_transposed_constants`
    (the joined matrix is the constants' one transposed copy, made once).
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
        group = []  # (step index, constant name, [K, N] matrix) of the products that qualify
        for k in members:
            name = steps[k].inputs[1][0]
            matrix = _matrix(steps[constants[name]].kernel.fn(()))
            if matrix is not None and readers[name] == 1:  # read by this product alone
                group.append((k, name, matrix))
        if len(group) < 2 or len({(m.shape[0], m.dtype) for _, _, m in group}) != 1:
            continue  # nothing to share, or no common K and dtype
        joined = np.ascontiguousarray(np.concatenate([m for _, _, m in group], axis=1))
        joined.flags.writeable = False  # [K, sum N]
        shared = _OneRowProduct(joined)
        lo = 0
        for k, name, matrix in group:
            hi = lo + matrix.shape[1]
            i = constants[name]
            shape = steps[i].kernel.fn(()).shape  # [1.., N, K]
            view = np.swapaxes(joined[:, lo:hi], 0, 1).reshape(shape)
            steps[i] = replace(steps[i], kernel=replace(steps[i].kernel, fn=lambda x, v=view: v))
            fn = shared.columns(steps[k].kernel.fn, lo, hi)
            steps[k] = replace(steps[k], kernel=replace(steps[k].kernel, fn=fn))
            lo = hi
        del group


def _matrix(value: np.ndarray) -> np.ndarray | None:
    """The ``[K, N]`` matrix (a view) a linear product reads from a constant ``[1.., N, K]``,
    or None when it has leading dims > 1."""
    if value.ndim < 2 or any(d != 1 for d in value.shape[:-2]):
        return None
    return np.swapaxes(value.reshape(value.shape[-2:]), 0, 1)


class _OneRowProduct:
    """``x @ joined`` for the one-row input last seen, shared by the products of a group."""

    def __init__(self, joined: np.ndarray) -> None:
        self.joined = joined
        # (input, its values, product): the input is held, so its identity cannot be reused,
        # and its values are kept, so a caller's array changed in place between runs is not
        # served the old product; one tuple, swapped whole, so plans run from several threads
        # never pair one's input with another's product
        self.last: tuple[np.ndarray | None, ...] = (None, None, None)

    def columns(self, fn: Callable, lo: int, hi: int) -> Callable:
        """``fn`` (one product of the group, columns ``lo:hi``), one-row inputs served from
        the shared product."""

        def run(x: list) -> np.ndarray:
            a = x[0]
            if a.ndim < 2 or a.size != a.shape[-1]:
                return fn(x)
            last = self.last
            if last[0] is not a or not np.array_equal(last[1], a):
                last = self.last = (a, a.copy(), a.reshape(1, -1) @ self.joined)
            return last[2][:, lo:hi].reshape(*a.shape[:-1], hi - lo)

        return run
