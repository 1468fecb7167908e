"""Emulated ``IExecutionContext``: strict bindings, then the network on the bound memory.

``execute_async_v3`` checks what TensorRT documents before it enqueues anything (each rule is
quoted where it is enforced, from ``NvInferRuntime.h`` / ``NvInfer.h`` of TensorRT 11), calls
the output allocators (before it returns, as TensorRT does), then submits one piece of stream
work: run the engine's network with :mod:`trt_kv.interpreter` on NumPy views of the bound
device memory, caches updated in place. That work is deferred like any stream work
(:mod:`.streams`): it reads its inputs when a synchronizing call runs it, not at the enqueue.
Under stream capture the work is recorded with the bindings of that moment and replayed by
``cudaGraphLaunch``, as a captured TensorRT enqueue replays its kernels with the pointers it
was captured with.

Output shapes follow from the input shapes, as TensorRT computes them: the emulator learns
them once per profile and input shapes by running the network on zeros of those shapes (a
network whose output shapes depend on input values is not emulated: refused at run time).

A broken rule gives ``False`` and an error on the logger, as TensorRT does.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from trt_kv._trt import trt
from trt_kv.emulator.counting import counted_methods
from trt_kv.emulator.cuda_runtime import submit
from trt_kv.emulator.device import device
from trt_kv.emulator.engines import EngineRecord, IOTensor, Shape
from trt_kv.emulator.memory import EmulatorError
from trt_kv.emulator.streams import Checked
from trt_kv.emulator.tensorrt_log import log_error
from trt_kv.errors import TrtKvError

ALIGNMENT = 256


class _Refused(Exception):
    """A documented rule the current bindings break (reported, never raised to the caller)."""


@dataclass(frozen=True)
class _Binding:
    """What one enqueue captured: each tensor's address and shape, each output's allocator."""

    inputs: tuple[tuple[IOTensor, int, Shape], ...]
    outputs: tuple[tuple[IOTensor, int, object], ...]  # (tensor, address or 0, allocator)
    aliased: frozenset[str]
    shapes: dict[str, Shape]  # every non-aliased output's shape at these input shapes


@counted_methods
class IExecutionContext:
    """Stand-in for ``trt.IExecutionContext`` of an emulated engine (its calls counted by
    :func:`trt_kv.emulator.counting`)."""

    def __init__(
        self, engine: object, record: EngineRecord, logger: object, runtime_config: object
    ) -> None:
        self.engine = engine
        self.name = ""
        self._record = record
        self._logger = logger
        # TensorRT-RTX's createExecutionContext(IRuntimeConfig*) takes a raw pointer and no
        # document says the context takes ownership: the emulator holds only a weak
        # reference, so a config freed while its context lives is caught at enqueue.
        self._config = None if runtime_config is None else weakref.ref(runtime_config)
        self._profile = 0
        self._shapes: dict[str, Shape] = {}
        self._addresses: dict[str, int] = {}
        self._allocators: dict[str, object] = {}
        self._output_shapes: dict[tuple, dict[str, Shape]] = {}  # _state() -> output shapes
        self._debug_listener = None
        self._enqueued: tuple | None = None  # _state() of the last enqueue (not captured)
        self._ran: tuple | None = None  # _state() of the last enqueue that ran (not captured)

    # -- profiles and shapes ---------------------------------------------------------------
    @property
    def active_optimization_profile(self) -> int:
        return self._profile

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        # "The value must lie between 0 and getEngine().getNbOptimizationProfiles() - 1"
        if not 0 <= profile_index < len(self._record.profiles):
            return self._error(
                f"set_optimization_profile_async: profile {profile_index} is not in "
                f"[0, {len(self._record.profiles) - 1}]"
            )
        # "setOptimizationProfileAsync() must be called before calling setInputShape() for all
        # dynamic input tensors": shapes set under the old profile must be set again.
        self._profile = int(profile_index)
        self._shapes.clear()
        return True

    def set_input_shape(self, name: str, shape: object) -> bool:
        t = self._record.tensor(name)
        shape = tuple(int(d) for d in shape)
        # "False if the provided name does not map to an input tensor" (setInputShape)
        if t is None or not t.is_input:
            return self._error(f"set_input_shape: {name!r} is not an input tensor")
        # "Each dimension must agree with the network dimension unless the latter was -1."
        if len(shape) != len(t.shape) or any(d != -1 and d != s for d, s in zip(t.shape, shape)):
            return self._error(f"set_input_shape: {name} shape {shape} does not match {t.shape}")
        # "A runtime error will be raised if the input tensor dimensions fall outside the
        # valid range for this profile." (IOptimizationProfile)
        lo, _, hi = self._record.profiles[self._profile][name]
        if any(not a <= s <= b for a, s, b in zip(lo, shape, hi)):
            return self._error(
                f"set_input_shape: {name} shape {shape} is outside optimization profile "
                f"{self._profile} (min {lo}, max {hi})"
            )
        self._shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> object:
        """Input: as set (else declared, -1 for unset dynamic dims). Aliased output: its
        input's. Other outputs: computed from the input shapes once all are set (else
        declared)."""
        t = self._record.tensor(name)
        if t is None:
            return trt.Dims([-1])
        if t.is_input:
            return trt.Dims(list(self._shapes.get(name, t.shape)))
        source = self._record.aliases.get(name)
        if source is not None:
            return trt.Dims(list(self._shapes.get(source, t.shape)))
        if self.infer_shapes():
            return trt.Dims(list(t.shape))
        try:
            return trt.Dims(list(self._shapes_of_outputs()[name]))
        except (EmulatorError, TrtKvError) as err:
            log_error(self._logger, f"get_tensor_shape({name}): {err}")
            return trt.Dims(list(t.shape))

    @property
    def all_binding_shapes_specified(self) -> bool:
        return not self.infer_shapes()

    def infer_shapes(self) -> list[str]:
        """Names of inputs whose dynamic dimensions are not set yet."""
        return [
            t.name
            for t in self._record.tensors
            if t.is_input and -1 in t.shape and t.name not in self._shapes
        ]

    # -- addresses and allocators ------------------------------------------------------------
    def set_tensor_address(self, name: str, memory: int) -> bool:
        # "Return false if the provided name does not map to an input or output tensor."
        if self._record.tensor(name) is None:
            return self._error(f"set_tensor_address: {name!r} is not an input or output")
        memory = int(memory)
        # "The pointer must have at least 256-byte alignment." (setTensorAddress)
        if memory % ALIGNMENT:
            return self._error(
                f"set_tensor_address: {name} address {memory:#x} is not 256-byte aligned "
                f"(offset {memory % ALIGNMENT})"
            )
        # "An address defaults to nullptr. Pass data=nullptr to reset to the default state."
        self._addresses[name] = memory
        return True

    def get_tensor_address(self, name: str) -> int:
        return self._addresses.get(name, 0)

    def set_output_allocator(self, name: str, output_allocator: object) -> bool:
        t = self._record.tensor(name)
        # "False if the provided name does not map to an output" (setOutputAllocator)
        if t is None or t.is_input:
            return self._error(f"set_output_allocator: {name!r} is not an output tensor")
        if output_allocator is None:
            self._allocators.pop(name, None)
        else:
            self._allocators[name] = output_allocator
        return True

    def get_output_allocator(self, name: str) -> object:
        return self._allocators.get(name)

    def get_runtime_config(self) -> object:
        return None if self._config is None else self._config()

    # -- debug hooks Polygraphy sets (the emulated network has no debug tensors) -----------
    def set_all_tensors_debug_state(self, flag: bool) -> bool:
        return True

    def set_debug_listener(self, listener: object) -> bool:
        self._debug_listener = listener
        return True

    def get_debug_listener(self) -> object:
        return self._debug_listener

    def is_stream_capturable(self, stream: int) -> bool:
        return True

    # -- execution -------------------------------------------------------------------------
    def execute_async_v3(self, stream_handle: int) -> bool:
        """Check every binding, then run the network on the bound memory as stream work on
        ``stream_handle`` (recorded instead when that stream is being captured)."""
        try:
            binding = self._check()
            stream = device().stream(stream_handle)
        except (_Refused, EmulatorError) as err:
            return self._error(f"execute_async_v3: {err}")
        captured = stream is not None and stream.capture is not None
        state = self._state()
        # trtexec enqueues once before it captures: "Avoid capturing initialization calls by
        # executing the enqueue function at least once before starting CUDA graph capture."
        # (samples/common/sampleInference.cpp). The first enqueue after a change of shapes or
        # profile redoes such set-up, so the emulator refuses to capture an enqueue whose
        # shapes did not run just before.
        if captured and self._enqueued != state:
            return self._error(
                "execute_async_v3 under stream capture: the last enqueue had other "
                f"shapes ({self._enqueued}); enqueue once with these ({state}) before capturing"
            )
        try:
            binding = self._allocate(binding, stream_handle)
            submit(
                stream_handle,
                Checked(
                    lambda: _check_ranges(binding),
                    lambda: self._run(binding, state, replay=captured),
                ),
                f"execute_async_v3 ({self.engine.name})",
            )
        except (_Refused, EmulatorError, TrtKvError) as err:
            return self._error(f"execute_async_v3: {err}")
        if not captured:
            self._enqueued = state
        return True

    def _shapes_of_outputs(self) -> dict[str, Shape]:
        """Each non-aliased output's shape at the current input shapes (all set): learned
        once per :meth:`_state` by running the network on zeros of the input shapes.

        Raises:
            EmulatorError: the network failed on zeros.
        """
        state = self._state()
        if state not in self._output_shapes:
            feed = {
                t.name: np.zeros(self._shapes.get(t.name, t.shape), t.dtype)
                for t in self._record.tensors
                if t.is_input
            }
            try:
                results = self._record.plan.run(feed)
            except TrtKvError as err:
                raise EmulatorError(
                    f"output shapes at input shapes {state}: the network failed on zeros: {err}"
                ) from err
            self._output_shapes[state] = {
                t.name: tuple(results[t.name].shape)
                for t in self._record.tensors
                if not t.is_input and t.name not in self._record.aliases
            }
        return self._output_shapes[state]

    def _allocate(self, binding: _Binding, stream: int) -> _Binding:
        """Resolve each output's address before the enqueue returns: TensorRT calls
        ``reallocateOutputAsync`` and ``notifyShape`` "sometime between when it calls
        reallocateOutput and enqueueV3 returns" (IOutputAllocator)."""
        outputs = []
        for t, address, allocator in binding.outputs:
            shape = binding.shapes[t.name]
            nbytes = _nbytes(shape, t.dtype)
            if allocator is not None:
                address = int(
                    allocator.reallocate_output_async(t.name, address, nbytes, ALIGNMENT, stream)
                    or 0
                )
                allocator.notify_shape(t.name, trt.Dims(list(shape)))
                if not address or address % ALIGNMENT:
                    raise EmulatorError(f"output {t.name}: allocator gave address {address:#x}")
            _check_range(device().memory, t.name, address, nbytes)
            outputs.append((t, address, None))
        return _Binding(binding.inputs, tuple(outputs), binding.aliased, binding.shapes)

    def _state(self) -> tuple:
        """The profile and input shapes: what shape-dependent set-up depends on."""
        return (self._profile, tuple(sorted(self._shapes.items())))

    def _check_named_dimensions(self) -> None:
        # "Dimensions with the same non-empty name must be equal at runtime."
        # (ITensor.setDimensionName)
        for name, sizes in _named_sizes(self._record.tensors, self._shapes).items():
            if len(set(sizes.values())) > 1:
                raise _Refused(f"input dimensions named {name!r} differ: {sizes}")

    def _check(self) -> _Binding:
        memory = device().memory
        if self._config is not None and self._config() is None:
            raise _Refused("the IRuntimeConfig this context was created with has been freed")
        # "setOptimizationProfileAsync() must be called before calling setInputShape() for all
        # dynamic input tensors or input shape tensors, which in turn must be called before
        # executeV2()/enqueueV3()."
        missing = self.infer_shapes()
        if missing:
            raise _Refused(f"input shapes not set: {missing}")
        self._check_named_dimensions()
        inputs, outputs = [], []
        for t in self._record.tensors:
            address = self._addresses.get(t.name, 0)
            if t.is_input:
                shape = self._shapes.get(t.name, t.shape)
                # "Before calling enqueueV3(), each input must have a non-null address"
                if not address:
                    raise _Refused(f"input {t.name} has no address")
                # "The pointer must point to a device buffer of sufficient size and alignment"
                _check_range(memory, t.name, address, _nbytes(shape, t.dtype))
                inputs.append((t, address, shape))
                continue
            source = self._record.aliases.get(t.name)
            if source is not None:
                # "The output performs in-place updates on the cache tensor, so they must
                # share the same device memory address." (IKVCacheUpdateLayer)
                if address != self._addresses.get(source, 0):
                    raise _Refused(
                        f"aliased output {t.name} is bound to {address:#x}, not to its input "
                        f"{source}'s address {self._addresses.get(source, 0):#x}"
                    )
                continue
            allocator = self._allocators.get(t.name)
            # "each output must have a non-null address or an IOutputAllocator to set it later"
            if not address and allocator is None:
                raise _Refused(f"output {t.name} has neither an address nor an allocator")
            outputs.append((t, address, allocator))
        shapes = self._shapes_of_outputs()
        return _Binding(tuple(inputs), tuple(outputs), frozenset(self._record.aliases), shapes)

    def _run(self, binding: _Binding, state: tuple, replay: bool) -> None:
        """The enqueued work: the network on views of the bound memory (checked again: a graph
        replay may run it after a free, or after the context ran other shapes)."""
        if replay and self._ran != state:
            # The captured kernels carry the set-up of the capture's shapes; an enqueue of
            # other shapes since then redid that set-up for those (see execute_async_v3).
            raise EmulatorError(
                f"replay of an enqueue captured with shapes {state} after this context last "
                f"ran {self._ran} without a fresh enqueue of the captured shapes"
            )
        memory = device().memory
        feed = {t.name: memory.view(a, shape, t.dtype) for t, a, shape in binding.inputs}
        results = self._record.plan.run(feed)
        for t, address, _ in binding.outputs:
            value = np.ascontiguousarray(results[t.name], dtype=t.dtype)
            if value.shape != binding.shapes[t.name]:
                raise EmulatorError(
                    f"output {t.name}: shape {value.shape} differs from {binding.shapes[t.name]}"
                    " computed from the input shapes (data-dependent shapes are not emulated)"
                )
            memory.view(address, value.shape, t.dtype)[...] = value
        self._ran = state

    def _error(self, message: str) -> bool:
        log_error(self._logger, message)
        return False


def _nbytes(shape: Shape, dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _named_sizes(tensors: object, shapes: dict) -> dict[str, dict[str, int]]:
    """Dimension name -> {"input[axis]": size} over the inputs' set shapes."""
    found: dict[str, dict[str, int]] = {}
    for t in tensors:
        for axis, name in enumerate(t.dim_names):
            if name and t.is_input:
                found.setdefault(name, {})[f"{t.name}[{axis}]"] = shapes.get(t.name, t.shape)[axis]
    return found


def _check_ranges(binding: _Binding) -> None:
    """Every input and output of ``binding`` inside one live allocation (EmulatorError)."""
    memory = device().memory
    for t, address, shape in binding.inputs:
        memory.find(address, _nbytes(shape, t.dtype))
    for t, address, _ in binding.outputs:
        memory.find(address, _nbytes(binding.shapes[t.name], t.dtype))


def _check_range(memory: object, name: str, address: int, nbytes: int) -> None:
    """``[address, address + nbytes)`` inside one live allocation, else refused."""
    try:
        memory.find(address, nbytes)
    except EmulatorError as err:
        raise _Refused(f"{name} ({nbytes} bytes): {err}") from err
