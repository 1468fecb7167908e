"""keep_freed_memory: arrays of a few MB come from the heap, and freed, stay there for the
next ones instead of being mapped fresh from the kernel each time (glibc's ``mallinfo2``
counts both)."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest

from trt_kv.runtime.host_memory import available_host_bytes, keep_freed_memory


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _mallinfo() -> _MallInfo2:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2()


def test_an_array_of_20_mib_comes_from_the_heap_and_stays_there_once_freed():
    """With glibc's defaults a 20 MiB array is a fresh mapping (``hblkhd`` grows by 20 MiB)
    and unmapped when freed; kept, it is heap memory, free for reuse after ``del``."""
    if not keep_freed_memory():
        pytest.skip("no glibc mallopt here")
    mapped = _mallinfo().hblkhd
    a = np.ones(20 << 20, np.uint8)
    assert _mallinfo().hblkhd - mapped < 1 << 20  # not a mapping of its own
    del a
    assert _mallinfo().fordblks >= 20 << 20  # its memory is kept, free for the next array


def test_available_host_bytes_reads_memavailable_in_kib(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       32768 kB\nMemFree:        1024 kB\nMemAvailable:   16384 kB\n"
    )
    assert available_host_bytes(meminfo) == 16 << 20
    meminfo.write_text("MemTotal:       32768 kB\n")  # kernels before 3.14 have no such line
    assert available_host_bytes(meminfo) is None
    assert available_host_bytes(tmp_path / "absent") is None
