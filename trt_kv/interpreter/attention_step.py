"""A decoder layer's attention in a fast plan, from its Q/K/V columns to its output, as one
step.

Between a layer's Q/K/V product and its output product, a decode step runs 11 small steps:
three shuffles to heads ``[B, S, N*H] -> [B, N, S, H]``, RoPE of Q and of K, Q's
``1/sqrt(H)`` scale, the K and V cache updates, attention (its input and output boundary
layers) and the shuffle back ``[B, Nq, S, H] -> [B, S, Nq*H]``: 330 of a decode step's 551
steps in the default model, each with the executor's loop and its own checks around a few
microseconds of arithmetic (attention aside).

:func:`find` recognises these steps in a fast plan; :func:`apply` puts one step in their
place. For one token a sequence (``S = 1``: a decode step) that step runs them with less
around them:

- the shuffles are reshapes (with S = 1 the same elements in the same order);
- RoPE of Q and K, Q's scale and both cache updates are one helper call
  (:func:`~trt_kv.interpreter.native_rope.decode_heads`, an element-wise chain of the decode
  step), with the bits of those steps: RoPE's table rows derived once a step
  (:func:`~trt_kv.interpreter.transformer.native_rows`), the scale a ``scale`` chain's
  (:class:`~trt_kv.interpreter.chains.Scale`), and K and V written after the cache update's
  own test (:func:`~trt_kv.interpreter.transformer.writes_within`) passed for both caches,
  which must be writeable, C-contiguous float32 arrays (a float32 plan's, or float16 caches
  held wide). Otherwise the steps run, and raise their own errors before anything is written;
- attention is the helper's call that the attention step's kernel would make (the same keys
  read and keep mask, derived once a step), made directly; anything the helper does not take
  goes to that kernel, with its own casts.

Anything else (a prefill chunk, a dtype or table the helper does not take) runs the original
steps in order (:class:`~trt_kv.interpreter.program.SlotProgram`), as without this pass.
Either way the bits are those of the steps run one by one (tested).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trt_kv import _trt
from trt_kv.interpreter import attention_bound, half
from trt_kv.interpreter.attention import causal_kind, native_attend
from trt_kv.interpreter.attention_bound import rows_apart, writable
from trt_kv.interpreter.buffers import contiguous_aligned
from trt_kv.interpreter.chains import Scale
from trt_kv.interpreter.graph import L, LayerGraph, heads_merged, heads_split
from trt_kv.interpreter.half import widen_to
from trt_kv.interpreter.native_rope import decode_heads
from trt_kv.interpreter.program import SlotProgram, Step, identity, rewritten
from trt_kv.interpreter.registry import Kernel
from trt_kv.interpreter.transformer import native_rows, packed_form, writes_within

COUNTS: Counter[str] = Counter()  # "decode": calls the fast path ran; "steps": the others
_F32, _I64 = np.dtype(np.float32), np.dtype(np.int64)


@dataclass(frozen=True)
class Block:
    """One decoder layer's attention steps, by role (each the name of its layer)."""

    heads: tuple[str, str, str]  # the shuffles of the Q, K, V columns to heads
    ropes: tuple[str, str]  # RoPE of Q, of K (the same tables, positions and form)
    scale: str  # the one step between Q's RoPE and attention (its 1/sqrt(H))
    caches: tuple[str, str]  # the K and V cache updates (each output aliases its cache)
    attention: tuple[str, str]  # the input and output boundary layers
    back: str  # the shuffle of the result to [B, S, Nq*H]
    widths: tuple[int, int, int]  # (Nq, Nkv, H)
    interleaved: bool
    rotary_dim: int | None  # None: H
    causal: str  # attention's causal kind (attention.causal_kind)

    @property
    def layers(self) -> tuple[str, ...]:
        """Every layer the step replaces, by role (the heads, RoPE of Q, the scale, RoPE of
        K, the caches, attention, the shuffle back)."""
        q, k, v = self.heads
        return (q, k, v, self.ropes[0], self.scale, self.ropes[1], *self.caches,
                *self.attention, self.back)  # fmt: skip


