"""A fast plan's element-wise chains, each run as one call of the compiled helper.

A decoder layer runs these chains of small layers on every token, up to ~8 steps each of a
NumPy call and a float16 rounding when run one by one (~60 us an RMSNorm in a decode step):

- **RMSNorm** as a network states it (``trt_kv.models.llama.norm_mlp.rms_norm``): ``X`` (``x``
  cast to float32), ``X * X``, AVG over the last axis (kept), ``+ eps``, SQRT, ``X / r``, then
  optionally a cast to the activation dtype and ``* weight`` (a constant ``[1, .., 1, D]``);
  with the residual add that gives ``x``, where one does (the sum is an output of the step
  too: the residual stream others read);
- **SwiGLU**: SIGMOID of ``gate``, ``gate * s``, ``* up``;
- **a scale**: ``x`` cast to float32, times a one-element constant, cast back (the query's
  ``1/sqrt(H)`` before attention, 3 steps as 1; NumPy's multiply, then the rounding).

:func:`find` recognises them in a network, :func:`apply` replaces their steps by one step
(the helper's, as :func:`rms_norm` and :func:`swiglu` call it):
the same float32 operations in the same order (the mean as NumPy's pairwise sum divided in
float64, as ``np.mean``), each float16 boundary rounded where the network declares it. The
values are those of the steps run one by one, within one float16 rounding where NumPy's sum
order or its ``exp`` (SwiGLU's SIGMOID takes the helper's, as a fast plan does from 4096
elements) differ. Only in a float32 plan with the helper built, and only where every tensor
inside the chain (the residual sum aside) is read by the chain alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from trt_kv._trt import trt
from trt_kv.errors import ShapeError, mismatch
from trt_kv.interpreter import bound, half, native
from trt_kv.interpreter.buffers import address, contiguous_aligned, expect_dtype
from trt_kv.interpreter.graph import L, LayerGraph
from trt_kv.interpreter.program import identity, rewritten
from trt_kv.interpreter.registry import Bound, Kernel

_EW = trt.ElementWiseOperation
COUNTS: Counter[str] = Counter()  # chains run, by kind
_ROUNDS = {trt.DataType.HALF: True, trt.DataType.FLOAT: False}  # float16 boundary or none


@dataclass(frozen=True)
class Chain:
    """One chain: its kind, the layer whose output it gives, where its inputs come from
    (layer, input index: that step's input and cast flag), its constants' layers (None:
    absent), which results it rounds to float16 (bit flags, see the helper), and the layers it
    replaces."""

    kind: str  # "rms_norm", "swiglu" or "scale"
    output_layer: str
    sources: tuple[tuple[str, int], ...]
    constants: tuple[str | None, ...]
    rounded: int
    replaced: frozenset[str]
    width: int = 0  # D, the last axis RMSNorm reduces (static)
    at: str = ""  # the layer whose step the chain's takes ("": output_layer's)


def find(network: object) -> list[Chain]:
    """The chains of ``network`` (see the module), in layer order."""
    g = LayerGraph(network)
    if not g.unique:
        return []
    found = []
    for layer in list(g.layers.values()):
        chain = _rms_norm(g, layer)
        chain = chain and _with_residual(g, chain)
        chain = chain or _swiglu(g, layer) or _scale(g, layer)
        if chain is not None:
            found.append(chain)
    return found


def _is(layer: object | None, op: object) -> bool:
    return layer is not None and layer.type == L.ELEMENTWISE and layer.op == op


def _float(*layers: object) -> bool:
    return all(layer.get_output(0).dtype == trt.DataType.FLOAT for layer in layers)


def _single(shape: object) -> bool:
    return all(d == 1 for d in tuple(shape))


def _rms_norm(g: LayerGraph, div: object) -> Chain | None:
    """The RMSNorm whose ``X / r`` is ``div``, else None."""
    if not _is(div, _EW.DIV):
        return None
    x = div.get_input(0).name
    sqrt = g.source(div, 1, L.UNARY)
    if sqrt is None or sqrt.op != trt.UnaryOperation.SQRT:
        return None
    add = g.source(sqrt, 0, L.ELEMENTWISE)
    if not _is(add, _EW.SUM):
        return None
    mean, eps = g.source(add, 0, L.REDUCE), g.source(add, 1, L.CONSTANT)
    if mean is None or eps is None or not _single(eps.shape):
        return None
    square = g.source(mean, 0, L.ELEMENTWISE)
    rank = len(tuple(div.get_input(0).shape))
    width = tuple(div.get_input(0).shape)[-1] if rank else -1
    if (
        mean.op != trt.ReduceOperation.AVG
        or not mean.keep_dims
        or mean.axes != 1 << (rank - 1)
        or not _is(square, _EW.PROD)
        or (square.get_input(0).name, square.get_input(1).name) != (x, x)
        or width < 1
        or not _float(square, mean, add, sqrt, div)
    ):
        return None
    replaced, source = {square.name, mean.name, add.name, sqrt.name, div.name}, (square.name, 0)
    cast = g.producer.get(x)  # the cast to float32 joins where only the chain reads it
    alone = sorted(r.name for r in g.readers.get(x, [])) == sorted([square.name] * 2 + [div.name])
    if (
        cast is not None
        and cast.type == L.CAST
        and cast.get_input(0).dtype in _ROUNDS
        and alone
        and x not in g.outputs
    ):
        replaced.add(cast.name)
        source = (cast.name, 0)
    out, rounded, weight = div, 0, None
    after = g.only_reader(div)
    if after is not None and after.type == L.CAST and after.to_type in _ROUNDS:
        out, rounded = after, int(_ROUNDS[after.to_type])
        replaced.add(after.name)
        after = g.only_reader(after)
    if _is(after, _EW.PROD) and after.get_output(0).dtype in _ROUNDS:
        j = 0 if after.get_input(1).name == out.get_output(0).name else 1
        w = g.source(after, j, L.CONSTANT)
        shape = () if w is None else tuple(w.shape)
        if w is not None and len(shape) == rank and shape[-1] == width and _single(shape[:-1]):
            rounded |= 2 * _ROUNDS[after.get_output(0).dtype]
            out, weight = after, w.name
            replaced.add(after.name)
    consts = (eps.name, weight)
    replaced.discard(out.name)
    return Chain("rms_norm", out.name, (source,), consts, rounded, frozenset(replaced), width)


def _with_residual(g: LayerGraph, c: Chain) -> Chain:
    """The RMSNorm ``c`` with the residual add that gives its input, where an element-wise SUM
    does (float16 or float32): one step at the add's place, giving the sum (its other
    readers', the residual stream) and the norm; else ``c`` as it is."""
    layer, j = c.sources[0]
    add = g.producer.get(g.layers[layer].get_input(j).name)
    if not _is(add, _EW.SUM) or add.get_output(0).dtype not in _ROUNDS:
        return c
    rounded = c.rounded | _ROUNDS[add.get_output(0).dtype] << 2
    sources = ((add.name, 0), (add.name, 1))
    return replace(c, kind="add_rms_norm", sources=sources, rounded=rounded, at=add.name)


def _swiglu(g: LayerGraph, sigmoid: object) -> Chain | None:
    """The SwiGLU whose SIGMOID is ``sigmoid``, else None."""
    if not isinstance(sigmoid, trt.IActivationLayer):
        return None
    if sigmoid.type != trt.ActivationType.SIGMOID:
        return None
    gate = sigmoid.get_input(0).name
    act = g.only_reader(sigmoid)
    if not _is(act, _EW.PROD):
        return None
    names = (act.get_input(0).name, act.get_input(1).name)
    s = sigmoid.get_output(0).name
    if sorted(names) != sorted((gate, s)):
        return None
    out = g.only_reader(act)
    if not _is(out, _EW.PROD):
        return None
    j = 0 if out.get_input(1).name == act.get_output(0).name else 1
    readers = sorted(r.name for r in g.readers.get(gate, []))
    dtypes = [layer.get_output(0).dtype for layer in (sigmoid, act, out)]
    if (
        readers != sorted([sigmoid.name, act.name])
        or gate in g.outputs
        or out.get_input(j).name == act.get_output(0).name
        or any(d not in _ROUNDS for d in dtypes)
    ):
        return None
    rounded = sum(_ROUNDS[d] << i for i, d in enumerate(dtypes))
    sources = ((sigmoid.name, 0), (out.name, j))
    return Chain("swiglu", out.name, sources, (), rounded, frozenset({sigmoid.name, act.name}))


def _scale(g: LayerGraph, prod: object) -> Chain | None:
    """``x`` cast to float32, times a one-element float32 constant, cast back (the query's
    1/sqrt(H) before attention): its PROD is ``prod``, else None."""
    if not _is(prod, _EW.PROD) or not _float(prod):
        return None
    cast, const = g.source(prod, 0, L.CAST), g.source(prod, 1, L.CONSTANT)
    if cast is None or const is None:
        cast, const = g.source(prod, 1, L.CAST), g.source(prod, 0, L.CONSTANT)
    after = g.only_reader(prod)
    if (
        cast is None
        or const is None
        or cast.to_type != trt.DataType.FLOAT
        or cast.get_input(0).dtype not in _ROUNDS
        or not _single(const.shape)
        or after is None
        or after.type != L.CAST
        or after.to_type not in _ROUNDS
    ):
        return None
    replaced = frozenset({cast.name, prod.name})
    return Chain(
        "scale", after.name, ((cast.name, 0),), (const.name,), _ROUNDS[after.to_type], replaced
    )


def apply(steps: list, chains: list[Chain], compute: np.dtype) -> list:
    """``steps`` (a fast plan's, before its constants are folded) with each chain's layers
    replaced by one step; none where the helper is not built or ``compute`` is not float32."""
    if not half.NATIVE or compute != np.float32:
        return steps
    by_name = {step.layer: i for i, step in enumerate(steps)}
    value = lambda name: steps[by_name[name]].kernel.fn(())  # noqa: E731 (a constant's)
    fused, dropped = {}, set()
    for c in chains:
        at = c.at or c.output_layer
        mine = {*c.replaced, c.output_layer, at}
        layers = (*mine, *(n for n in c.constants if n is not None))
        if not all(name in by_name for name in layers) or (dropped | set(fused)) & mine:
            continue
        inputs = tuple(steps[by_name[layer]].inputs[j] for layer, j in c.sources)
        names = dict.fromkeys(steps[by_name[n]].outputs[0][0] for n in (at, c.output_layer))
        kernel = _kernel(c, [None if n is None else value(n) for n in c.constants])
        outputs = tuple((name, identity) for name in names)  # rounded by the kernel
        fused[at] = {"kernel": kernel, "inputs": inputs, "outputs": outputs}
        dropped |= mine - {at}
    return rewritten(steps, dropped, fused)


def _kernel(c: Chain, constants: list[np.ndarray | None]) -> Kernel:
    """The chain's step: the usual arrays (C-contiguous float32, the weight's width) straight
    to the helper, with the weight's address and the scratch taken once; anything else
    through :func:`rms_norm` / :func:`swiglu`, which check it."""
    if c.kind == "add_rms_norm":
        return _add_norm_kernel(c, constants)
    if c.kind == "scale":
        factor = np.float32(np.asarray(constants[0], np.float32).reshape(()))
        return Kernel(Scale(factor, bool(c.rounded)))
    if c.kind == "swiglu":

        def glu(x: list) -> np.ndarray:
            COUNTS["swiglu"] += 1
            return swiglu(x[0], x[1], c.rounded)

        def bind(x: list) -> Bound | None:  # gate, up: the usual arrays, swiglu's call
            if not bound.usual(x):
                return None
            out = np.empty(x[0].shape, _F32)
            operands = address(x[0]), address(x[1]), out.size, c.rounded, address(out)
            return out, bound.called(COUNTS, "swiglu", native.LIB.trt_kv_swiglu, operands)

        return Kernel(glu, bind=bind)
    eps, w, held, at = _norm_constants(c, constants)
    normed, weighted, call = c.rounded & 1, c.rounded >> 1 & 1, native.LIB.trt_kv_rms_norm

    def run(x: list, _held: tuple = held) -> np.ndarray:
        COUNTS["rms_norm"] += 1
        a = x[0]
        usual = type(a) is np.ndarray and a.dtype == _F32 and a.shape[-1:] == (c.width,)
        if not (usual and a.flags.c_contiguous and a.flags.aligned):
            return rms_norm(a, eps, w, c.rounded)
        out = np.empty(a.shape, _F32)
        if a.size:
            rows = a.size // c.width
            call(address(a), rows, c.width, eps, at[0], normed, weighted, address(out), at[1])
        return out

    return Kernel(run)


def _norm_constants(c: Chain, constants: list[np.ndarray | None]) -> tuple:
    """An RMSNorm chain's ``eps``, weight ``[D]`` (or None), the arrays its step must hold
    (the helper reads them by address: the weight and a scratch row) and their addresses."""
    eps = float(np.asarray(constants[0], np.float32).reshape(()))
    w = None if constants[1] is None else np.ascontiguousarray(constants[1], _F32).reshape(-1)
    scratch = np.empty(c.width, _F32)
    return eps, w, (w, scratch), (0 if w is None else w.ctypes.data, scratch.ctypes.data)


@dataclass(frozen=True)
class Scale:
    """A "scale" chain's kernel: ``x * factor`` in float32 (one rounding), rounded to float16
    values where ``rounded``. Its fields are public: the attention block
    (:mod:`~trt_kv.interpreter.attention_step`) folds the scale into its own call."""

    factor: np.float32
    rounded: bool

    def __call__(self, x: list) -> np.ndarray:
        COUNTS["scale"] += 1
        y = np.multiply(x[0], self.factor)  # float32 times a float32 scalar: float32
        return half.round_any(y) if self.rounded else y


def _add_norm_kernel(c: Chain, constants: list[np.ndarray | None]) -> Kernel:
    """The residual add and its RMSNorm (:func:`_kernel`'s RMSNorm after ``a + b``): returns
    ``(sum, norm)``; arrays of two shapes (a broadcast add) add in NumPy first."""
    eps, w, held, at = _norm_constants(c, constants)
    flags = (c.rounded >> 2 & 1, eps, at[0], c.rounded & 1, c.rounded >> 1 & 1)
    call = native.LIB.trt_kv_add_rms_norm

    def run(x: list, _held: tuple = held) -> tuple[np.ndarray, np.ndarray]:
        COUNTS["rms_norm"] += 1
        a, b = x[0], x[1]
        usual = type(a) is type(b) is np.ndarray and a.dtype == b.dtype == _F32
        if not (usual and a.shape == b.shape and a.shape[-1:] == (c.width,)):
            total = np.add(a, b, dtype=_F32)
            total = half.round_any(total) if flags[0] else total
            return total, rms_norm(total, eps, w, c.rounded & 3)
        a, b = contiguous_aligned(a), contiguous_aligned(b)
        total, out = np.empty(a.shape, _F32), np.empty(a.shape, _F32)
        if a.size:
            rows = a.size // c.width
            call(address(a), address(b), rows, c.width, *flags, address(total), address(out), at[1])
        return total, out

    def bind(x: list, _held: tuple = held) -> Bound | None:  # run's call, its addresses once
        if not bound.usual(x, c.width):
            return None
        total, out = np.empty(x[0].shape, _F32), np.empty(x[0].shape, _F32)
        operands = address(x[0]), address(x[1]), x[0].size // c.width, c.width, *flags
        operands += address(total), address(out), at[1]
        return (total, out), bound.called(COUNTS, "rms_norm", call, operands)

    return Kernel(run, bind=bind)


_F32 = np.dtype(np.float32)


def rms_norm(x: np.ndarray, eps: float, w: np.ndarray | None, rounded: int) -> np.ndarray:
    """The RMSNorm chain of float32 ``x [..., D]`` over its last axis with float32 ``w [D]``
    (None: no weight), rounding the normalized rows (``rounded`` bit 0) and the result (bit
    1) to float16, through the helper (built: see :data:`~trt_kv.interpreter.half.NATIVE`).

    Raises:
        DTypeError: x or w not float32. ShapeError: w not ``[D]``.
    """
    expect_dtype("x", x, _F32)
    d = x.shape[-1] if x.ndim else 0
    if w is not None:
        expect_dtype("w", w, _F32)
        if w.shape != (d,):
            raise ShapeError(mismatch("w", "shape", (d,), w.shape))
    x = contiguous_aligned(x)
    out = np.empty(x.shape, _F32)
    if out.size:
        scratch = np.empty(d, _F32)
        where = 0 if w is None else address(w)
        native.LIB.trt_kv_rms_norm(
            address(x), x.size // d, d, eps, where, rounded & 1, rounded >> 1 & 1,
            address(out), address(scratch),
        )  # fmt: skip
    return out


def swiglu(gate: np.ndarray, up: np.ndarray, rounded: int) -> np.ndarray:
    """``gate * sigmoid(gate) * up`` of float32 arrays (broadcast to one shape), the sigmoid
    (``rounded`` bit 0), ``gate * s`` (bit 1) and the result (bit 2) rounded to float16 where
    the flags say, through the helper.

    Raises:
        DTypeError: gate or up not float32.
    """
    expect_dtype("gate", gate, _F32)
    expect_dtype("up", up, _F32)
    if gate.shape != up.shape:
        gate, up = np.broadcast_arrays(gate, up)
    gate, up = contiguous_aligned(gate), contiguous_aligned(up)
    out = np.empty(gate.shape, _F32)
    if out.size:
        native.LIB.trt_kv_swiglu(address(gate), address(up), out.size, rounded, address(out))
    return out
