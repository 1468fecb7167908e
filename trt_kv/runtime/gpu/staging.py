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

from trt_kv import dtypes
from trt_kv.contract import DecoderRoles
from trt_kv.errors import ShapeError, mismatch
from trt_kv.runtime.gpu.cuda import DeviceBuffer, PinnedBuffer
from trt_kv.runtime.gpu.device import ALIGNMENT


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def step_input_bytes(roles: DecoderRoles, batch: int) -> dict[str, int]:
    """The most bytes of each non-cache input of a step of ``batch`` sequences: an int64
    ``[B, S]`` bounds each id-shaped one, ``[B, S, D]`` of its dtype the embeddings."""
    most = batch * roles.max_step_tokens * 8
    sizes = dict.fromkeys(roles.feed_names(), most)
    if roles.token_role == "embeddings":
        width = roles.embedding_dim * dtypes.to_numpy(roles.embedding_dtype).itemsize
        sizes[roles.inputs["embeddings"]] = batch * roles.max_step_tokens * width
    return sizes


class StepInputs:
    """Staging for the inputs of ``most_bytes`` (name -> the most bytes it has a step)."""

    def __init__(self, most_bytes: Mapping[str, int]) -> None:
        self.names = sorted(most_bytes)
        size = max(sum(_aligned(n) for n in most_bytes.values()), ALIGNMENT)
        self.host = PinnedBuffer(size, "step inputs")
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
        """:meth:`write` ``feed``, then :meth:`copy` it to the device on ``stream``. The
        pinned bytes must stay as they are until ``stream`` is synchronized.

        Raises:
            ShapeError: as :meth:`write`.
        """
        self.write(feed)
        self.copy(stream)

    def write(self, feed: Mapping[str, np.ndarray]) -> None:
        """Write ``feed`` (the shapes of the last :meth:`arrange`) into the pinned buffer (host
        memory only: no CUDA call; a captured :meth:`copy` replayed later takes it up).

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

    def copy(self, stream: int) -> None:
        """The packed span, pinned buffer to device, on ``stream``: one ``cudaMemcpyAsync``
        (recorded, not run, when ``stream`` is being captured)."""
        self.device.upload_from(self.host, self.used, stream)

    def free(self) -> None:
        self.views = {}
        self.host.free()
        self.device.free()
