"""Cache storage in device memory: one cudaMalloc per cache ``[capacity, N, S_max, H]``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trt_kv import dtypes
from trt_kv.builder.kv_cache import CacheAlias
from trt_kv.runtime.cuda import DeviceBuffer, require_gpu
from trt_kv.runtime.storage import CacheStorage


class DeviceCaches(CacheStorage):
    """Device-resident caches; a step binds ``address(name, lo)`` for input and output."""

    def __init__(self, aliases: Sequence[CacheAlias], capacity: int) -> None:
        require_gpu("DeviceCaches")
        super().__init__(aliases, capacity)
        self.dtypes = {a.input: dtypes.to_numpy(a.dtype) for a in self.aliases}
        self.slot_bytes = {
            name: int(np.prod(self.slot_shape)) * dt.itemsize for name, dt in self.dtypes.items()
        }
        self.buffers = {name: DeviceBuffer(capacity * nb) for name, nb in self.slot_bytes.items()}
        self.zero()

    def address(self, name: str, lo: int) -> int:
        """Device address of slot ``lo`` of cache ``name``."""
        return self.buffers[name].ptr + lo * self.slot_bytes[name]

    def zero(self, slot: int | None = None) -> None:
        for name, buf in self.buffers.items():
            if slot is None:
                buf.memset(0)
            else:
                nb = self.slot_bytes[name]
                buf.memset(0, slot * nb, nb)

    def copy_slot(self, src: int, dst: int) -> None:
        for name, buf in self.buffers.items():
            nb = self.slot_bytes[name]
            buf.copy_within(src * nb, dst * nb, nb)

    def read_slot(self, name: str, slot: int) -> np.ndarray:
        host = np.empty(self.slot_shape, self.dtypes[name])
        return self.buffers[name].download(host, slot * self.slot_bytes[name])

    def write_slot(self, name: str, slot: int, rows: np.ndarray) -> None:
        # Rows [N, L, H] land in the first L rows of each head: one copy per head.
        n, s_max, h = self.slot_shape
        rows = np.ascontiguousarray(rows, dtype=self.dtypes[name])
        row_bytes = h * rows.itemsize
        for head in range(n):
            offset = slot * self.slot_bytes[name] + head * s_max * row_bytes
            self.buffers[name].upload(rows[head], offset)
