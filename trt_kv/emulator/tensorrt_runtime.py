"""Emulated TensorRT runtime: ``Runtime``, ``ICudaEngine``, ``IRuntimeConfig``,
``IRuntimeCache`` (the
``EngineInspector`` is in :mod:`.tensorrt_inspector`).

Installed in place of the TensorRT module's classes of the same names (``trt.Runtime`` is
what ``trt_kv`` and Polygraphy construct; ``isinstance(x, trt.ICudaEngine)`` is how
Polygraphy's ``TrtRunner`` tells an engine from a context), so the code under test runs
unchanged. Only what trt_kv and ``TrtRunner`` call is provided, each with the name and the
signature of the installed TensorRT (checked by ``tests/emulator/test_emulator_conformance.py``).

Errors are reported as TensorRT reports them: a ``False``/``None`` return and a message on the
runtime's logger (``ILogger.Severity.ERROR``), never an exception.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from trt_kv._trt import FEATURES, trt
from trt_kv.emulator.device import device
from trt_kv.emulator.engines import EngineRecord, install_hooks, lookup, targets_of
from trt_kv.emulator.memory import EmulatorError
from trt_kv.emulator.tensorrt_log import log_error

# What TensorRT-RTX 1.7.1 did on a real NVIDIA H200 (compute capability 9.0, 2026-11-25,
# docs/gpu-results.md) with a portable engine: "IRuntime::deserializeCudaEngine: Error Code
# 6: API Usage Error (The engine cannot run on this GPU, which has compute capability 9.0.
# Supported compute capabilities: 8.0 8.6 8.9 12.0 12.1 >12.0. TensorRT-RTX does not
# support this compute capability, so the engine cannot be rebuilt for it. ...)".
# Written here, not read from trt_kv/gpu_targets.py on purpose: the stand-in behaves as the
# real runtime did, so that the product's own table is checked against it, not against itself.
RTX_PORTABLE = ((8, 0), (8, 6), (8, 9), (12, 0), (12, 1))  # and every capability > 12.0
FULL_TRT_FROM = (7, 5)  # full TensorRT 10.x/11.x: Turing and later
# A TensorRT-RTX engine starts with b"vtrt" and holds its own length, a little-endian
# 64-bit integer at byte 16 (read from TensorRT-RTX 1.7.1 engines built here).
ENGINE_MAGIC, LENGTH_AT = b"vtrt", 16


def malformed(data: bytes) -> str | None:
    """Why ``data`` is no whole TensorRT-RTX engine (another magic, a length that is not
    its own: truncated or extended bytes); None when the header agrees."""
    if not FEATURES.is_rtx:
        return None
    if data[:4] != ENGINE_MAGIC or len(data) < LENGTH_AT + 8:
        return f"expected an engine starting {ENGINE_MAGIC!r}, got {data[:4]!r}"
    (length,) = struct.unpack_from("<Q", data, LENGTH_AT)
    if length != len(data):
        return f"expected {length} bytes (the engine's header), got {len(data)}"
    return None


def cc_refusal(data: bytes) -> str | None:
    """TensorRT-RTX's message when the engine cannot run on the emulated device's compute
    capability (portable engines: :data:`RTX_PORTABLE` and above 12.0; engines built for
    explicit targets: those); None when it can (full TensorRT: 7.5 and later)."""
    cc = device().compute_capability
    targets = targets_of(data)
    if not FEATURES.is_rtx:
        runs, listed = cc >= FULL_TRT_FROM, "7.5 and later"
    elif targets:
        runs, listed = cc in targets, " ".join(f"{a}.{b}" for a, b in targets)
    else:
        runs = cc in RTX_PORTABLE or cc > (12, 0)
        listed = " ".join(f"{a}.{b}" for a, b in RTX_PORTABLE) + " >12.0"
    if runs:
        return None
    return (
        "IRuntime::deserializeCudaEngine: Error Code 6: API Usage Error (The engine cannot "
        f"run on this GPU, which has compute capability {cc[0]}.{cc[1]}. Supported compute "
        f"capabilities: {listed}. TensorRT-RTX does not support this compute capability, so "
        "the engine cannot be rebuilt for it.)"
    )


class Runtime:
    """Stand-in for ``trt.Runtime``: deserializes engines the emulator can match."""

    def __init__(self, logger: object) -> None:
        self.logger = logger

    def get_engine_validity(self, buffer: object) -> tuple[object, int]:
        """``(EngineValidity, diagnostics)`` as TensorRT-RTX gives them: INVALID with
        ``MALFORMED_ENGINE`` for bytes that are no whole engine, with ``UNSUPPORTED_CC`` for
        an engine the device's compute capability cannot run; VALID otherwise."""
        data = bytes(buffer)
        flags = trt.EngineInvalidityDiagnostics
        if malformed(data):
            diagnostics = int(flags.MALFORMED_ENGINE)
        elif cc_refusal(data):
            diagnostics = int(flags.UNSUPPORTED_CC)
        else:
            return trt.EngineValidity.VALID, 0
        return trt.EngineValidity.INVALID, diagnostics

    def deserialize_cuda_engine(self, serialized_engine: object) -> ICudaEngine | None:
        """The emulated engine for these bytes, or None (and an error on the logger) for
        bytes that are no whole engine, an engine the device's compute capability cannot
        run (TensorRT-RTX's own message), or bytes the emulator knows no network for (see
        :mod:`trt_kv.emulator.engines`)."""
        data = bytes(serialized_engine)
        problem = malformed(data)
        if problem:
            log_error(self.logger, f"deserialize_cuda_engine: malformed engine: {problem}")
            return None
        refused = cc_refusal(data)
        if refused:
            log_error(self.logger, refused)
            return None
        try:
            record = lookup(data)
        except EmulatorError as err:
            log_error(self.logger, f"deserialize_cuda_engine: {err}")
            return None
        return ICudaEngine(record, self.logger)


