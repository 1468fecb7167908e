"""A fast plan's decode step bound once: buffers held between steps, helper calls whose
arguments are taken once.

A decode loop runs a plan on feeds of one shape, step after step, with the same cache arrays.
:class:`BoundProgram` runs such a step without what a
:class:`~trt_kv.interpreter.program.SlotProgram` does again on every run: each tensor has a
buffer held between runs; the feed's arrays are copied into theirs (but the caches updated
in place, which must be the very arrays the program was bound to); each step whose kernel
binds (:attr:`~trt_kv.interpreter.registry.Kernel.bind`: the block products, the residual
add and RMSNorm, SwiGLU, the attention block's decode path) is a call of the compiled helper
(two for attention) with its addresses and dims taken once; every other step runs its kernel
as before, its outputs copied into their buffers. The same kernels and helper calls in the
same order: the same bits as the plan's unbound runs (tested). 1.5-4.5 ms less of a 15-20
ms decode step of the default model with ``--weights keep`` (``docs/performance.md``).

:class:`Binding` makes a program at the second run in a row of one signature (the feed's
shapes and dtypes, the updated caches' identities) when the feed's other arrays take at
most :data:`FEED_LIMIT` bytes and its buffers (those of bound calls too) at most
:data:`LIMIT`; a signature that took more is not tried again until another one is bound. A
step whose output does not fit its buffer (a shape that depends on values) ends the bound
run: the rest of that run is unbound, and the program is dropped. One run at a time uses the
buffers; another thread's run meanwhile is unbound.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from collections.abc import Callable, Mapping

import numpy as np

from trt_kv.interpreter.half import widen_to

# Bytes of buffers a bound program may hold (the default model's decode step: ~1.5 MiB at
# B=1, ~12 MiB at B=8), and of the feed's arrays it copies (ids and positions, not activations)
LIMIT = 16 << 20
FEED_LIMIT = 64 << 10
# "bound": programs made, "steps": their steps bound (calls), "runs": runs they ran to the end
COUNTS: Counter[str] = Counter()

Entry = tuple  # (fn, get, many, casts, out, finish, outs, free, bind): a SlotProgram entry


def called(counts: Counter[str], name: str, fn: Callable, operands: tuple) -> Callable[[], bool]:
    """A bound step's call (:data:`~trt_kv.interpreter.registry.Bound`): ``fn(*operands)``,
    counted under ``name`` in ``counts``."""

    def call() -> bool:
        counts[name] += 1
        fn(*operands)
        return True

    return call


def usual(x: list, width: int | None = None) -> bool:
    """Whether a bound step's inputs are what its helper call reads as they are: float32
    arrays of one shape (last axis ``width``), C-contiguous and aligned, with elements."""
    shape = x[0].shape if type(x[0]) is np.ndarray else None
    return (
        shape is not None
        and all(type(a) is np.ndarray and a.dtype == np.float32 and a.shape == shape for a in x)
        and all(a.flags.c_contiguous and a.flags.aligned for a in x)
        and (width is None or shape[-1:] == (width,))
        and x[0].size > 0
    )


class BoundProgram:
    """One feed signature's program, bound by running it once (:meth:`bind`)."""

    def __init__(self, entries: list[tuple], values: list, caches: list, copies: list) -> None:
        self.entries = entries  # (call or None, fn, get, many, casts, outs: (slot, finish, buffer))
        self.values = values  # each slot's buffer (or the feed's cache, or a constant)
        self.caches = caches  # (name, weak reference to the cache bound to)
        self.copies = copies  # (name, buffer the feed's array is copied into)

    @classmethod
    def bind(
        cls, program: list[Entry], template: list, inputs: list, feed: Mapping, updated: set[str],
        compute: np.dtype,
    ) -> tuple[BoundProgram | None, list]:  # fmt: skip
        """``(program, values)``: the run of ``program`` on ``feed`` (the tensors by slot),
        and the program bound to its buffers; None where the feed's arrays other than the
        caches take more than :data:`FEED_LIMIT` bytes (or one is not an ndarray), or the
        buffers more than :data:`LIMIT` (the rest of the run then frees each tensor after its
        last reader, as unbound). The same values either way."""
        v, caches, copies = template.copy(), [], []
        for name, i in inputs:
            a = feed[name]
            if name in updated:
                v[i] = a
                caches.append((name, weakref.ref(a)))
            else:
                v[i] = np.array(a, order="C", copy=True)
                copies.append((name, v[i]))
        held = sum(buf.nbytes for _, buf in copies)
        small = held <= FEED_LIMIT and all(type(feed[name]) is np.ndarray for name, _ in inputs)
        entries: list | None = [] if small else None  # None: the rest of the run unbound
        for fn, get, many, casts, out, finish, outs, free, bind in program:
            args = _args(v, get, many, casts, compute)
            ends = ((out, finish),) if outs is None else outs
            made = (
                bind(args) if entries is not None and bind and not casts and _plain(ends) else None
            )
            call = made[1] if made is not None and made[1]() else None
            if call is not None:
                results = made[0] if outs is not None else (made[0],)
            else:
                results = (fn(args),) if outs is None else fn(args)
            if entries is None:  # as the slot program runs it
                for (i, end), value in zip(ends, results):
                    v[i] = value if end is None else end(value)
                for i in free:
                    v[i] = None
                continue
            slots = []
            for (i, end), value in zip(ends, results):
                value = value if end is None or call else end(value)
                own = not _fed(value, feed)  # a bound call's buffer, or one of its own
                keep = call is None and own
                v[i] = np.array(value, order="C", copy=True) if keep else value
                held += v[i].nbytes if own else 0
                slots.append((i, end, v[i] if keep or call else None))
            entries.append((call, fn, get, many, casts, tuple(slots)))
            entries = entries if held <= LIMIT else None
        made = None if entries is None else cls(entries, v, caches, copies)
        COUNTS["bound"] += made is not None
        COUNTS["steps"] += 0 if made is None else sum(e[0] is not None for e in made.entries)
        return made, v

    def fits(self, feed: Mapping) -> bool:
        """Whether ``feed`` is this program's: the same caches, arrays of the same shapes."""
        return all(feed[name] is ref() for name, ref in self.caches) and all(
            type(a := feed[name]) is np.ndarray and a.shape == b.shape and a.dtype == b.dtype
            for name, b in self.copies
        )

    def run(self, feed: Mapping, compute: np.dtype) -> tuple[list, bool]:
        """``(values, whole)``: the tensors by slot for ``feed`` (which :meth:`fits`), and
        False where a step's output did not fit its buffer (this program is then stale)."""
        for name, buf in self.copies:
            np.copyto(buf, feed[name])
        v, whole = self.values.copy(), True
        for call, fn, get, many, casts, outs in self.entries:
            if whole and call is not None and call():
                continue
            args = _args(v, get, many, casts, compute)
            result = fn(args)
            for (i, finish, buf), value in zip(outs, (result,) if len(outs) == 1 else result):
                value = value if finish is None else finish(value)
                if whole and buf is not None and value is not buf:
                    if value.shape == buf.shape and value.dtype == buf.dtype:
                        np.copyto(buf, value)
                        continue
                    whole = False
                v[i] = value
        COUNTS["runs"] += whole
        return v, whole


