"""Helpers shared by the interpreter tests; this file holds no tests.

:class:`Net` wraps the real TensorRT-RTX builder: add inputs and constants, mark outputs, then
``run(feed)`` builds the engine (proof that TensorRT accepts the network) and executes the
network with the interpreter. Expected values in the tests are plain NumPy expressions.
"""

from __future__ import annotations

import numpy as np

from trt_kv import dtypes
from trt_kv._trt import trt
from trt_kv.builder import Profile, build_engine, create_network
from trt_kv.interpreter import execute


class Net:
    """A strongly typed network under construction, and the arrays its constants point at."""

    def __init__(self) -> None:
        self.builder, self.network = create_network()
        self._keep: list[np.ndarray] = []

    def input(self, name: str, dtype: str, shape: tuple[int, ...]) -> object:
        return self.network.add_input(name, dtypes.to_trt(dtype), shape)

    def const(self, value: object, dtype: str | None = None) -> object:
        """A constant tensor; ``dtype`` defaults to the array's own (bfloat16 included)."""
        a = np.asarray(value)
        a = np.array(a, dtype=dtypes.to_numpy(dtype) if dtype else a.dtype, order="C")
        self._keep.append(a)  # TensorRT reads these bytes at build time
        w = trt.Weights(dtypes.to_trt(a.dtype), a.ctypes.data, a.size)
        return self.network.add_constant(a.shape, w).get_output(0)

    def mark(self, tensor: object, name: str = "out") -> object:
        tensor.name = name
        self.network.mark_output(tensor)
        return tensor

    def build(self, feed: dict[str, np.ndarray]) -> None:
        """Build the engine, with a one-point profile at the feed's shapes."""
        shapes = {}
        for i in range(self.network.num_inputs):
            t = self.network.get_input(i)
            if -1 in tuple(t.shape):
                s = feed[t.name].shape
                shapes[t.name] = (s, s, s)
        build_engine(self.builder, self.network, [Profile("test", shapes)] if shapes else [])

    def run(
        self, feed: dict[str, np.ndarray], *, precision: str = "float32", build: bool = True
    ) -> dict[str, np.ndarray]:
        if build:
            self.build(feed)
        return execute(self.network, feed, precision=precision)


def rand(*shape: int, seed: int = 0, dtype: str = "float32") -> np.ndarray:
    """Standard normal values of ``dtype``."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtypes.to_numpy(dtype))