class IRuntimeConfig:
    """Stand-in for TensorRT-RTX's ``IRuntimeConfig`` (what trt_kv sets: the CUDA-graph
    strategy, the runtime cache; the allocation strategy for completeness)."""

    def __init__(self) -> None:
        self.cuda_graph_strategy = trt.CudaGraphStrategy.DISABLED
        self._allocation = trt.ExecutionContextAllocationStrategy.STATIC
        self._cache: IRuntimeCache | None = None

    def set_execution_context_allocation_strategy(self, strategy: object) -> None:
        self._allocation = strategy

    def get_execution_context_allocation_strategy(self) -> object:
        return self._allocation

    def create_runtime_cache(self) -> IRuntimeCache:
        return IRuntimeCache()

    def set_runtime_cache(self, cache: object = None) -> bool:
        """Attach ``cache`` (None detaches); False for an object that is no runtime cache."""
        if cache is not None and not isinstance(cache, IRuntimeCache):
            return False
        self._cache = cache
        return True

    def get_runtime_cache(self) -> IRuntimeCache | None:
        return self._cache


class IRuntimeCache:
    """Stand-in for TensorRT-RTX's ``IRuntimeCache``: the kernels its just-in-time compiler
    built. Nothing is compiled on the emulated device, so an entry stands for "the kernels of
    the engine with this sha256", added when a context is created with a config holding the
    cache (the real compiler works per kernel and shape, later). ``serialize`` gives a blob
    with this emulator's header; ``deserialize`` loads only such a blob (False and the cache
    unchanged otherwise: TensorRT-RTX refuses a corrupt blob or one from another environment
    the same way)."""

    _MAGIC = b"trt_kv emulated TensorRT-RTX runtime cache v1\n"

    def __init__(self) -> None:
        self._entries: set[str] = set()

    def serialize(self) -> memoryview:
        return memoryview(self._MAGIC + "\n".join(sorted(self._entries)).encode())

    def deserialize(self, blob: object) -> bool:
        data = bytes(blob)
        if not data.startswith(self._MAGIC):
            return False
        body = data[len(self._MAGIC) :].decode(errors="replace")
        entries = set(body.split("\n")) - {""}
        if not all(len(e) == 64 and all(c in "0123456789abcdef" for c in e) for e in entries):
            return False
        self._entries |= entries
        return True

    def reset(self) -> bool:
        self._entries.clear()
        return True

    def _compile(self, engine_sha256: str) -> None:
        """What a context of this engine adds: its kernels."""
        self._entries.add(engine_sha256)


