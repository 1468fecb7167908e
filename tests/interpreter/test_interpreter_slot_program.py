"""The fast plan's step entries (:class:`trt_kv.interpreter.program.SlotProgram`): a layer
reading one tensor, one reading three (the same one twice), one writing two; against NumPy
and the plain plan."""

from __future__ import annotations

import numpy as np

from tests.support.interpreter_support import Net, rand
from trt_kv._trt import trt
from trt_kv.interpreter import compile_network


def test_steps_of_one_several_inputs_and_two_outputs_run_as_numpy() -> None:
    net = Net()
    x, y = net.input("x", "float32", (2, 5)), net.input("y", "float32", (2, 3))
    doubled = net.network.add_elementwise(x, x, trt.ElementWiseOperation.SUM).get_output(0)
    joined = net.network.add_concatenation([doubled, y, doubled])  # [2, 13]: three inputs
    joined.axis = 1
    negated = net.network.add_unary(joined.get_output(0), trt.UnaryOperation.NEG)  # one input
    top = net.network.add_topk(negated.get_output(0), trt.TopKOperation.MAX, 4, 1 << 1)
    net.mark(top.get_output(0), "values")
    net.mark(top.get_output(1), "indices")
    feed = {"x": rand(2, 5, seed=1), "y": rand(2, 3, seed=2)}
    net.build(feed)
    expected = -np.concatenate([2 * feed["x"], feed["y"], 2 * feed["x"]], axis=1)
    order = np.argsort(-expected, axis=1, kind="stable")[:, :4]
    for fast in (True, False):
        out = compile_network(net.network, fast=fast).run(feed)
        np.testing.assert_array_equal(out["values"], np.take_along_axis(expected, order, 1))
        np.testing.assert_array_equal(
            np.take_along_axis(expected, out["indices"].astype(np.int64), 1), out["values"]
        )
