"""Emulated device memory: alignment, no address reuse, and every bad access refused."""

import numpy as np
import pytest

from trt_kv.emulator.memory import ALIGNMENT, DeviceMemory, EmulatorError, is_device_pointer
from trt_kv.errors import TrtKvError


def test_allocations_are_256_byte_aligned_device_pointers():
    mem = DeviceMemory()
    ptrs = [mem.malloc(n) for n in (1, 160, 257, 4096)]
    assert all(p % 256 == 0 for p in ptrs) and ALIGNMENT == 256
    assert all(is_device_pointer(p) for p in ptrs)
    assert len(set(ptrs)) == 4


def test_a_freed_range_is_never_handed_out_again():
    mem = DeviceMemory()
    first = mem.malloc(512)
    mem.free(first)
    second = mem.malloc(512)
    assert second >= first + 512


def test_double_free_is_an_error_naming_use_after_free():
    mem = DeviceMemory()
    p = mem.malloc(64)
    mem.free(p)
    with pytest.raises(EmulatorError, match="use after free"):
        mem.free(p)
    assert issubclass(EmulatorError, TrtKvError)


def test_free_of_a_pointer_inside_an_allocation_is_an_error():
    mem = DeviceMemory()
    p = mem.malloc(64)
    with pytest.raises(EmulatorError, match="offset 16 into a live 64-byte allocation"):
        mem.free(p + 16)


def test_a_range_leaving_its_allocation_is_refused():
    mem = DeviceMemory()
    p = mem.malloc(100)
    mem.find(p, 100)  # exactly the allocation: fine
    with pytest.raises(EmulatorError, match="inside one live allocation"):
        mem.find(p + 4, 100)


def test_a_range_reaching_into_the_next_allocation_is_refused():
    mem = DeviceMemory()
    a = mem.malloc(256)
    b = mem.malloc(256)
    with pytest.raises(EmulatorError):
        mem.find(a, b + 1 - a)


def test_access_to_freed_memory_is_use_after_free():
    mem = DeviceMemory()
    p = mem.malloc(32)
    mem.free(p)
    with pytest.raises(EmulatorError, match="use after free"):
        mem.view(p, (8,), np.float32)


def test_host_pointer_is_not_device_memory():
    mem = DeviceMemory()
    host = np.zeros(4)
    with pytest.raises(EmulatorError, match="not a device pointer"):
        mem.find(host.ctypes.data, 8)


def test_view_is_a_writable_window_onto_the_allocation():
    mem = DeviceMemory()
    p = mem.malloc(64)
    mem.view(p + 16, (2, 2), np.float32)[...] = [[1, 2], [3, 4]]
    assert mem.view(p, (16,), np.float32)[4:8].tolist() == [1, 2, 3, 4]


def test_new_memory_is_not_zero():
    # cudaMalloc: "The memory is not cleared." Unwritten float16 reads back as NaN here.
    mem = DeviceMemory()
    assert np.isnan(mem.view(mem.malloc(8), (4,), np.float16)).all()


def test_capacity_is_enforced_and_nothing_changes_on_failure():
    mem = DeviceMemory(capacity=1024)
    mem.malloc(1000)
    with pytest.raises(EmulatorError, match="free device memory"):
        mem.malloc(100)
    assert mem.used == 1000