class _Steps:
    """A fast plan's steps as a graph: each tensor's producing step and the steps reading it."""

    def __init__(self, steps: list[Step], outputs: set[str]) -> None:
        self.producer = {name: step for step in steps for name, _ in step.outputs}
        self.readers: dict[str, list[Step]] = {}
        for step in steps:
            for name in dict.fromkeys(n for n, _ in step.inputs if n):
                self.readers.setdefault(name, []).append(step)
        self.outputs = outputs

    def alone(self, name: str | None) -> Step | None:
        """The one step reading tensor ``name`` (no network output), else None."""
        readers = self.readers.get(name or "", [])
        return readers[0] if len(readers) == 1 and name not in self.outputs else None

    def source(self, step: Step | None, j: int) -> Step | None:
        """The step producing ``step``'s input ``j`` where ``step`` alone reads it."""
        name = step.inputs[j][0] if step is not None and j < len(step.inputs) else None
        return self.producer.get(name or "") if self.alone(name) is step else None

    def reader(self, step: Step | None) -> Step | None:
        """The one step reading ``step``'s one output, else None."""
        return self.alone(step.outputs[0][0]) if step and len(step.outputs) == 1 else None


def find(steps: list[Step], network: object) -> list[Block]:
    """The attention blocks among ``steps`` (a fast plan's, of ``network``), in step order."""
    if not (_trt.FEATURES.attention and _trt.FEATURES.rotary_embedding):
        return []  # no network of the installed module holds the layers
    g = LayerGraph(network)
    if not g.unique:
        return []
    s = _Steps(steps, g.outputs)
    found = []
    for step in steps:
        layer = g.layers.get(step.layer)
        if layer is not None and layer.type == L.ATTENTION_INPUT:
            block = _match(g, s, step)
            if block is not None:
                found.append(block)
    return found


def _match(g: LayerGraph, s: _Steps, ai: Step) -> Block | None:
    """The block whose attention input layer's step is ``ai``, else None."""
    kind = lambda step, t: step is not None and g.layers[step.layer].type == t  # noqa: E731
    if len(ai.inputs) < 3 or len(ai.outputs) != 1:
        return None
    ao = s.reader(ai)
    back = s.reader(ao) if kind(ao, L.ATTENTION_OUTPUT) else None
    scale = s.source(ai, 0)
    rope_q = s.source(scale, 0) if scale is not None and len(scale.inputs) == 1 else None
    cache_k, cache_v = (s.producer.get(ai.inputs[j][0] or "") for j in (1, 2))
    if not (kind(back, L.SHUFFLE) and kind(rope_q, L.ROTARY_EMBEDDING)):
        return None
    if (
        cache_k is None
        or cache_v is None
        or not all(c.kernel.aliases == {0: 0} and len(c.inputs) >= 3 for c in (cache_k, cache_v))
    ):
        return None
    rope_k, shuffle_v = s.source(cache_k, 1), s.source(cache_v, 1)
    if not kind(rope_k, L.ROTARY_EMBEDDING) or len(rope_q.inputs) != 4:
        return None
    if rope_k.inputs[1:] != rope_q.inputs[1:] or not _alike(g, rope_q, rope_k):
        return None
    heads = (s.source(rope_q, 0), s.source(rope_k, 0), shuffle_v)
    if not all(kind(h, L.SHUFFLE) for h in heads) or not _only_identity(
        ai, ao, back, scale, rope_q, rope_k, *heads
    ):
        return None
    widths = [heads_split(g.layers[h.layer]) for h in heads]
    nq, h = widths[0] or (0, 0)
    if not nq or widths[1] is None or widths[1] != widths[2] or widths[1][1] != h:
        return None
    if heads_merged(g.layers[back.layer]) != nq * h:
        return None
    rope, att = g.layers[rope_q.layer], g.layers[ai.layer].attention
    forms = _trt.FEATURES.attention_io_forms
    if forms and (packed_form(att.query_form) or packed_form(att.key_value_form)):
        return None
    return Block(
        tuple(x.layer for x in heads), (rope_q.layer, rope_k.layer), scale.layer,
        (cache_k.layer, cache_v.layer), (ai.layer, ao.layer), back.layer,
        (nq, widths[1][0], h), bool(rope.interleaved), int(rope.rotary_embedding_dim) or None,
        causal_kind(att),
    )  # fmt: skip


def _only_identity(*steps: Step) -> bool:
    """Whether each step has one output that needs no finisher (rounded in its call, or
    nothing to round)."""
    return all(len(x.outputs) == 1 and x.outputs[0][1] is identity for x in steps)


