"""The routes of a fast plan's products ``x @ W^T`` (trt_kv/interpreter/products.py).

``choose(weight, rows, n, k, dtype, rows_dtype, built)`` picks how ``x [rows, k] @ W^T``
runs for ``W [n, k]``; the table below pins its answer for every threshold's both sides, the
compiled helper built or not. Each route's result is the float64 product within float32
rounding: ROW_DOTS, FEW_ROWS, WIDENED and BLAS here; NATIVE and PANELS in
test_interpreter_float16_weights.py (``test_product_is_the_float64_product_within_...``).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.interpreter.test_interpreter_float16_weights import _float32_bound
from tests.support.compiled_helper import require_compiled_helper
from tests.support.interpreter_support import Net, rand
from trt_kv._trt import trt
from trt_kv.interpreter import compile_network, products
from trt_kv.interpreter.products import Route, Weight, choose, multiply

STORED, NARROW, STACKED, KEYS, OTHER, BLOCKS = Weight
F16, F32, F64 = np.float16, np.float32, np.float64
BIG, SMALL = (1000, 333), (100, 333)  # 333,000 weight elements; 33,300 (under 1 << 16)

# (weight, rows, (n, k), weight dtype, rows dtype, helper built) -> route
TABLE = [
    # a MatrixMultiply against a float32 weight, helper built: a decode step, a prefill chunk
    (STORED, 1, BIG, F32, F32, True, "native"),
    (STORED, 8, BIG, F32, F32, True, "native"),
    (STORED, 9, BIG, F32, F32, True, "panels"),
    (STORED, 128, BIG, F32, F32, True, "panels"),
    (STORED, 129, BIG, F32, F32, True, "blas"),
    (STORED, 1, SMALL, F32, F32, True, "blas"),
    (STORED, 1, (256, 256), F32, F32, True, "native"),  # 65,536 elements: large enough
    (STORED, 1, (255, 256), F32, F32, True, "blas"),
    (STORED, 1, BIG, F32, F64, True, "blas"),  # rows of another dtype
    # float64 (the helper multiplies float16 and float32 only), or no helper
    (STORED, 1, BIG, F64, F64, True, "row_dots"),
    (STORED, 2, BIG, F64, F64, True, "blas"),
    (STORED, 1, BIG, F32, F32, False, "row_dots"),
    (STORED, 2, BIG, F32, F32, False, "few_rows"),
    (STORED, 16, BIG, F32, F32, False, "few_rows"),
    (STORED, 17, BIG, F32, F32, False, "blas"),
    (STORED, 2, SMALL, F32, F32, False, "blas"),
    # a float16 weight kept as stored (only where the helper is built)
    (NARROW, 1, BIG, F16, F32, True, "native"),
    (NARROW, 16, BIG, F16, F32, True, "native"),
    (NARROW, 17, BIG, F16, F32, True, "panels"),
    (NARROW, 128, BIG, F16, F32, True, "panels"),
    (NARROW, 129, BIG, F16, F32, True, "widened"),
    (NARROW, 1, SMALL, F16, F32, True, "native"),  # any size
    # Q/K/V stacked: one call for the group, or None (each product chooses its own)
    (STACKED, 8, BIG, F32, F32, True, "native"),
    (STACKED, 9, BIG, F32, F32, True, None),
    (STACKED, 16, BIG, F16, F32, True, "native"),
    (STACKED, 17, BIG, F16, F32, True, None),
    (STACKED, 1, SMALL, F32, F32, True, "native"),  # any size
    (STACKED, 1, BIG, F32, F32, False, "row_dots"),
    (STACKED, 2, BIG, F32, F32, False, None),
    (STACKED, 1, BIG, F64, F64, True, "row_dots"),
    (STACKED, 2, BIG, F64, F64, True, None),
    (STACKED, 1, BIG, F32, F64, True, None),
    # a decode step's attention scores, the keys [Skv, H] as the weight
    (KEYS, 8, (1024, 64), F32, F32, True, "native"),
    (KEYS, 9, (1024, 64), F32, F32, True, "blas"),
    (KEYS, 1, (1023, 64), F32, F32, True, "blas"),
    (KEYS, 1, (2048, 64), F64, F64, True, "blas"),
    (KEYS, 1, (2048, 64), F32, F32, False, "blas"),
    # a second operand that is not a row-major weight read transposed
    (OTHER, 1, BIG, F32, F32, True, "blas"),
    (OTHER, 2, BIG, F32, F32, False, "blas"),
]


@pytest.mark.parametrize(
    ("weight", "rows", "shape", "dtype", "rows_dtype", "built", "route"),
    TABLE,
    ids=[
        f"{w.value}-{r}x{n}x{k}-{np.dtype(d).name}-{'built' if b else 'none'}"
        for w, r, (n, k), d, _, b, _ in TABLE
    ],
)
def test_route_of_each_product(weight, rows, shape, dtype, rows_dtype, built, route):
    assert choose(weight, rows, *shape, np.dtype(dtype), np.dtype(rows_dtype), built) == route


# (route, rows, weight dtype): the routes whose float64 check is here
ROUTES = [
    (Route.ROW_DOTS, 1, "float32"),
    (Route.ROW_DOTS, 1, "float64"),
    *[(Route.FEW_ROWS, rows, "float32") for rows in (2, 5, 8, 9, 16)],  # fetched up to 8
    (Route.WIDENED, 129, "float16"),
    (Route.BLAS, 3, "float32"),
]


@pytest.mark.parametrize(("route", "rows", "dtype"), ROUTES)
def test_route_is_the_float64_product_within_float32_rounding(route, rows, dtype):
    """``x [rows, 333] @ W^T``, ``W [1000, 333]`` (FEW_ROWS: several blocks of W's rows)."""
    w = rand(1000, 333, seed=21).astype(dtype)
    x = rand(rows, 333, seed=22).astype(np.float64 if dtype == "float64" else np.float32)
    out = multiply(route, x, w)
    expected = x.astype(np.float64) @ w.astype(np.float64).T
    assert out.shape == (rows, 1000) and out.dtype == x.dtype
    assert (np.abs(out - expected) <= _float32_bound(x.astype(np.float32), w)).all()


def _spied_choices(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``"kind:route"`` of every choice a fast plan makes from here on, in order."""
    taken: list[str] = []
    run = products.choose

    def spy(weight: Weight, *args: object) -> Route | None:
        route = run(weight, *args)
        taken.append(f"{weight.value}:{route.value if route else None}")
        return route

    monkeypatch.setattr(products, "choose", spy)
    return taken


@pytest.mark.parametrize(
    ("rows", "choices"),
    [
        (1, ["stacked:native"] * 3),
        (8, ["stacked:native"] * 3),
        (9, ["stacked:None", "stored:panels"] * 3),
        (129, ["stacked:None", "stored:blas"] * 3),
    ],
)
def test_fast_plan_products_take_the_route_choose_gives(rows, choices, monkeypatch):
    """Q, K and V products of one input ``x [rows, 320]`` (float32 weights ``[640, 320]``,
    ``[256, 320]`` x 2) ask :func:`choose` each: stacked (one NATIVE call for the three) up to
    8 rows; beyond, each its own STORED route (PANELS, then BLAS)."""
    require_compiled_helper()
    net = Net()
    x = net.input("x", "float32", (-1, 320))
    for name, n, seed in (("q", 640, 30), ("k", 256, 31), ("v", 256, 32)):
        w = net.const(rand(n, 320, seed=seed))
        product = net.network.add_matrix_multiply(
            x, trt.MatrixOperation.NONE, w, trt.MatrixOperation.TRANSPOSE
        )
        net.mark(product.get_output(0), name)
    plan = compile_network(net.network)
    taken = _spied_choices(monkeypatch)
    plan.run({"x": rand(rows, 320, seed=33)})
    assert taken == choices
