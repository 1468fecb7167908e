"""Cache storage in device memory: one cudaMalloc per cache ``[capacity, N, S_max, H]``."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from trt_kv import dtypes
from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.errors import DeviceMemoryError, SlotError, mismatch
from trt_kv.runtime.gpu.cuda import DeviceBuffer, free_device_bytes, require_gpu
from trt_kv.runtime.storage import SCRATCH, CacheStorage

ALIGNMENT = 256  # bytes; TensorRT's requirement for every bound tensor address


class DeviceCaches(CacheStorage):
    """Device-resident caches; a step binds ``address(name, lo)`` for input and output."""

    def __init__(self, aliases: Sequence[CacheAlias], capacity: int) -> None:
        require_gpu("DeviceCaches")
        super().__init__(aliases, capacity)
        self.dtypes = {a.input: dtypes.to_numpy(a.dtype) for a in self.aliases}
        self.slot_bytes = {
            name: int(np.prod(self.slot_shape)) * dt.itemsize for name, dt in self.dtypes.items()
        }
        self.scratch: dict[str, DeviceBuffer] = {}  # the reorder's spare slot, once needed
        self.buffers: dict[str, DeviceBuffer] = {}
        for name, nb in self.slot_bytes.items():
            self.buffers[name] = self._allocate(name, capacity, nb)
        self.zero()

    def _allocate(self, name: str, capacity: int, slot_bytes: int) -> DeviceBuffer:
        """One cache ``[capacity, N, S_max, H]``; on a failed cudaMalloc the caches made so
        far are freed and DeviceMemoryError names the capacity that fits the free memory."""
        try:
            return DeviceBuffer(capacity * slot_bytes, f"cache {name}")
        except DeviceMemoryError as err:
            self.free()
            per_slot = sum(self.slot_bytes.values())
            raise DeviceMemoryError(
                f"{err}; the caches take {per_slot:,} bytes per slot: expected capacity <= "
                f"{free_device_bytes() // per_slot:,} on this device, got {capacity:,}"
            ) from err

    def address(self, name: str, lo: int) -> int:
        """Device address of slot ``lo`` of cache ``name``: the start of a window
        ``[B, N, S_max, H]`` that TensorRT reads as one dense tensor.

        Raises:
            SlotError: as :meth:`check_window`.
        """
        self._check_aligned(name, lo)
        return self.buffers[name].address(lo * self.slot_bytes[name])

    def check_window(self, lo: int) -> None:
        """Raise SlotError unless every cache's window at slot ``lo`` is 256-byte aligned
        (possible only at multiples of :meth:`window_step` when a slot is not a multiple of
        256 bytes)."""
        for name in self.buffers:
            self._check_aligned(name, lo)

    def _check_aligned(self, name: str, lo: int) -> None:
        # TensorRT, IExecutionContext::setTensorAddress: "The pointer must have at least
        # 256-byte alignment." Slots cannot be padded apart: a window of B slots must be one
        # dense [B, N, S_max, H] tensor.
        step = self.window_step(name)
        if lo % step:
            raise SlotError(
                mismatch(
                    f"{name} window at slot {lo}",
                    "a start slot that is a multiple of",
                    step,
                    f"slot {lo} (byte offset {lo * self.slot_bytes[name]}; TensorRT needs "
                    f"256-byte aligned tensor addresses and one slot is "
                    f"{self.slot_bytes[name]} bytes)",
                )
            )

    def window_step(self, name: str) -> int:
        """Windows of cache ``name`` may start at slots that are multiples of this
        (1 when a slot is a multiple of 256 bytes)."""
        return ALIGNMENT // math.gcd(self.slot_bytes[name], ALIGNMENT)

    def free(self) -> None:
        """Give every cache buffer back to the device (idempotent); using the caches
        afterwards raises :class:`~trt_kv.errors.ClosedError`."""
        for buf in [*self.buffers.values(), *self.scratch.values()]:
            buf.free()

    def zero(self, slot: int | None = None, count: int = 1) -> None:
        """One ``cudaMemset`` per cache, for every slot or ``count`` slots from ``slot``."""
        for name, buf in self.buffers.items():
            if slot is None:
                buf.memset(0)
            else:
                nb = self.slot_bytes[name]
                buf.memset(0, slot * nb, count * nb)

    def reserve_scratch(self) -> None:
        """One ``cudaMalloc`` of a slot per cache, freed with the caches."""
        if not self.scratch:
            self.scratch = {
                name: DeviceBuffer(nb, f"reorder scratch slot {name}")
                for name, nb in self.slot_bytes.items()
            }

    def copy_slot(self, src: int, dst: int) -> None:
        """Device-to-device copies, one per cache."""
        if src == dst:  # cudaMemcpy of overlapping ranges is undefined: fork(s, s) is a no-op
            return
        for name in self.buffers:
            source, src_offset = self._slot(name, src)
            target, dst_offset = self._slot(name, dst)
            source.copy_to(target, src_offset, dst_offset, self.slot_bytes[name])

    def _slot(self, name: str, slot: int) -> tuple[DeviceBuffer, int]:
        """The buffer and byte offset of one cache's ``slot`` (or its scratch slot)."""
        if slot == SCRATCH:
            return self.scratch[name], 0
        return self.buffers[name], slot * self.slot_bytes[name]

    def read_slot(self, name: str, slot: int) -> np.ndarray:
        host = np.empty(self.slot_shape, self.dtypes[name])
        return self.buffers[name].download(host, slot * self.slot_bytes[name])

    def write_slot(self, name: str, slot: int, rows: np.ndarray) -> None:
        """Rows ``[N, L, H]`` into the first L rows of each head of the slot ``[N, S_max, H]``:
        one strided ``cudaMemcpy2D`` per cache (N rows of ``L * H`` elements, pitch
        ``S_max * H``), synchronous: ``rows`` may be freed on return."""
        n, s_max, h = self.slot_shape
        rows = np.ascontiguousarray(rows, dtype=self.dtypes[name])
        offset = slot * self.slot_bytes[name]
        pitch = s_max * h * rows.itemsize
        self.buffers[name].upload_2d(rows.reshape(n, rows.shape[1] * h), offset, pitch)
