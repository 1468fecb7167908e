"""The fast plan's program: compiled steps in a flat list, tensors in numbered slots.

:class:`Step` is one compiled layer (kernel, input names, output finishers, tensors to drop);
:func:`with_frees` marks each tensor's last use; :class:`SlotProgram` runs the steps with
tensors in a list instead of a dict of names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from operator import itemgetter

import numpy as np

from trt_kv.interpreter.bound import Binding
from trt_kv.interpreter.half import widen_to
from trt_kv.interpreter.registry import Kernel, is_float


@dataclass(frozen=True)
class Step:
    """One compiled layer: its kernel, the tensors it reads and writes, those it frees."""

    layer: str
    kernel: Kernel
    inputs: tuple[tuple[str | None, bool], ...]  # (tensor name, may need a cast to compute)
    outputs: tuple[tuple[str, Callable[[np.ndarray], np.ndarray]], ...]
    free: tuple[str, ...] = ()  # tensors no later step reads: dropped once this step ran


def identity(a: np.ndarray) -> np.ndarray:
    """The finisher of an output that needs no rounding (the executor skips calling it)."""
    return a


def holds(constant: np.ndarray | None, compute: np.dtype) -> bool:
    """True for a constant already in the compute dtype (or not float): no cast to check."""
    return constant is not None and (constant.dtype == compute or not is_float(constant.dtype))


class SlotProgram:
    """The fast plan's loop: tensors live in a list indexed by slot, constants are filled in
    once (their layers ran at compile time: a constant's value is all it computes), identity
    finishers are not called, and cast inputs widen float16 through
    :func:`~trt_kv.interpreter.half.widen_to`. Same steps, same kernels, same order; each
    step's entry is planned once (its inputs read by one getter, a single output's slot and
    finisher unpacked), so a decode step's ~1,250 entries cost the loop ~0.5 us each."""

    def __init__(
        self,
        steps: list[Step],
        inputs: list[str],
        outputs: list[str],
        compute: np.dtype,
        updated: set[str] | None = None,
    ) -> None:
        slot: dict[str | None, int] = {None: 0}  # slot 0 holds None: an absent input
        for name in inputs:
            slot[name] = len(slot)
        for step in steps:
            for name, _ in step.outputs:
                slot.setdefault(name, len(slot))
        self.inputs = [(name, slot[name]) for name in inputs]
        self.outputs = [(name, slot[name]) for name in outputs]
        self.compute = compute
        template: list[np.ndarray | None] = [None] * len(slot)
        self.program = []
        for step in steps:
            k = step.kernel
            if k.rounded and not step.inputs and len(step.outputs) == 1:
                template[slot[step.outputs[0][0]]] = k.fn(())  # a constant: never freed
                continue
            ins = tuple(slot[name] for name, _ in step.inputs)
            outs = tuple(
                (slot[name], None if finish is identity else finish)
                for name, finish in step.outputs
            )
            self.program.append(
                (
                    k.fn,
                    _getter(ins),
                    len(ins) != 1,
                    tuple(
                        j
                        for j, (name, cast) in enumerate(step.inputs)
                        if cast and not holds(template[slot[name]], compute)
                    ),
                    *(outs[0] if len(outs) == 1 else (0, None)),
                    None if len(outs) == 1 else outs,
                    tuple(slot[name] for name in step.free),
                    k.bind,
                )
            )
        self.template = template
        self.binding = None if updated is None else Binding(updated)

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The network outputs by name (arrays a later run may overwrite: the caller copies
        them, a cache updated in place aside), through the bound program where there is one
        (:mod:`~trt_kv.interpreter.bound`)."""
        b, v = self.binding, None
        if b is not None and b.lock.acquire(blocking=False):
            try:
                v = b.run(self.program, self.template, self.inputs, feed, self.compute)
            finally:
                b.lock.release()
        if v is None:
            v = self._run(feed)
        return {name: v[i] for name, i in self.outputs}

    def _run(self, feed: Mapping[str, np.ndarray]) -> list:
        """The tensors by slot (the outputs and the constants at least), unbound."""
        v = self.template.copy()
        for name, i in self.inputs:
            v[i] = feed[name]
        compute = self.compute
        for fn, get, many, casts, out, finish, outs, free, _ in self.program:
            args = [*get(v)] if many else [get(v)]
            for j in casts:
                args[j] = widen_to(args[j], compute)
            result = fn(args)
            if outs is None:  # one output
                v[out] = result if finish is None else finish(result)
            else:
                for (i, finish), value in zip(outs, result):
                    v[i] = value if finish is None else finish(value)
            del args, result
            for i in free:  # peak memory: the live tensors only, not every one
                v[i] = None
        return v


def _getter(slots: tuple[int, ...]) -> Callable[[list], object]:
    """Reads ``slots`` of the tensor list at once: one slot's tensor itself, several as a
    tuple (``operator.itemgetter``: ~0.3 us a step against a comprehension's ~0.5)."""
    return itemgetter(*slots) if slots else lambda v: ()


def rewritten(
    steps: list[Step], dropped: set[str], changed: Mapping[str, Mapping[str, object]]
) -> list[Step]:
    """``steps`` without the steps of the ``dropped`` layers, the step of each layer in
    ``changed`` with those fields replaced (a fast plan's pattern pass: one step in the place
    of the several it fuses)."""
    return [
        replace(step, **changed[step.layer]) if step.layer in changed else step
        for step in steps
        if step.layer not in dropped
    ]


def with_frees(steps: list[Step], kept: set[str]) -> list[Step]:
    """Each step with the tensors to drop after it: those it produces or reads for the last
    time, except network inputs (the caller's arrays) and outputs (aliased caches included)."""
    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        for name, _ in step.outputs:
            last[name] = i  # produced and never read: dropped at once
        for name, _ in step.inputs:
            if name is not None:
                last[name] = i
    free: list[list[str]] = [[] for _ in steps]
    for name, i in last.items():
        if name not in kept:
            free[i].append(name)
    return [replace(step, free=tuple(f)) for step, f in zip(steps, free)]
