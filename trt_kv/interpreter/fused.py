"""A fast plan's quantized products, each run as one product over the blocks as stored.

:func:`~trt_kv.quantization.network.quantized_linear` puts a quantized matrix in a network as
``x @ dequantize(codes, scales)^T`` (an ``IDequantizeLayer`` over two constants, read by a
matrix product), plus, for a type with a minimum per block, ``+ sums @ offsets^T`` where
``sums`` is ``x`` summed per block (``x`` cast to float32, reshaped to ``[-1, blocks,
block]``, reduced over the last axis, cast back). :func:`find` recognises these layers in a
network; :func:`apply` replaces them in a fast plan's steps by one step that multiplies ``x``
by a :class:`~trt_kv.interpreter.blocks.BlockWeight` (codes, scales and offsets read in place,
:func:`~trt_kv.interpreter.products.block_product`), and runs the products of one input (Q/K/V,
gate/up) as one call. The step's output is rounded to its declared dtype as before; the value
is the product with ``d * code + o`` summed in float32, within float32 rounding of
dequantize-then-multiply (the network's own form rounds ``d * code``, the offsets' product
and the sum each to the activation dtype). A quantized matrix whose scales or offsets are not
float16 values (a float32 network's K-quant scales, say) keeps the network's layers.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trt_kv._trt import trt
from trt_kv.errors import TrtKvError
from trt_kv.interpreter import half, products
from trt_kv.interpreter.blocks import BlockWeight
from trt_kv.interpreter.graph import L as _L
from trt_kv.interpreter.graph import LayerGraph, product_of_transposed
from trt_kv.interpreter.program import identity, rewritten
from trt_kv.interpreter.registry import Binder, Kernel


@dataclass(frozen=True)
class Match:
    """One quantized product: the layer whose output it gives (the product, or the sum with
    the offsets' product), its input ``x``, the constants' layers and the layers it replaces."""

    output_layer: str
    x_layer: str  # a replaced layer whose input 0 is x
    rounding: str  # the layer whose output rounding the product's takes (the sum, say)
    x: str
    bits: int
    codes: str
    scales: str
    offsets: str | None
    replaced: frozenset[str]


def find(network: object) -> list[Match]:
    """The quantized products of ``network`` (see the module), in layer order."""
    g = LayerGraph(network)
    if not g.unique:  # steps are named by layer: names must tell layers apart
        return []
    found = []
    for deq in g.layers.values():
        if deq.type != _L.DEQUANTIZE or deq.axis != 1 or deq.num_inputs > 2:
            continue
        codes, scales = g.source(deq, 0, _L.CONSTANT), g.source(deq, 1, _L.CONSTANT)
        product = g.weight_reader(deq)
        if codes is None or scales is None or product is None:
            continue
        shape, blocks = tuple(codes.shape), tuple(scales.shape)
        x = product.get_input(0).name
        if len(shape) != 2 or len(blocks) != 2 or len(tuple(product.get_input(0).shape)) != 2:
            continue
        # a table others read too (a tied embedding's gather) stays, folded as before
        replaced = {product.name} | ({deq.name} if g.only_reader(deq) else set())
        bits = 4 if codes.get_output(0).dtype == trt.int4 else 8
        chain = _offsets_chain(g, product, x, (blocks[1], shape[1] // max(blocks[1], 1)))
        out, offsets = product, None
        if chain is not None:
            out, offsets, layers = chain
            replaced |= layers
        x_layer, rounding = product.name, out.name
        flat = _flattened(g, out, x, replaced)
        if flat is not None:
            out, x_layer, x, layers = flat
            replaced |= layers
        names = (out.name, x_layer, rounding, x, bits, codes.name, scales.name)
        found.append(Match(*names, offsets and offsets.name, frozenset(replaced - {out.name})))
    return found


def _offsets_chain(
    g: LayerGraph, product: object, x: str, blocks: tuple[int, int]
) -> tuple[object, object, set[str]] | None:
    """``(the sum, the offsets' constant, the chain's layers)`` where ``product``'s output is
    added to ``sums @ offsets^T`` with ``sums`` = ``x`` summed per block, else None.
    ``blocks``: (blocks a row, weights a block)."""
    add = g.only_reader(product)
    if add is None or add.type != _L.ELEMENTWISE or add.op != trt.ElementWiseOperation.SUM:
        return None
    other = 1 if add.get_input(0).name == product.get_output(0).name else 0
    second = g.source(add, other, _L.MATRIX_MULTIPLY)
    if not product_of_transposed(second):
        return None
    offsets = g.source(second, 1, _L.CONSTANT)
    if offsets is None or tuple(offsets.shape)[1:] != blocks[:1]:
        return None
    layers = {add.name, second.name}
    at = g.source(second, 0, _L.CAST) or g.source(second, 0, _L.REDUCE)
    if at is not None and at.type == _L.CAST:
        layers.add(at.name)
        at = g.source(at, 0, _L.REDUCE)
    if at is None or at.op != trt.ReduceOperation.SUM or at.axes != 1 << 2 or at.keep_dims:
        return None
    layers.add(at.name)
    shuffle = g.source(at, 0, _L.SHUFFLE)
    identity = (0, 1, 2)
    if (
        shuffle is None
        or shuffle.num_inputs > 1
        or tuple(shuffle.reshape_dims) != (-1, *blocks)
        or tuple(shuffle.first_transpose)[:3] != identity
        or tuple(shuffle.second_transpose)[:3] != identity
    ):
        return None
    layers.add(shuffle.name)
    t = shuffle.get_input(0).name
    if t != x:
        cast = g.source(shuffle, 0, _L.CAST)
        if cast is None or cast.get_input(0).name != x:
            return None
        layers.add(cast.name)
    return add, offsets, layers


def _flattened(
    g: LayerGraph, out: object, x: str, replaced: set[str]
) -> tuple[object, str, str, set[str]] | None:
    """For a rank-3 input: ``(the reshape back, the flattening layer, its input, the layers of
    both)`` where ``x`` is a ``[-1, K]`` reshape of an input ``X`` that only the replaced layers
    read, and ``out``'s only reader reshapes it to ``X``'s leading dims and ``N`` (its shape
    from ``X``'s: shape, slice, concatenation); else None."""
    flatten = g.producer.get(x)
    if flatten is None or flatten.type != _L.SHUFFLE or flatten.num_inputs > 1:
        return None
    dims = tuple(flatten.reshape_dims)
    if len(dims) != 2 or dims[0] != -1:
        return None
    if any(r.name not in replaced for r in g.readers.get(x, [])) or x in g.outputs:
        return None
    source = flatten.get_input(0).name
    back = g.only_reader(out)
    if back is None or back.type != _L.SHUFFLE or back.num_inputs != 2:
        return None
    concat = g.source(back, 1, _L.CONCATENATION)
    if concat is None or concat.num_inputs != 2:
        return None
    lead = g.source(concat, 0, _L.SLICE)
    shape = None if lead is None else g.source(lead, 0, _L.SHAPE)
    if shape is None or shape.get_input(0).name != source:
        return None
    rank = len(tuple(flatten.get_input(0).shape))
    if (
        tuple(lead.start)[:1] != (0,)
        or tuple(lead.shape) != (rank - 1,)
        or tuple(lead.stride) != (1,)
    ):
        return None
    return back, flatten.name, source, {flatten.name, concat.name, lead.name, shape.name}


def apply(steps: list, matches: list[Match]) -> list:
    """``steps`` (a fast plan's, before its constants are folded) with each match's layers
    replaced by one step ``x @ W^T`` over its :class:`BlockWeight` (products of one input run
    as one call); a match whose scales or offsets are not float16 values stays as it is."""
    by_name = {step.layer: i for i, step in enumerate(steps)}
    value = lambda name: steps[by_name[name]].kernel.fn(())  # noqa: E731 (a constant's)
    fused: dict[str, tuple] = {}  # output layer -> (x input, weight, output rounding)
    dropped: set[str] = set()
    for m in matches:
        if not all(name in by_name for name in (*m.replaced, m.output_layer, m.rounding)):
            continue
        try:
            offsets = None if m.offsets is None else value(m.offsets)
            w = BlockWeight.from_codes(value(m.codes), value(m.scales), offsets, m.bits)
        except TrtKvError:
            continue
        rounding = steps[by_name[m.rounding]].outputs[0][1]
        fused[m.output_layer] = (steps[by_name[m.x_layer]].inputs[0], w, rounding)
        dropped |= m.replaced
    groups: dict[str, list[str]] = {}
    for name, ((x, _), _, _) in fused.items():
        groups.setdefault(x, []).append(name)
    units: dict[str, Unit] = {}
    for names in groups.values():  # each unit's step takes its first member's place
        names = sorted(names, key=by_name.__getitem__)  # in the order the steps run
        for unit in _units([(n, fused[n][1], fused[n][2]) for n in names]):
            units[unit[0][0]] = unit
    dropped |= {name for names, *_ in units.values() for name in names[1:]}
    changed = {
        first: {
            "kernel": Kernel(run, bind=bind),
            "inputs": (fused[first][0],),
            "outputs": tuple((steps[by_name[n]].outputs[0][0], f) for n, f in zip(names, ends)),
        }
        for first, (names, run, ends, bind) in units.items()
    }
    return rewritten(steps, dropped, changed)


Member = tuple[str, BlockWeight, Callable]  # (output layer, weight, output rounding)
# (members, kernel, finishers, binder: products.block_binder where the outputs need no finisher)
Unit = tuple[tuple[str, ...], Callable, tuple[Callable, ...], Binder | None]


def _units(members: list[Member]) -> list[Unit]:
    """The steps of the products of one input (``members`` in layer order): those that stack
    (same K, bits, block, offsets or not) as one step, one product of their stacked weights
    giving each member's columns as its output (Q/K/V, gate/up); where they round their
    outputs alike (float16: one finisher), the product is rounded once as a whole and each
    column is taken as it is. A member that stacks with none is a step of its own."""
    units: list[Unit] = []
    left = list(members)
    while left:
        (first, w, finish), rest = left[0], left[1:]
        together = [left[0]] + [m for m in rest if w.joins(m[1])]
        left = [m for m in rest if not w.joins(m[1])]
        alike = all(m[2] is finish for m in together)
        rounded = alike and finish is half.round_any  # rounded by the helper, in its call
        finishers = tuple(identity if alike else m[2] for m in together)
        if len(together) == 1:
            call = products.block_caller(w, rounded)
            bind = products.block_binder(w, rounded)
            units.append(
                ((first,), lambda x, c=call: c(x[0]), (identity if rounded else finish,), bind)
            )
            continue
        stacked = w.stacked([v for _, v, _ in together[1:]])
        edges = np.cumsum([0] + [v.shape[0] for _, v, _ in together]).tolist()
        finish = identity if rounded or not alike else finish
        bounds = list(itertools.pairwise(edges))
        run = _columns(stacked, rounded, finish, bounds)
        bind = products.block_binder(stacked, rounded, bounds) if finish is identity else None
        units.append((tuple(m[0] for m in together), run, finishers, bind))
    return units


def _columns(
    weight: BlockWeight, rounded: bool, finish: Callable, bounds: list[tuple[int, int]]
) -> Callable:
    """The kernel of stacked products: ``x @ weight^T`` (rounded to float16 values in the
    helper's call, or by ``finish``) -> each member's columns ``[lo, hi)``, a view of the one
    product."""
    finish = None if finish is identity else finish
    call = products.block_caller(weight, rounded)

    def run(x: list) -> tuple[np.ndarray, ...]:
        y = call(x[0])
        y = y if finish is None else finish(y)
        return tuple(y[..., lo:hi] for lo, hi in bounds)

    return run