def _args(v: list, get: Callable, many: bool, casts: tuple, compute: np.dtype) -> list:
    """A step's arguments from the tensors by slot, as the slot program gives them."""
    args = [*get(v)] if many else [get(v)]
    for j in casts:
        args[j] = widen_to(args[j], compute)
    return args


def _plain(outs: tuple) -> bool:
    """Whether a step's outputs need no finisher (a bound call writes them as they are)."""
    return all(finish is None for _, finish in outs)


def _fed(value: object, feed: Mapping) -> bool:
    """Whether ``value`` is one of the feed's arrays itself (a cache updated in place)."""
    return any(value is a for a in feed.values())


class Binding:
    """A :class:`~trt_kv.interpreter.program.SlotProgram`'s bound program: made at the second
    run in a row of one feed signature, used while feeds fit it (see the module)."""

    def __init__(self, updated: set[str]) -> None:
        self.updated = updated
        self.program: BoundProgram | None = None
        self.last: tuple | None = None  # the last unbound run's signature
        self.refused: tuple | None = None  # the last signature bound beyond the limits
        self.lock = threading.Lock()

    def signature(self, feed: Mapping) -> tuple:
        return tuple(
            (name, id(a))
            if name in self.updated
            else (name, np.shape(a), getattr(a, "dtype", None))
            for name, a in feed.items()
        )

    def run(self, program: list[Entry], template: list, inputs: list, feed: Mapping,
            compute: np.dtype) -> list | None:  # fmt: skip
        """The tensors by slot of a run on ``feed`` through the bound program (made now at a
        signature's second run in a row), or None: run it unbound (the caller holds
        :attr:`lock`)."""
        made = self.program
        if made is not None and made.fits(feed):
            v, whole = made.run(feed, compute)
            self.program = made if whole else None
            return v
        signature = self.signature(feed)
        if signature != self.last or signature == self.refused:
            self.last = signature
            return None
        self.last = None
        made, v = BoundProgram.bind(program, template, inputs, feed, self.updated, compute)
        self.program = made or self.program
        self.refused = None if made else signature
        return v
