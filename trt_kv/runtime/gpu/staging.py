"""A step's inputs on their way to the device: one pinned host buffer, one device buffer,
one copy a step.

The non-cache inputs of a step (``input_ids [B, S]``, ``position_ids [B, S]``,
``write_indices [B]``, ...) are packed at 256-byte aligned offsets, fixed for as long as the
binding state (batch, step width) stays the same, so TensorRT's tensor addresses stay valid
and a captured graph reads the new values where it read the old ones. Each step writes them
into the pinned buffer and uploads the packed span with one ``cudaMemcpyAsync``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from trt_kv.errors import ShapeError, mismatch
from trt_kv.runtime.gpu.cuda import DeviceBuffer, PinnedBuffer
from trt_kv.runtime.gpu.device import ALIGNMENT


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


class StepInputs:
    """Staging for inputs ``names``, each at most ``most_bytes`` a step."""

    def __init__(self, names: frozenset[str], most_bytes: int) -> None:
        self.names = sorted(names)
        size = max(_aligned(most_bytes) * len(self.names), ALIGNMENT)
        self.host = PinnedBuffer(size)
        self.device = DeviceBuffer(size, "step inputs")
        self.views: dict[str, np.ndarray] = {}  # name -> its pinned array, for this layout
        self.used = 0  # bytes of the packed span

    def arrange(self, feed: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Pack a layout for the shapes and dtypes of ``feed``; returns each input's device
        address (bind them: they hold until the next :meth:`arrange`)."""
        offset, self.views, addresses = 0, {}, {}
        for name in self.names:
            if name not in feed:
                continue
            host = np.asarray(feed[name])
            self.views[name] = self.host.view(offset, host.dtype, host.shape)
            addresses[name] = self.device.address(offset)
            offset += _aligned(host.nbytes)
        self.used = offset
        return addresses

    def upload(self, feed: Mapping[str, np.ndarray], stream: int) -> None:
        """Write ``feed`` (the shapes of the last :meth:`arrange`) into the pinned buffer and
        copy the packed span to the device on ``stream``: one ``cudaMemcpyAsync``. The
        pinned bytes must stay as they are until ``stream`` is synchronized.

        Raises:
            ShapeError: an input whose shape or dtype differs from the arranged one.
        """
        for name, view in self.views.items():
            host = feed[name]
            if host.shape != view.shape or host.dtype != view.dtype:
                raise ShapeError(
                    mismatch(name, "the arranged shape", (view.shape, view.dtype), host.shape)
                )
            np.copyto(view, host)
        self.device.upload_from(self.host, self.used, stream)

    def free(self) -> None:
        self.views = {}
        self.host.free()
        self.device.free()
