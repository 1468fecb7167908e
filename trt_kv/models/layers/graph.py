"""A thin layer-adding helper the decoder's block functions share (one call per layer)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np

from trt_kv import contract, dtypes
from trt_kv._trt import trt
from trt_kv.build_defaults import default_device_top_k
from trt_kv.contract import NEXT_TOKEN, TOP_IDS, TOP_LOGITS

TOP_K_MOST = 3840  # the largest static k of TensorRT's ITopKLayer

# network -> the arrays its constant layers point at. A constant layer holds only a pointer
# (``trt.Weights``): TensorRT reads the bytes when an engine is built, and the interpreter
# when it compiles the network, however long after. Held here, the arrays live exactly as long
# as the network's Python object, even when the caller keeps only ``LlamaNetwork.network``.
_HELD: weakref.WeakKeyDictionary[object, list[np.ndarray]] = weakref.WeakKeyDictionary()


@dataclass
class Graph:
    """What every block function needs: the network, the compute dtype, live weight arrays.

    ``keep`` holds every array a :meth:`const` layer points at, for as long as ``network``
    lives (it is also registered against the network object: see ``_HELD``)."""

    network: object
    dtype: str
    keep: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.keep = _HELD.setdefault(self.network, self.keep)

    def const(self, array: np.ndarray, dtype: str | None = None) -> object:
        """A constant tensor of ``array`` in ``dtype`` (default: the compute dtype)."""
        a = np.ascontiguousarray(array, dtype=dtypes.to_numpy(dtype or self.dtype))
        self.keep.append(a)  # TensorRT reads the bytes at build time
        w = trt.Weights(dtypes.to_trt(dtype or self.dtype), a.ctypes.data, a.size)
        return self.network.add_constant(a.shape, w).get_output(0)

    def eltwise(self, a: object, b: object, op: object) -> object:
        return self.network.add_elementwise(a, b, op).get_output(0)

    def mul(self, a: object, b: object) -> object:
        return self.eltwise(a, b, trt.ElementWiseOperation.PROD)

    def add(self, a: object, b: object) -> object:
        return self.eltwise(a, b, trt.ElementWiseOperation.SUM)

    def shuffle(
        self,
        x: object,
        reshape: tuple[int, ...],
        first: tuple[int, ...] | None = None,
        second: tuple[int, ...] | None = None,
    ) -> object:
        """Transpose ``first``, reshape (0 copies an input dim, -1 infers one), transpose
        ``second``."""
        layer = self.network.add_shuffle(x)
        if first is not None:
            layer.first_transpose = first
        layer.reshape_dims = reshape
        if second is not None:
            layer.second_transpose = second
        return layer.get_output(0)

    def cast(self, x: object, dtype: str) -> object:
        if dtypes.name_of(x.dtype) == dtype:
            return x
        return self.network.add_cast(x, dtypes.to_trt(dtype)).get_output(0)

    def gather(self, data: object, indices: object, axis: int) -> object:
        return self.network.add_gather(data, indices, axis).get_output(0)

    def matmul(self, a: object, b: object, transpose_b: bool = False) -> object:
        """``a @ b`` (or ``a @ b^T``); batch dimensions of size 1 broadcast."""
        op_b = trt.MatrixOperation.TRANSPOSE if transpose_b else trt.MatrixOperation.NONE
        return self.network.add_matrix_multiply(a, trt.MatrixOperation.NONE, b, op_b).get_output(0)

    def linear(self, x: object, w: object) -> object:
        """``x [.., In] @ w[Out, In]^T -> [.., Out]``; ``w`` a constant of matching rank, or
        a quantized weight (:class:`~trt_kv.quantization.network.QuantizedWeight`), which
        adds its own layers."""
        if hasattr(w, "apply"):
            return w.apply(self, x)
        return self.matmul(x, w, transpose_b=True)

    def logits(
        self, x: object, head: object, all_logits: bool, device_top_k: int | None = None
    ) -> object:
        """The decoder-contract logits output from the final hidden states ``x [B, S, D]``
        and the head constant ``[V, D]``: ``[B, S, V]`` with ``all_logits``, else ``[B, V]``
        of each sequence's last token (adding the ``last_token_rows [B]`` input that picks
        it from the flattened ``[B * S]`` rows); float32, named ``logits``, marked. ``head``
        may be a quantized weight (it multiplies inputs of any rank itself).

        ``device_top_k`` = k >= 1 adds the contract's sampling outputs after the logits (one
        ``ITopKLayer``, MAX over V): ``next_token [B]`` int32 for k = 1, else ``top_ids
        [B, k]`` int32 and ``top_logits [B, k]`` float32. None: the default
        (:func:`~trt_kv.build_defaults.default_device_top_k`: 1, or 0 with ``all_logits``).

        Raises:
            ArgumentError: ``device_top_k`` not an integer in ``[0, min(V, 3840)]``
                (3840: TensorRT's largest static k), or >= 1 with ``all_logits``.
        """
        quantized = hasattr(head, "apply")
        vocab, width = tuple(head.matrix.shape if quantized else head.shape)
        device_top_k = check_device_top_k(device_top_k, vocab, all_logits)
        if all_logits:
            weight = head if quantized else self.shuffle(head, (1, vocab, width))
            logits = self.linear(x, weight)  # [B, S, V]
        else:
            rows = self.network.add_input("last_token_rows", trt.int32, (-1,))
            flat = self.shuffle(x, (-1, width))  # [B * S, D]
            logits = self.linear(self.gather(flat, rows, 0), head)  # [B, D] -> [B, V]
        logits = self.cast(logits, "float32")
        logits.name = "logits"
        self.network.mark_output(logits)
        if device_top_k:
            self._top_k(logits, device_top_k)
        return logits

    def _top_k(self, logits: object, k: int) -> None:
        """The sampling outputs of :meth:`logits` from ``logits [B, V]``."""
        top = self.network.add_topk(logits, trt.TopKOperation.MAX, k, 1 << 1)
        values, ids = top.get_output(0), top.get_output(1)  # [B, k], best first
        if k == 1:
            ids = self.shuffle(ids, (-1,))  # [B]
            names = [(ids, NEXT_TOKEN)]
        else:
            names = [(ids, TOP_IDS), (values, TOP_LOGITS)]
        for tensor, name in names:
            tensor.name = name
            self.network.mark_output(tensor)


def check_device_top_k(k: object, vocab: int, all_logits: bool) -> int:
    """``k`` as a ``device_top_k`` (see :meth:`Graph.logits`; None: the default for
    ``all_logits``, :func:`trt_kv.build_defaults.default_device_top_k`): the contract's
    rule (:func:`trt_kv.contract.check_device_top_k`) within TensorRT's largest k. Raises
    ArgumentError."""
    if k is None:
        k = default_device_top_k(all_logits)
    return contract.check_device_top_k(k, vocab, all_logits, most=TOP_K_MOST)
