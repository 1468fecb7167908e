"""Host memory as deferred stream work touches it: through ``/proc/self/mem`` on Linux.

An async copy runs when the emulated stream reaches it, maybe after the host released the
buffer it names (a NumPy temporary collected before the stream was synchronized). Plain
``ctypes.memmove`` from an unmapped page would kill the test process; ``/proc/self/mem``
answers such a read or write with an error instead, which the emulator reports as
:class:`~trt_kv.emulator.memory.EmulatorError`. A released buffer whose pages are still mapped
(small allocations) is read or written like a GPU would: the bytes there now.
"""

from __future__ import annotations

import ctypes
import os

from trt_kv.emulator.memory import EmulatorError

_FD: dict[str, int] = {}  # "pid": the process that opened "fd" (a fork opens its own)


def _mem() -> int | None:
    if _FD.get("pid") != os.getpid():
        try:
            _FD["fd"] = os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            _FD["fd"] = -1  # not Linux: fall back to memmove
        _FD["pid"] = os.getpid()
    return _FD["fd"] if _FD["fd"] >= 0 else None


def _released(addr: int, count: int, err: object) -> EmulatorError:
    return EmulatorError(
        f"host range [{addr:#x}, +{count}): expected host memory that is still mapped when "
        f"the stream work reaches it, got {err} (a host buffer released before the stream "
        "was synchronized)"
    )


def transfer(dst: int, src: int, count: int, kind: str) -> None:
    """Copy ``count`` bytes from address ``src`` to ``dst``; ``kind`` names the sides (``H``
    host, ``D`` an address backing device memory), e.g. ``"HD"``: a host read.

    Raises:
        EmulatorError: a host side is not mapped (released).
    """
    fd = _mem()
    if fd is None or kind == "DD":
        ctypes.memmove(dst, src, count)
        return
    if kind[0] == "H":
        buffer = (ctypes.c_char * count).from_address(dst) if kind[1] == "D" else bytearray(count)
        try:
            got = os.preadv(fd, [buffer], src)
        except OSError as err:
            raise _released(src, count, err) from err
        if got != count:
            raise _released(src, count, f"{got} of {count} bytes readable")
        if kind[1] == "D":
            return
        source = memoryview(buffer)
    else:
        source = memoryview((ctypes.c_char * count).from_address(src))
    try:
        got = os.pwrite(fd, source, dst)
    except OSError as err:
        raise _released(dst, count, err) from err
    if got != count:
        raise _released(dst, count, f"{got} of {count} bytes writable")