def _alike(g: LayerGraph, a: Step, b: Step) -> bool:
    """Whether two RoPE layers have the same form (interleaved, rotary dim)."""
    x, y = g.layers[a.layer], g.layers[b.layer]
    return (x.interleaved, x.rotary_embedding_dim) == (y.interleaved, y.rotary_embedding_dim)


def apply(steps: list[Step], blocks: list[Block], compute: np.dtype) -> list[Step]:
    """``steps`` with each block's steps replaced by one (see the module) in the place of its
    last; none where the helper is not built or ``compute`` is not float32."""
    if not half.NATIVE or compute != _F32:
        return steps
    order = {step.layer: i for i, step in enumerate(steps)}
    changed, dropped, shared = {}, set(), {}
    for block in blocks:
        if not all(name in order for name in block.layers) or dropped & set(block.layers):
            continue
        mine = sorted((steps[order[name]] for name in block.layers), key=lambda s: order[s.layer])
        last = order[mine[-1].layer]
        made = {name for step in mine for name, _ in step.outputs}
        outputs = [steps[order[n]].outputs[0][0] for n in (block.back, *block.caches)]
        before = [s for s in steps[:last] if s.layer not in block.layers]
        if any(name in outputs[1:] for s in before for name, _ in s.inputs):
            continue  # a cache read between the update and the block's last step
        inputs = list(dict.fromkeys(n for s in mine for n, _ in s.inputs if n and n not in made))
        kernel = _kernel(block, mine, inputs, outputs, compute, shared)
        changed[block.back] = {
            "kernel": kernel,
            "inputs": tuple((name, False) for name in inputs),  # each step casts its own
            "outputs": tuple((name, identity) for name in outputs),
        }
        dropped |= set(block.layers) - {block.back}
    return rewritten(steps, dropped, changed)


def _kernel(
    block: Block, mine: list[Step], inputs: list[str], outputs: list[str], compute: np.dtype,
    shared: dict,
) -> Kernel:  # fmt: skip
    """The block's step of its steps ``mine`` (in the plan's order): inputs by name
    (``inputs``), outputs the result ``[B, S, Nq*H]`` and the two caches; bound once
    (:mod:`~trt_kv.interpreter.attention_bound`) with what the plan's blocks derive alike
    each run in ``shared``."""
    program = SlotProgram(mine, inputs, outputs, compute)
    steps = {step.layer: step for step in mine}

    def slow(x: list) -> tuple[np.ndarray, ...]:
        COUNTS["steps"] += 1
        values = program.run(dict(zip(inputs, x)))
        return tuple(values[name] for name in outputs)

    at = {name: i for i, name in enumerate(inputs)}
    head_q, head_k, head_v = (at[steps[n].inputs[0][0]] for n in block.heads)
    rope = steps[block.ropes[0]]
    cos, sin, positions = (at[rope.inputs[j][0]] for j in (1, 2, 3))
    widen = rope.inputs[1][1] or rope.inputs[2][1]  # tables the RoPE step casts
    rounded = tuple(steps[n].kernel.fn is steps[n].kernel.halves for n in block.ropes)
    scale = steps[block.scale].kernel.fn  # one input: Q, float32 here (no cast to make)
    writes = _writes(steps[block.caches[0]], steps[block.caches[1]], at)
    attend = _attend(steps[block.attention[0]], at, compute, block.causal)
    nq, nkv, h = block.widths
    heads = None
    if isinstance(scale, Scale) and writes is not None:
        r = block.rotary_dim or h
        heads = decode_heads(
            block.widths, r, block.interleaved, rounded, scale.factor, scale.rounded
        )

    def run(x: list) -> tuple[np.ndarray, ...]:
        qc, kc, vc = x[head_q], x[head_k], x[head_v]
        b = qc.shape[0] if qc.ndim == 3 else -1
        if (
            heads is None
            or qc.shape[1:] != (1, nq * h)
            or kc.shape != vc.shape
            or kc.shape != (b, 1, nkv * h)
            or qc.dtype != _F32
            or kc.dtype != _F32
            or vc.dtype != _F32
            or not rows_apart(qc, kc, vc)
        ):
            return slow(x)
        q = qc.reshape(b, nq, 1, h)  # S = 1: [B, S, N, H] and [B, N, S, H] alike
        c, s = x[cos], x[sin]
        if widen:
            c, s = widen_to(c, compute), widen_to(s, compute)
        rows = native_rows(q, c, s, x[positions], block.rotary_dim)
        keys, values, where = x[writes[0]], x[writes[1]], x[writes[2]]
        if rows is None or not _fit(keys, values, vc.reshape(b, nkv, 1, h), where):
            return slow(x)  # its steps raise their own errors, before anything is written
        COUNTS["decode"] += 1
        c, s, where = (
            contiguous_aligned(c),
            contiguous_aligned(s),
            np.ascontiguousarray(where, _I64),
        )
        q = heads(qc, kc, vc, c, s, rows[0], keys, values, where)
        out = attend(q, keys, values, x)
        return out.reshape(b, 1, nq * h), keys, values

    bind = None
    if heads is not None and attend.raw[3]:  # type: ignore[attr-defined]
        mask_at, lengths_at, rounded_out, _ = attend.raw  # type: ignore[attr-defined]
        form = attention_bound.Form(block.widths, block.rotary_dim, block.causal, rounded_out)
        slots = attention_bound.Slots(
            head_q, head_k, head_v, cos, sin, positions, *writes, mask_at, lengths_at
        )
        bind = attention_bound.binder(form, slots, heads, shared, COUNTS)

    return Kernel(run, bind=bind)


