"""Fast path: trt_kv's own TensorRT bindings on device caches (GPU only).

Each cache input and its aliased output are bound to the same device address (the slot
window of :class:`DeviceCaches`); step inputs go through one pinned staging buffer and one
upload a step (:class:`~trt_kv.runtime.gpu.staging.StepInputs`). Bindings (profile, shapes,
addresses) are set only when the binding state (window start ``lo``, batch B, step width S)
changes: a step in an unchanged state makes no TensorRT set-call. Every TensorRT call that
can refuse (``set_optimization_profile_async``, ``set_input_shape``, ``set_tensor_address``,
``execute_async_v3``) is checked; a refusal raises :class:`~trt_kv.errors.EngineRunError`
naming the call (details in the TensorRT log).

Decode steps (S = 1) can replay a CUDA graph, two ways (``cuda_graph=``):

- ``"runtime"`` (TensorRT-RTX's default): the runtime captures and replays whole graphs itself
  (``IRuntimeConfig.cuda_graph_strategy = WHOLE_GRAPH_CAPTURE``); the config is kept alive as
  long as its context.
- ``"manual"`` (full TensorRT's default): trt_kv captures a decode step once per binding
  state (profile, window start ``lo``, batch B) and output (logits or next-token candidates)
  after one ordinary step of that state: the upload of the step inputs from the pinned
  staging buffer, ``execute_async_v3`` and the download of the output into pinned memory.
  It replays it only when the step before ran the same state: the inputs are written into the
  pinned buffer (no CUDA call), one ``cudaGraphLaunch``, one ``cudaStreamSynchronize``. After
  a step of other shapes it runs an ordinary step first (TensorRT redoes shape-dependent
  set-up in the first enqueue after a shape change, which a replay would skip); a window
  change is a new binding state, captured anew. Graphs, graph executables and the stream are
  destroyed by :meth:`close` (or on collection). At most :data:`MAX_GRAPHS` graphs are kept,
  least recently used evicted (and destroyed) first; a state whose graph was evicted is
  captured again. On TensorRT-RTX user capture may need engines built with
  ``kREQUIRE_USER_ALLOCATION``.

Without trt_kv's graph a step's result comes down in one ``cudaMemcpyAsync`` on the backend's
stream followed by one ``cudaStreamSynchronize``: the logits ``[B, V]`` (:meth:`run`) or,
for an engine built with ``device_top_k``, only the candidates (:meth:`run_top_k`: ``[B]``
int32 for greedy). Not one synchronous ``cudaMemcpy``: it runs on the default stream, which
is ordered after trt_kv's (blocking) stream only under the legacy default-stream semantics,
and cuda-python switches to per-thread default streams with
``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1`` (CUDA's "Stream synchronization behavior": a
per-thread default stream does not synchronize with other streams), where the copy could read
the ids before the step wrote them; and under the legacy semantics it would wait for, and
hold up, every other blocking stream of the process.

``runtime_cache=PATH`` (TensorRT-RTX): the just-in-time compiler's kernels are loaded from
``PATH`` when it holds a cache TensorRT-RTX accepts, and saved there by :meth:`close`
(:mod:`trt_kv.runtime.gpu.runtime_cache`).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from pathlib import Path
from typing import Literal

import numpy as np

from trt_kv._trt import trt
from trt_kv.contract import TOP_LOGITS
from trt_kv.errors import ArgumentError, EngineRunError, mismatch
from trt_kv.runtime.backend import (
    Candidates,
    StepProfiles,
    check_open,
    check_top_k,
    last_token_logits,
    one_thread,
    plan_profile,
    step_feed,
    step_shapes,
    take_roles,
    top_k_candidates,
)
from trt_kv.runtime.cache_state import StepPlan
from trt_kv.runtime.embedding import EmbedFn, step_embedder
from trt_kv.runtime.gpu.cuda import DeviceBuffer, PinnedBuffer, check, create_stream, synchronize
from trt_kv.runtime.gpu.device import ALIGNMENT, DeviceCaches
from trt_kv.runtime.gpu.engine_loader import open_decoder_engine
from trt_kv.runtime.gpu.runtime_cache import RuntimeCacheFile, check_runtime_cache_path
from trt_kv.runtime.gpu.staging import StepInputs, step_input_bytes

GraphMode = Literal["runtime", "manual"]
# Captured decode graphs kept by one backend (manual capture): one per binding state
# (profile, window start, batch) in use, e.g. a serving loop's few batch sizes and windows.
MAX_GRAPHS = 8


def _graph_mode(cuda_graph: bool | str) -> GraphMode | None:
    from trt_kv._trt import FEATURES

    if cuda_graph is True:
        return "runtime" if FEATURES.is_rtx else "manual"
    if cuda_graph is False:
        return None
    if cuda_graph == "runtime" and not FEATURES.is_rtx:
        raise ArgumentError(mismatch("cuda_graph", "'manual' with full TensorRT", "", "runtime"))
    if cuda_graph not in ("runtime", "manual"):
        raise ArgumentError(
            mismatch("cuda_graph", "one of", (True, False, "runtime", "manual"), cuda_graph)
        )
    return cuda_graph


class TrtBackend:
    """Runs a trt_kv engine file with trt_kv's own bindings."""

    name = "tensorrt"

    def __init__(
        self,
        engine_path: str | Path,
        *,
        capacity: int | None = None,
        cuda_graph: bool | GraphMode = False,
        runtime_cache: str | Path | None = None,
        rebind_every_step: bool = False,
        embed: EmbedFn | None = None,
    ) -> None:
        """``embed``: ids ``[B, S]`` -> the ``[B, S, D]`` input of an engine whose token role
        is ``embeddings`` (:mod:`trt_kv.runtime.embedding`); ArgumentError when it is missing
        for one, or given for an engine of token ids (before any buffer is allocated)."""
        self.graph_mode = _graph_mode(cuda_graph)
        # True: set the profile, every shape and address at every step, as trt_kv did before
        # it bound once; kept for scripts/bench_host.py's comparison, not for use.
        self.rebind_every_step = rebind_every_step
        cache_path = None if runtime_cache is None else check_runtime_cache_path(runtime_cache)
        self.closed = False
        self._cuda = _rt()  # the CUDA runtime module these handles belong to, for close()
        loaded = open_decoder_engine(engine_path, capacity)
        self.engine, self.meta, capacity = loaded.engine, loaded.meta, loaded.capacity
        take_roles(self, loaded.roles)
        self.embed = step_embedder(self.roles, embed)
        self.runtime_config = None  # outlives the context that uses it
        self.runtime_cache: RuntimeCacheFile | None = None
        if self.graph_mode == "runtime" or cache_path is not None:
            self.runtime_config = self.engine.create_runtime_config()
            if self.graph_mode == "runtime":
                strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
                self.runtime_config.cuda_graph_strategy = strategy
            if cache_path is not None:
                self.runtime_cache = RuntimeCacheFile(cache_path, self.runtime_config)
            self.context = self.engine.create_execution_context(self.runtime_config)
        else:
            self.context = self.engine.create_execution_context()
        # (binding state, output) -> (graph, executable), least recently used first
        self._graphs: OrderedDict[tuple, tuple[object, object]] = OrderedDict()
        self._last_key: tuple | None = None  # (binding state, output) of the previous step
        self._bound: tuple | None = None  # (lo, B, S) the context's bindings are set for
        self._logits_shape: tuple[int, ...] = ()
        self.storage = DeviceCaches(self.meta.aliases, capacity)
        self.step_profile = StepProfiles(self.meta.profiles, self.roles, self.storage)
        self.stream = create_stream()
        self.staging = StepInputs(step_input_bytes(self.roles, capacity))
        rows = capacity * (self.max_step_tokens if self.roles.all_logits else 1)
        self.logits = DeviceBuffer(rows * self.vocab_size * 4, self.roles.logits)
        # the sampling outputs (device_top_k >= 1), packed so that one copy downloads them
        self.candidates = DeviceBuffer(max(self._candidate_bytes(capacity), 1), "candidates")
        # where a captured decode step's download lands (a graph's copies need pinned memory)
        self.outputs_host = None
        if self.graph_mode == "manual":
            most = max(capacity * self.vocab_size * 4, self._candidate_bytes(capacity))
            self.outputs_host = PinnedBuffer(most, "captured step outputs")

    def _candidate_offsets(self, batch: int) -> dict[str, int]:
        """Byte offset of each sampling output (4-byte elements ``[B, k]``) in
        ``self.candidates``: the second (``top_logits``) at the first aligned one after
        ``top_ids``."""
        step = -(-batch * self.device_top_k * 4 // ALIGNMENT) * ALIGNMENT
        return {name: i * step for i, name in enumerate(self.roles.sampling_outputs())}

    def _candidate_bytes(self, batch: int) -> int:
        """Bytes of the packed sampling outputs of a batch, gaps included."""
        offsets = self._candidate_offsets(batch)
        return max(offsets.values()) + batch * self.device_top_k * 4 if offsets else 0

    def memory(self) -> dict[str, int]:
        """Bytes of each cache buffer."""
        return self.storage.nbytes()

    def _call(self, ok: bool, call: str, *detail: object) -> None:
        if not ok:
            raise EngineRunError(
                f"{call}({', '.join(map(str, detail))}): TensorRT refused (see its log)"
            )

    def _bind(self, plan: StepPlan, feed: dict[str, np.ndarray]) -> tuple:
        """Bind ``plan``'s step where the binding state changed; returns the state
        ``(profile, lo, B, S)``."""
        key = (plan.lo, *plan.input_ids.shape)
        if key != self._bound or self.rebind_every_step:
            self._bound = None  # until every call below succeeded
            self._state = self._bind_all(plan, feed)
            self._logits_shape = tuple(self.context.get_tensor_shape(self.roles.logits))
            self._bound = key
        return self._state

    def _bind_all(self, plan: StepPlan, feed: dict[str, np.ndarray]) -> tuple:
        """Set the profile, every shape and address for ``plan``; returns the binding state."""
        ctx, b = self.context, len(plan.counts)
        shapes = step_shapes(plan, self.roles, self.storage)
        profile = self.step_profile(plan)  # ShapeError: none holds them
        if profile != ctx.active_optimization_profile:
            ok = ctx.set_optimization_profile_async(profile, self.stream)
            self._call(ok, "set_optimization_profile_async", profile)
        for name, shape in shapes.items():
            self._call(ctx.set_input_shape(name, shape), "set_input_shape", name, shape)
        for name, ptr in self.staging.arrange(feed).items():
            self._call(ctx.set_tensor_address(name, ptr), "set_tensor_address", name, ptr)
        for alias in self.meta.aliases:
            address = self.storage.address(alias.input, plan.lo)
            for name in (alias.input, alias.output):
                ok = ctx.set_tensor_address(name, address)
                self._call(ok, "set_tensor_address", name, hex(address))
        outputs = {self.roles.logits: self.logits.address()}
        for name, offset in self._candidate_offsets(b).items():
            outputs[name] = self.candidates.address(offset)
        for name, address in outputs.items():
            self._call(
                ctx.set_tensor_address(name, address), "set_tensor_address", name, hex(address)
            )
        return (profile, plan.lo, b, plan.input_ids.shape[1])

    def _execute(self) -> None:
        self._call(self.context.execute_async_v3(self.stream), "execute_async_v3")

    def _output(self, output: str, b: int) -> tuple[DeviceBuffer, tuple[int, ...], type]:
        """The device buffer, host shape and dtype of a step's ``output``: ``"logits"``
        (float32, the engine's shape) or ``"candidates"`` (the packed int32 words)."""
        if output == "logits":
            return self.logits, self._logits_shape, np.float32
        return self.candidates, (self._candidate_bytes(b) // 4,), np.int32

    def _step(self, plan: StepPlan, output: str) -> np.ndarray:
        """Run ``plan`` and download ``output`` (synchronized): bind where the state changed,
        upload the inputs, enqueue, download; a decode step with trt_kv's own capture is one
        graph launch holding all three."""
        feed = step_feed(plan, self.roles, self.embed)
        last, self._last_key = self._last_key, None  # set again only when this step succeeds
        state = self._bind(plan, feed)
        buffer, shape, dtype = self._output(output, len(plan.counts))
        if self.graph_mode == "manual" and state[3] == 1:
            return self._graph_step((state, output), last, feed, buffer, shape, dtype)
        self.staging.upload(feed, self.stream)
        self._execute()
        self._last_key = (state, output)
        return buffer.download(np.empty(shape, dtype), stream=self.stream)

    def _graph_step(
        self,
        key: tuple,
        last: tuple | None,
        feed: dict,
        buffer: DeviceBuffer,
        shape: tuple,
        dtype: type,
    ) -> np.ndarray:
        """A decode step with trt_kv's own capture. The same state and output as the step
        before: the inputs are written to pinned memory (no CUDA call), then one
        ``cudaGraphLaunch`` replays upload, enqueue and download, and one synchronize ends it.
        Otherwise: an ordinary step (TensorRT redoes shape-dependent set-up in the first
        enqueue after a change, which a replay would skip; it also serves as the warm-up
        TensorRT's trtexec does before capturing: "Avoid capturing initialization calls by
        executing the enqueue function at least once before starting CUDA graph capture."),
        then the capture of the state, if it has no graph yet."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if key in self._graphs and key == last:  # the step before ran this state, and ran
            self._graphs.move_to_end(key)
            self.staging.write(feed)
            check(self._cuda.cudaGraphLaunch(self._graphs[key][1], self.stream))
        else:
            self.staging.upload(feed, self.stream)
            self._execute()
            buffer.download_to(self.outputs_host, nbytes, self.stream)
            if key in self._graphs:
                self._graphs.move_to_end(key)
            else:
                self._capture(key, buffer, nbytes)  # synchronizes first: the step above ran
        synchronize(self.stream)
        self._last_key = key
        return self.outputs_host.view(0, dtype, shape).copy()

    def _capture(self, key: tuple, buffer: DeviceBuffer, nbytes: int) -> None:
        """Record one decode step of ``key`` into a graph (nothing runs): the inputs' upload
        from the pinned staging buffer, the enqueue, the download of ``nbytes`` of ``buffer``
        into pinned memory."""
        rt = self._cuda
        synchronize(self.stream)
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check(rt.cudaStreamBeginCapture(self.stream, mode))
        try:
            self.staging.copy(self.stream)
            ok = self.context.execute_async_v3(self.stream)
            buffer.download_to(self.outputs_host, nbytes, self.stream)
        except BaseException:
            err, graph = rt.cudaStreamEndCapture(self.stream)  # end it; the error is raised
            if graph is not None and err == rt.cudaError_t.cudaSuccess:
                rt.cudaGraphDestroy(graph)
            raise
        graph = check(rt.cudaStreamEndCapture(self.stream))
        try:
            if not ok:
                self._call(False, "execute_async_v3 (under stream capture)")
            graph_exec = check(rt.cudaGraphInstantiate(graph, 0))
        except BaseException:
            rt.cudaGraphDestroy(graph)  # nothing of a failed capture is kept
            raise
        if len(self._graphs) >= MAX_GRAPHS:  # evicted only once the new graph exists
            _destroy_graph(rt, *self._graphs.popitem(last=False)[1])
        self._graphs[key] = (graph, graph_exec)

    def check_plan(self, plan: StepPlan) -> int:
        """The profile that runs ``plan``; raises as :func:`plan_profile`, changes nothing."""
        return plan_profile(self, plan)

    @one_thread
    def run(self, plan: StepPlan) -> np.ndarray:
        check_open("TrtBackend", self.closed)
        return last_token_logits(self._step(plan, "logits"), plan)

    @one_thread
    def run_top_k(self, plan: StepPlan) -> Candidates:
        """:meth:`run`'s step, downloading only the network's next-token candidates (one
        copy that synchronizes: ``[B]`` int32 for greedy, ``[B, k]`` ids and logits)."""
        check_open("TrtBackend", self.closed)
        check_top_k(self.roles)  # ArgumentError: no candidates (nothing has run)
        words = self._step(plan, "candidates")
        b, k = len(plan.counts), self.device_top_k
        outputs = {
            name: words[offset // 4 : offset // 4 + b * k]
            for name, offset in self._candidate_offsets(b).items()
        }
        if k > 1:
            outputs[TOP_LOGITS] = outputs[TOP_LOGITS].view(np.float32)
        return top_k_candidates(outputs, self.roles)

    @one_thread
    def close(self) -> None:
        """Release what the backend holds, in order (idempotent): wait for the stream's
        work, save the runtime cache (``runtime_cache=``), destroy the captured graphs,
        their executables and the stream, free the caches and step buffers, and drop the
        execution context before its runtime configuration and engine (TensorRT frees their
        device memory with them). Any later step raises :class:`ClosedError`; so does the
        session's cache access (the caches are gone).

        Raises:
            ConcurrentUseError: another thread is in a step (nothing is released).
        """
        self._close()

    def _close(self) -> None:
        self.closed = True
        stream, self.stream = getattr(self, "stream", None), None
        if stream is not None:
            with contextlib.suppress(Exception):  # a failed step's error was raised already
                synchronize(stream)
        cache, self.runtime_cache = getattr(self, "runtime_cache", None), None
        try:
            if cache is not None:
                cache.save()
        finally:
            self._release(stream)

    def _release(self, stream: int | None) -> None:
        rt = getattr(self, "_cuda", None)
        graphs, self._graphs = getattr(self, "_graphs", {}), OrderedDict()
        for graph, graph_exec in graphs.values():
            _destroy_graph(rt, graph, graph_exec)
        if stream is not None:
            rt.cudaStreamDestroy(stream)
        buffers = ("staging", "logits", "candidates", "outputs_host")
        for buffer in (getattr(self, name, None) for name in buffers):
            if buffer is not None:
                buffer.free()
        if getattr(self, "storage", None) is not None:
            self.storage.free()
        self.context = self.runtime_config = self.engine = None  # in this order

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: CUDA may be gone
            self._close()  # unreferenced: no thread can be in a step


def _destroy_graph(rt: object, graph: object, graph_exec: object) -> None:
    rt.cudaGraphExecDestroy(graph_exec)
    rt.cudaGraphDestroy(graph)


def _rt() -> object:
    from cuda.bindings import runtime as rt

    return rt
