"""The layers TensorRT-RTX's ONNX parser emits, one ONNX op at a time: each graph is parsed by
the real parser, run by the interpreter (fast and plain plans) and compared with onnxruntime
on the same graph. Each case also names a layer type the parsed network must hold, so a case
cannot pass by exercising something else."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper  # noqa: E402

from tests.support.onnx_graphs import (  # noqa: E402
    assert_matches,
    graph,
    onnxruntime_outputs,
    parse,
)

F, I64, I32, B = T.FLOAT, T.INT64, T.INT32, T.BOOL
RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
XI = np.arange(24, dtype=np.int64).reshape(2, 3, 4) - 10
W4 = RNG.standard_normal(4).astype(np.float32)


def vi(name: str, dtype: int, shape: list | None = None) -> object:
    return helper.make_tensor_value_info(name, dtype, shape)


def node(op: str, ins: list[str], outs: list[str], **attrs: object) -> object:
    return helper.make_node(op, ins, outs, **attrs)


@dataclass
class Case:
    """One graph: nodes reading ``x`` (float ``[a, 3, 4]``, or int64 with ``ints``), writing
    ``y`` (and ``outputs``' other names), the layer type it must parse into."""

    layer: str
    nodes: list
    inits: dict = field(default_factory=dict)
    ints: bool = False
    out: int = F
    outputs: tuple = ()
    opset: int = 17
    feed: dict | None = None
    inputs: list | None = None

    def data(self) -> bytes:
        x = vi("x", I64 if self.ints else F, ["a", 3, 4])
        outs = [vi("y", self.out), *(vi(n, d) for n, d in self.outputs)]
        return graph(self.nodes, self.inputs or [x], outs, self.inits, self.opset)

    def inputs_fed(self) -> dict:
        return self.feed or {"x": XI if self.ints else X}


_SCALARS = {"s": np.array(2), "l": np.array(11), "d": np.array(3)}
CASES = {
    # shape arithmetic on int64 tensors
    "range": Case(
        "FILL",
        [node("Range", ["s", "l", "d"], ["y"])],
        out=I64,
        inputs=[vi(n, I64, []) for n in "sld"],
        feed=_SCALARS,
    ),
    "shape_slice_concat_reshape": Case(
        "SHUFFLE",
        [
            node("Shape", ["x"], ["s"]),
            node("Slice", ["s", "a", "b"], ["t"]),
            node("Concat", ["t", "m"], ["u"], axis=0),
            node("Reshape", ["x", "u"], ["y"]),
        ],
        {"a": np.array([0]), "b": np.array([1]), "m": np.array([-1])},
    ),
    "int_div_mod_mul": Case(
        "ELEMENTWISE",
        [
            node("Div", ["x", "d"], ["q"]),
            node("Mod", ["x", "d"], ["m"]),
            node("Mul", ["q", "m"], ["y"]),
        ],
        {"d": np.int64(3)},
        ints=True,
        out=I64,
    ),
    "int_compare_xor": Case(
        "ELEMENTWISE",
        [
            node("LessOrEqual", ["x", "d"], ["a"]),
            node("GreaterOrEqual", ["x", "d"], ["b"]),
            node("Xor", ["a", "b"], ["y"]),
        ],
        {"d": np.int64(3)},
        ints=True,
        out=B,
    ),
    "size": Case("GATHER", [node("Size", ["x"], ["y"])], out=I64),
    "flatten": Case("SHUFFLE", [node("Flatten", ["x"], ["y"], axis=2)]),
    # moves
    "expand": Case("SLICE", [node("Expand", ["x", "s"], ["y"])], {"s": np.array([2, 2, 3, 4])}),
    "tile": Case("SLICE", [node("Tile", ["x", "r"], ["y"])], {"r": np.array([1, 2, 3])}),
    "pad_constant": Case(
        "SLICE",
        [node("Pad", ["x", "p", "v"], ["y"], mode="constant")],
        {"p": np.array([0, 1, 2, 1, 0, 1]), "v": np.float32(3)},
    ),
    "pad_edge": Case(
        "SLICE", [node("Pad", ["x", "p"], ["y"], mode="edge")], {"p": np.array([0, 1, 2, 1, 0, 1])}
    ),
    "pad_reflect": Case(
        "SLICE",
        [node("Pad", ["x", "p"], ["y"], mode="reflect")],
        {"p": np.array([0, 1, 2, 0, 1, 1])},
    ),
    "slice_negative_steps": Case(
        "SLICE",
        [node("Slice", ["x", "a", "b", "ax", "st"], ["y"])],
        {
            "a": np.array([-1, 3]),
            "b": np.array([-100, 0]),
            "ax": np.array([2, 1]),
            "st": np.array([-2, -1]),
        },
    ),
    "split": Case(
        "SLICE",
        [node("Split", ["x", "s"], ["y", "z"], axis=2)],
        {"s": np.array([1, 3])},
        outputs=(("z", F),),
        opset=18,
    ),
    "transpose": Case("SHUFFLE", [node("Transpose", ["x"], ["y"], perm=[2, 0, 1])]),
    "unsqueeze_squeeze": Case(
        "SQUEEZE",
        [node("Unsqueeze", ["x", "a"], ["u"]), node("Squeeze", ["u", "a"], ["y"])],
        {"a": np.array([-1, 1])},
    ),
    "gather_negative": Case(
        "GATHER", [node("Gather", ["x", "i"], ["y"], axis=1)], {"i": np.array([[-1, 0], [2, -3]])}
    ),
    "gather_elements": Case(
        "GATHER",
        [node("GatherElements", ["x", "i"], ["y"], axis=2)],
        {"i": RNG.integers(-4, 4, (2, 3, 2))},
    ),
    "gather_nd": Case(
        "GATHER",
        [node("GatherND", ["x", "i"], ["y"], batch_dims=1)],
        {"i": np.array([[[1, 2]], [[0, -1]]])},
    ),
    "scatter_nd": Case(
        "SCATTER",
        [node("ScatterND", ["x", "i", "u"], ["y"])],
        {"i": np.array([[1], [-2]]), "u": np.ones((2, 3, 4), np.float32)},
    ),
    "scatter_elements": Case(
        "SCATTER",
        [node("ScatterElements", ["x", "i", "u"], ["y"], axis=1)],
        {"i": np.array([[[0, 1, 2, -1]], [[2, 2, 1, 0]]]), "u": np.ones((2, 1, 4), np.float32)},
    ),
    "one_hot": Case(
        "ONE_HOT",
        [node("OneHot", ["i", "d", "v"], ["y"], axis=0)],
        {"d": np.int64(4), "v": np.array([0, 1], np.float32)},
        inputs=[vi("i", I64, [3])],
        feed={"i": np.array([0, 2, -1])},
    ),
    # masks
    "where": Case(
        "SELECT",
        [node("Greater", ["x", "z"], ["c"]), node("Where", ["c", "x", "z"], ["y"])],
        {"z": np.float32(0.1)},
    ),
    "trilu_lower": Case("FILL", [node("Trilu", ["x", "k"], ["y"], upper=0)], {"k": np.int64(1)}),
    "trilu_upper": Case("FILL", [node("Trilu", ["x"], ["y"], upper=1)]),
    "cumsum": Case("CUMULATIVE", [node("CumSum", ["x", "ax"], ["y"])], {"ax": np.int64(2)}),
    "cumsum_exclusive_reverse": Case(
        "CUMULATIVE",
        [node("CumSum", ["x", "ax"], ["y"], exclusive=1, reverse=1)],
        {"ax": np.int32(-2)},
        ints=True,
        out=I64,
    ),
    "constant_of_shape": Case(
        "SLICE",
        [
            node("Shape", ["x"], ["s"]),
            node(
                "ConstantOfShape",
                ["s"],
                ["y"],
                value=onnx.numpy_helper.from_array(np.array([1.5], np.float32)),
            ),
        ],
    ),
    "cast_bool_not": Case(
        "CAST",
        [
            node("Cast", ["x"], ["b"], to=B),
            node("Not", ["b"], ["n"]),
            node("Cast", ["n"], ["y"], to=I32),
        ],
        out=I32,
        feed={"x": np.round(X)},
    ),
    "cast_float_to_int": Case(
        "CAST", [node("Cast", ["x"], ["y"], to=I64)], out=I64, feed={"x": X * 5}
    ),
    "pow_int": Case(
        "ELEMENTWISE", [node("Pow", ["x", "p"], ["y"])], {"p": np.int64(2)}, ints=True, out=I64
    ),
    # products and reductions
    "matmul_vector": Case("MATRIX_MULTIPLY", [node("MatMul", ["x", "w"], ["y"])], {"w": W4}),
    "matmul_broadcast": Case(
        "MATRIX_MULTIPLY",
        [node("MatMul", ["x", "w"], ["y"])],
        {"w": RNG.standard_normal((5, 1, 4, 2)).astype(np.float32)},
    ),
    "gemm": Case(
        "MATRIX_MULTIPLY",
        [
            node("Reshape", ["x", "s"], ["r"]),
            node("Gemm", ["r", "w", "b"], ["y"], transB=1, alpha=0.5, beta=2.0),
        ],
        {"s": np.array([-1, 4]), "w": RNG.standard_normal((5, 4)).astype(np.float32), "b": W4[:1]},
    ),
    "einsum": Case(
        "EINSUM",
        [node("Einsum", ["x", "w"], ["y"], equation="bij,kj->bik")],
        {"w": RNG.standard_normal((5, 4)).astype(np.float32)},
    ),
    "softmax": Case("SOFTMAX", [node("Softmax", ["x"], ["y"], axis=1)]),
    "log_softmax": Case("SOFTMAX", [node("LogSoftmax", ["x"], ["y"], axis=-1)]),
    "reduce_mean_keepdims": Case(
        "REDUCE", [node("ReduceMean", ["x"], ["y"], axes=[1, 2], keepdims=1)]
    ),
    "reduce_sum_axes_input": Case(
        "REDUCE",
        [node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)],
        {"ax": np.array([-1])},
        opset=18,
    ),
    "reduce_max_int": Case(
        "REDUCE", [node("ReduceMax", ["x"], ["y"], axes=[0], keepdims=0)], ints=True, out=I64
    ),
    "reduce_log_sum_exp": Case("REDUCE", [node("ReduceLogSumExp", ["x"], ["y"], axes=[2])]),
    "layer_norm": Case(
        "NORMALIZATION",
        [node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)],
        {"s": W4, "b": W4[::-1].copy()},
    ),
    "top_k": Case(
        "TOPK",
        [node("TopK", ["x", "k"], ["y", "i"], axis=-1)],
        {"k": np.array([2])},
        outputs=(("i", I64),),
    ),
    "arg_max": Case("TOPK", [node("ArgMax", ["x"], ["y"], axis=1, keepdims=0)], out=I64),
    "min_max": Case(
        "ELEMENTWISE",
        [node("Max", ["x", "z", "w"], ["m"]), node("Min", ["m", "z"], ["y"])],
        {"z": np.float32(0.3), "w": W4},
    ),
    "clip": Case(
        "ACTIVATION",
        [node("Clip", ["x", "lo", "hi"], ["y"])],
        {"lo": np.float32(-0.5), "hi": np.float32(0.5)},
    ),
    "gelu_tanh": Case("ACTIVATION", [node("Gelu", ["x"], ["y"], approximate="tanh")], opset=20),
}
UNARY = [
    "Abs",
    "Neg",
    "Sqrt",
    "Reciprocal",
    "Exp",
    "Log",
    "Cos",
    "Sin",
    "Erf",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
]
for op in UNARY:
    CASES[op.lower()] = Case(
        "UNARY",
        [node(op, ["x"], ["y"])],
        feed={"x": np.abs(X) + 0.1 if op in ("Sqrt", "Log") else X},
    )
CASES["isnan"] = Case(
    "UNARY",
    [node("IsNaN", ["x"], ["y"])],
    out=B,
    feed={"x": np.where(X > 0, X, np.nan).astype(np.float32)},
)


@pytest.mark.parametrize("name", list(CASES))
def test_each_op_runs_as_onnxruntime_runs_it(name):
    case = CASES[name]
    data, feed = case.data(), case.inputs_fed()
    parsed = parse(data)
    assert case.layer in parsed.layer_types()
    want = onnxruntime_outputs(data, feed)
    for fast in (True, False):
        assert_matches(parsed.run(feed, fast=fast), want)
