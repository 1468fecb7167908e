"""Emulated device memory: allocations in host memory behind integer device pointers.

Device pointers live in their own address range (:data:`DEVICE_BASE` upwards), apart from any
host address, so a copy can tell a device pointer from a host one. Addresses only grow: a freed
range is never handed out again, so a pointer kept past ``free`` is caught as use after free
instead of silently aliasing a newer allocation. Every access goes through :meth:`find`, which
requires ``[ptr, ptr + nbytes)`` to lie inside ONE live allocation.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from trt_kv.errors import TrtKvError, mismatch

# cudaMalloc: "The allocated memory is suitably aligned for any kind of variable." The CUDA
# C Best Practices Guide guarantees at least 256 bytes; TensorRT asks for 256-byte aligned
# tensor addresses, so every emulated allocation starts on a 256-byte boundary.
ALIGNMENT = 256
# Above every user-space address a host allocation can get without asking for one (x86-64
# and arm64 hand out addresses below 2**48 unless a program passes a hint above it), so no
# host buffer (a pinned block, a NumPy array) is ever mistaken for device memory; at
# 0x7E00_0000_0000 a host mapping placed low by ASLR once landed inside the range.
DEVICE_BASE = 1 << 52
DEVICE_SPAN = 1 << 40  # pointers in [DEVICE_BASE, DEVICE_BASE + DEVICE_SPAN) are device pointers
GUARD = ALIGNMENT  # unmapped bytes between allocations: an overrun never lands in a neighbour
# cudaMalloc: "The memory is not cleared." New allocations hold this byte (0xFFFF is a NaN in
# float16/bfloat16, 0xFFFFFFFF in float32), so code that reads memory it never wrote shows it.
FILL = 0xFF


class EmulatorError(TrtKvError, RuntimeError):
    """The emulated device refused an operation (bad pointer, double free, illegal call...)."""


@dataclass
class Allocation:
    """One live ``cudaMalloc``: ``nbytes`` at device address ``ptr``, backed by ``data``."""

    ptr: int
    nbytes: int
    data: np.ndarray  # uint8 [nbytes]

    @property
    def end(self) -> int:
        return self.ptr + self.nbytes


def is_device_pointer(ptr: int) -> bool:
    """Whether ``ptr`` lies in the emulated device address range (live or not)."""
    return DEVICE_BASE <= int(ptr) < DEVICE_BASE + DEVICE_SPAN


class DeviceMemory:
    """The allocation table of one emulated device with ``capacity`` bytes."""

    def __init__(self, capacity: int = 16 << 30) -> None:
        self.capacity = capacity
        self._starts: list[int] = []  # sorted pointers of live allocations
        self._live: dict[int, Allocation] = {}
        self._freed: list[tuple[int, int]] = []  # (ptr, nbytes) of freed allocations, in order
        self._next = DEVICE_BASE

    @property
    def used(self) -> int:
        """Bytes held by live allocations."""
        return sum(a.nbytes for a in self._live.values())

    def malloc(self, nbytes: int) -> int:
        """A new allocation of ``nbytes`` > 0 (filled with :data:`FILL`); its device pointer.

        Raises:
            EmulatorError: ``nbytes`` <= 0, or more than the free capacity.
        """
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise EmulatorError(mismatch("malloc nbytes", "a positive size", "", nbytes))
        if self.used + nbytes > self.capacity:
            raise EmulatorError(
                mismatch(
                    "malloc nbytes",
                    "at most the free device memory",
                    self.capacity - self.used,
                    nbytes,
                )
            )
        ptr = self._next
        self._next = _round_up(ptr + nbytes + GUARD, ALIGNMENT)
        if self._next > DEVICE_BASE + DEVICE_SPAN:
            raise EmulatorError(mismatch("malloc", "free device address space", "", "none left"))
        self._live[ptr] = Allocation(ptr, nbytes, np.full(nbytes, FILL, np.uint8))
        bisect.insort(self._starts, ptr)
        return ptr

    def free(self, ptr: int) -> None:
        """Release the allocation that starts at ``ptr``.

        Raises:
            EmulatorError: ``ptr`` is not the start of a live allocation (double free, a pointer
                into the middle of one, or never allocated).
        """
        ptr = int(ptr)
        alloc = self._live.get(ptr)
        if alloc is None:
            raise EmulatorError(
                mismatch("free", "the start of a live allocation", "", self._describe(ptr))
            )
        del self._live[ptr]
        self._starts.remove(ptr)
        self._freed.append((ptr, alloc.nbytes))

    def find(self, ptr: int, nbytes: int) -> tuple[Allocation, int]:
        """The live allocation holding ``[ptr, ptr + nbytes)`` and ``ptr``'s offset in it.

        Raises:
            EmulatorError: the range is not inside one live allocation (freed, out of bounds,
                straddling two allocations, or not a device pointer).
        """
        ptr, nbytes = int(ptr), int(nbytes)
        if nbytes < 0:
            raise EmulatorError(mismatch("device range", "nbytes >= 0", "", nbytes))
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i >= 0:
            alloc = self._live[self._starts[i]]
            if ptr + nbytes <= alloc.end and (ptr < alloc.end or nbytes == 0):
                return alloc, ptr - alloc.ptr
        raise EmulatorError(
            mismatch(
                f"device range [{ptr:#x}, {ptr + nbytes:#x})",
                "inside one live allocation",
                "",
                self._describe(ptr),
            )
        )

    def view(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """A writable NumPy view ``shape``/``dtype`` onto the device bytes at ``ptr``.

        Raises:
            EmulatorError: as :meth:`find` for the view's byte range.
        """
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        alloc, offset = self.find(ptr, nbytes)
        return alloc.data[offset : offset + nbytes].view(dtype).reshape(shape)

    def host_address(self, ptr: int, nbytes: int) -> int:
        """The host address that backs ``[ptr, ptr + nbytes)`` (checked as :meth:`find`)."""
        alloc, offset = self.find(ptr, nbytes)
        return alloc.data.ctypes.data + offset

    def _describe(self, ptr: int) -> str:
        """What ``ptr`` is, for error messages."""
        if not is_device_pointer(ptr):
            return f"{ptr:#x}, not a device pointer"
        for start in self._starts:
            alloc = self._live[start]
            if alloc.ptr <= ptr < alloc.end:
                return (
                    f"{ptr:#x}, offset {ptr - alloc.ptr} into a live {alloc.nbytes}-byte allocation"
                )
        for start, nbytes in reversed(self._freed):
            if start <= ptr < start + nbytes:
                return f"{ptr:#x}, inside a freed {nbytes}-byte allocation (use after free)"
        return f"{ptr:#x}, outside every allocation"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