class ICudaEngine:
    """Stand-in for ``trt.ICudaEngine``: I/O and profile queries answered from the network
    the engine was built from."""

    def __init__(self, record: EngineRecord, logger: object) -> None:
        self._record = record
        self._logger = logger
        self.name = f"emulated-{record.sha256[:12]}"
        self.num_layers = record.num_layers
        self.profiling_verbosity = record.profiling_verbosity
        self.num_aux_streams = 0
        self.device_memory_size_v2 = 0
        self.streamable_weights_size = 0
        self.weight_streaming_budget_v2 = 0

    # -- I/O tensors ---------------------------------------------------------------------
    @property
    def num_io_tensors(self) -> int:
        return len(self._record.tensors)

    def get_tensor_name(self, index: int) -> str:
        return self._record.tensors[index].name

    def get_tensor_mode(self, name: str) -> object:
        # "kINPUT if tensorName is an input, kOUTPUT if tensorName is an output, or kNONE if
        # neither." (ICudaEngine::getTensorIOMode)
        t = self._record.tensor(name)
        if t is None:
            return trt.TensorIOMode.NONE
        return trt.TensorIOMode.INPUT if t.is_input else trt.TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str) -> object:
        t = self._record.tensor(name)
        return trt.DataType.FLOAT if t is None else t.trt_dtype

    def get_tensor_shape(self, name: str) -> object:
        t = self._record.tensor(name)
        return trt.Dims([-1]) if t is None else trt.Dims(list(t.shape))

    def get_tensor_format(self, name: str, profile_index: int | None = None) -> object:
        return trt.TensorFormat.LINEAR

    def get_tensor_location(self, name: str) -> object:
        return trt.TensorLocation.DEVICE

    def is_shape_inference_io(self, name: str) -> bool:
        return False

    def get_aliased_input_tensor(self, name: str) -> str | None:
        # "the name of the input tensor to alias with, or nullptr if tensorName is not an
        # output tensor or the output does not alias with any input."
        # (ICudaEngine::getAliasedInputTensor)
        return self._record.aliases.get(name)

    # -- optimization profiles -------------------------------------------------------------
    @property
    def num_optimization_profiles(self) -> int:
        # "Number of optimization profiles. It is always at least 1."
        # (ICudaEngine::getNbOptimizationProfiles)
        return len(self._record.profiles)

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[object]:
        """``[min, opt, max]`` Dims of input ``name`` in profile ``profile_index``."""
        # "If the profileIndex is invalid or provided name does not map to an input tensor,
        # return Dims{-1, {}}" (ICudaEngine::getProfileShape)
        t = self._record.tensor(name)
        if t is None or not t.is_input or not 0 <= profile_index < self.num_optimization_profiles:
            return [trt.Dims([-1])] * 3
        return [trt.Dims(list(s)) for s in self._record.profiles[profile_index][name]]

    def get_device_memory_size_for_profile_v2(self, profile_index: int) -> int:
        return 0

    # -- the engine inspector ------------------------------------------------------------------
    def create_engine_inspector(self) -> object:
        """An ``EngineInspector`` over this engine's layers (the network's, unfused: see
        :mod:`trt_kv.emulator.tensorrt_inspector` for what it cannot know)."""
        from trt_kv.emulator.tensorrt_inspector import EngineInspector

        return EngineInspector(self, self._record.layers, self._logger)

    # -- contexts ----------------------------------------------------------------------------
    def create_runtime_config(self) -> IRuntimeConfig:
        return IRuntimeConfig()

    def create_execution_context(self, config: object = None) -> object:
        """A new context on profile 0: "The newly created execution context will be
        assigned optimization profile 0." (ICudaEngine::createExecutionContext). ``config``:
        an allocation strategy or an ``IRuntimeConfig`` (TensorRT-RTX)."""
        from trt_kv.emulator.tensorrt_context import IExecutionContext

        runtime_config = config if isinstance(config, IRuntimeConfig) else None
        if runtime_config is not None and runtime_config.get_runtime_cache() is not None:
            runtime_config.get_runtime_cache()._compile(self._record.sha256)
        return IExecutionContext(self, self._record, self._logger, runtime_config)


# Names of the TensorRT module replaced while the emulator is installed.
STAND_INS = (
    "Runtime",
    "ICudaEngine",
    "IExecutionContext",
    "IRuntimeConfig",
    "IRuntimeCache",
    "EngineInspector",
)


def install() -> Callable[[], None]:
    """Replace the TensorRT runtime classes with the emulated ones and start recording
    engines built and sidecars read; returns the function that undoes both."""
    from trt_kv.emulator import tensorrt_context, tensorrt_inspector

    ours = {
        "Runtime": Runtime,
        "ICudaEngine": ICudaEngine,
        "IExecutionContext": tensorrt_context.IExecutionContext,
        "IRuntimeConfig": IRuntimeConfig,
        "EngineInspector": tensorrt_inspector.EngineInspector,
    }
    saved = {name: getattr(trt, name) for name in STAND_INS if hasattr(trt, name)}
    for name, cls in ours.items():
        setattr(trt, name, cls)
    undo_hooks = install_hooks()

    def undo() -> None:
        undo_hooks()
        for name in STAND_INS:
            if name in saved:
                setattr(trt, name, saved[name])
            else:
                delattr(trt, name)

    return undo
