"""Fast path: trt_kv's own TensorRT bindings on device caches (GPU only).

Each cache input and its aliased output are bound to the same device address (the slot
window of :class:`DeviceCaches`); step inputs go through preallocated device buffers.
Decode steps can replay a CUDA graph: TensorRT-RTX captures whole graphs itself
(``IRuntimeConfig.cuda_graph_strategy``); with TensorRT, trt_kv captures ``execute_async_v3``
once per (window, batch) and replays it, which is valid because every address is fixed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_kv._trt import FEATURES, trt
from trt_kv.models.llama.network import LOGITS
from trt_kv.runtime.backend import last_token_logits, step_feed
from trt_kv.runtime.cache_state import StepPlan
from trt_kv.runtime.cuda import DeviceBuffer, check, create_stream, synchronize
from trt_kv.runtime.device import DeviceCaches
from trt_kv.runtime.engine_loader import load_cuda_engine


class TrtBackend:
    """Runs a trt_kv engine file with trt_kv's own bindings."""

    name = "tensorrt"

    def __init__(
        self, engine_path: str | Path, *, capacity: int | None = None, cuda_graph: bool = False
    ) -> None:
        self.engine, _, self.meta = load_cuda_engine(engine_path)
        md = self.meta.metadata
        self.max_step_tokens = md["max_step_tokens"]
        self.vocab_size = md["config"]["vocab_size"]
        capacity = capacity or md["max_batch"]
        self.context = self._context(cuda_graph and FEATURES.is_rtx)
        self.manual_graphs = cuda_graph and not FEATURES.is_rtx
        self._graphs: dict[tuple[int, int], object] = {}
        self.storage = DeviceCaches(self.meta.aliases, capacity)
        self.stream = create_stream()
        self.inputs = frozenset(t.name for t in self.meta.inputs)
        most = capacity * self.max_step_tokens * 8  # int64 [B, S] is the largest step input
        self.buffers = {
            name: DeviceBuffer(most)
            for name in self.inputs
            if name not in {a.input for a in self.meta.aliases}
        }
        rows = capacity * (self.max_step_tokens if md.get("all_logits") else 1)
        self.logits = DeviceBuffer(rows * self.vocab_size * 4)

    def _context(self, rtx_graphs: bool) -> object:
        if not rtx_graphs:
            return self.engine.create_execution_context()
        config = self.engine.create_runtime_config()
        config.cuda_graph_strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
        return self.engine.create_execution_context(config)

    def memory(self) -> dict[str, int]:
        """Bytes of each cache buffer."""
        return self.storage.nbytes()

    def _bind(self, plan: StepPlan) -> None:
        ctx, b = self.context, len(plan.counts)
        for name, host in step_feed(plan, self.inputs).items():
            self.buffers[name].upload(host, stream=self.stream)
            ctx.set_input_shape(name, host.shape)
            ctx.set_tensor_address(name, self.buffers[name].ptr)
        for alias in self.meta.aliases:
            address = self.storage.address(alias.input, plan.lo)
            ctx.set_input_shape(alias.input, (b, *self.storage.slot_shape))
            ctx.set_tensor_address(alias.input, address)
            ctx.set_tensor_address(alias.output, address)
        ctx.set_tensor_address(LOGITS, self.logits.ptr)

    def _enqueue(self, plan: StepPlan) -> None:
        if not self.manual_graphs or plan.input_ids.shape[1] != 1:
            if not self.context.execute_async_v3(self.stream):
                raise RuntimeError("execute_async_v3 failed (see the TensorRT log)")
            return
        from cuda.bindings import runtime as rt

        key = (plan.lo, len(plan.counts))
        if key not in self._graphs:
            self.context.execute_async_v3(self.stream)  # warm-up: lazy allocations happen here
            synchronize(self.stream)
            mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
            check(rt.cudaStreamBeginCapture(self.stream, mode))
            self.context.execute_async_v3(self.stream)
            graph = check(rt.cudaStreamEndCapture(self.stream))
            self._graphs[key] = check(rt.cudaGraphInstantiate(graph, 0))
        check(rt.cudaGraphLaunch(self._graphs[key], self.stream))

    def run(self, plan: StepPlan) -> np.ndarray:
        self._bind(plan)
        self._enqueue(plan)
        shape = tuple(self.context.get_tensor_shape(LOGITS))
        host = self.logits.download(np.empty(shape, np.float32), stream=self.stream)
        return last_token_logits(host, plan)
