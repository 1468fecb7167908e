"""Host memory: keep freed heap memory in the process for reuse (glibc), for the CPU
backends' NumPy temporaries; how much memory the system has available.

A step of the interpreter allocates and frees many arrays of a few MB (activations of a
prefill chunk). With glibc's defaults each one above the mmap threshold is mapped fresh from
the kernel and page-faulted in, and freed memory at the top of the heap is handed back, so
the next step faults it in again: ~15% of a batch-8 prefill here. Raising both thresholds
keeps that memory for the next step. Peak RSS does not change (the same arrays are live at
the peak); memory freed after the peak stays with the process until it exits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 << 20  # glibc's largest: allocations below it come from the heap
TRIM_THRESHOLD = 1 << 30  # free memory kept at the top of the heap before it is returned


def keep_freed_memory() -> bool:
    """Ask glibc's ``mallopt`` to serve allocations below 32 MiB from the heap and to keep up
    to 1 GiB of freed memory for reuse. Process-wide; idempotent. Returns False (and changes
    nothing) where the C library has no ``mallopt`` (not glibc) or refuses the values."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def available_host_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The bytes the system can give new allocations without swapping (Linux's
    ``MemAvailable``), or None where ``meminfo`` is absent or has no such line."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key == "MemAvailable":
            number, unit = [*value.split(), "B"][:2]
            return int(number) * (1024 if unit == "kB" else 1)
    return None