def _writes(cache_k: Step, cache_v: Step, at: dict[str, int]) -> tuple[int, int, int] | None:
    """``(K cache, V cache, write indices)`` by position among the block step's inputs where
    both updates are padded ones (cache, update, write_indices) at the same indices, else None
    (the decode path then runs the steps)."""
    forms = [tuple(name for name, _ in c.inputs) for c in (cache_k, cache_v)]
    padded = all(len(f) == 3 and f[0] is not None and f[2] is not None for f in forms)
    if not padded or forms[0][2] != forms[1][2]:
        return None
    return at[forms[0][0]], at[forms[1][0]], at[forms[0][2]]


def _fit(keys: np.ndarray, values: np.ndarray, update: np.ndarray, where: np.ndarray) -> bool:
    """Whether the decode path writes ``update`` (K's or V's, float32 ``[B, Nkv, 1, H]``) into
    both caches itself: caches it writes (:func:`~trt_kv.interpreter.attention_bound.writable`)
    that the updates' shape fits at ``where``
    (:func:`~trt_kv.interpreter.transformer.writes_within`, the cache update's own test). Else
    the cache update steps run, with their errors."""
    return writable(keys, values) and writes_within(keys, update, where)


def _attend(
    step: Step, at: dict[str, int], compute: np.dtype, causal: str
) -> Callable[..., np.ndarray]:
    """``attend(q, k, v, x)``: the attention step's kernel on ``q``, ``k``, ``v`` (its inputs
    0-2, which the block computes) and its other inputs from ``x`` (the block step's, by
    position in ``at``), each cast where the step casts it. Where that kernel would call the
    helper's attention on these operands (:func:`~trt_kv.interpreter.attention.native_attend`,
    which the kernel calls too: float32, a decode step's few rows a KV head), the call is made
    here, without the kernel's argument handling: the same call, the same bits."""
    rest = [at.get(name) if name else None for name, _ in step.inputs[3:]]
    casts = [j for j, (_, cast) in enumerate(step.inputs) if cast]
    fn = step.kernel.fn
    rounded = fn is step.kernel.halves  # the step's output rounded to float16 in its call
    mask_at, lengths_at = (rest[i] if i < len(rest) else None for i in (0, 3))  # inputs 3, 6
    direct = all(j < 3 for j in casts)  # no cast of the mask or lengths to make

    def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, x: list) -> np.ndarray:
        if direct:
            mask = None if mask_at is None else x[mask_at]
            lengths = None if lengths_at is None else x[lengths_at]
            _, out = native_attend(q, k, v, mask, lengths, causal, compute, rounded)
            if out is not None:
                return out
        args = [q, k, v, *[None if i is None else x[i] for i in rest]]
        for i in casts:
            args[i] = widen_to(args[i], compute)
        return fn(args)

    attend.raw = mask_at, lengths_at, rounded, direct  # type: ignore[attr-defined]
    return attend
