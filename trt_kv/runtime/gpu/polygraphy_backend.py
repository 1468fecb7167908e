"""Backend on Polygraphy's ``TrtRunner`` (GPU only).

Caches are fed as views of trt_kv's device buffers; Polygraphy (>= 0.53) binds each aliased
output to its input's address, so the updates land in our buffers. Two things Polygraphy
0.53.6 needs from such a view, which its own ``DeviceView`` does not give:

- for an aliased output, ``TrtRunner`` re-views the input's feed (``util.array.view``, which
  calls ``obj.view(shape=, dtype=)``): only ``DeviceArray`` has ``view``, and a ``DeviceArray``
  owns (and frees) its memory, so the feed is a ``DeviceView`` subclass with ``view``;
- the view's dtype must be a Polygraphy ``DataType``: the ml_dtypes bfloat16 NumPy dtype is
  not one, so the dtype is taken from TensorRT's (``DataType.from_dtype(trt.bfloat16)``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_kv import dtypes
from trt_kv.runtime.backend import (
    Candidates,
    StepProfiles,
    check_open,
    check_top_k,
    last_token_logits,
    one_thread,
    plan_profile,
    step_feed,
    take_roles,
    top_k_candidates,
)
from trt_kv.runtime.cache_state import StepPlan
from trt_kv.runtime.embedding import EmbedFn, step_embedder
from trt_kv.runtime.gpu.device import DeviceCaches
from trt_kv.runtime.gpu.engine_loader import open_decoder_engine


def _cache_view_class() -> type:
    from polygraphy.cuda import DeviceView

    class CacheView(DeviceView):
        """A ``DeviceView`` that can be re-viewed, as ``DeviceArray.view`` does, and whose
        ``dtype`` is its Polygraphy ``DataType`` (what ``DeviceView.dtype`` announces it will
        return; today it warns on every read and returns a NumPy dtype)."""

        @property
        def dtype(self) -> object:
            return self._dtype

        @dtype.setter
        def dtype(self, new: object) -> None:
            DeviceView.dtype.fset(self, new)

        def view(self, shape: tuple | None = None, dtype: object = None) -> CacheView:
            return CacheView(
                self.ptr,
                self.shape if shape is None else shape,
                self._dtype if dtype is None else dtype,
            )

    return CacheView


class PolygraphyBackend:
    """Runs a trt_kv engine file through ``polygraphy.backend.trt.TrtRunner``."""

    name = "polygraphy"

    def __init__(
        self, engine_path: str | Path, *, capacity: int | None = None, embed: EmbedFn | None = None
    ) -> None:
        """``embed``: as :class:`~trt_kv.runtime.gpu.trt_backend.TrtBackend`'s."""
        from polygraphy.backend.trt import TrtRunner
        from polygraphy.datatype import DataType

        loaded = open_decoder_engine(engine_path, capacity)
        self.meta = loaded.meta
        take_roles(self, loaded.roles)
        self.embed = step_embedder(self.roles, embed)
        self.storage = DeviceCaches(self.meta.aliases, loaded.capacity)
        self.step_profile = StepProfiles(self.meta.profiles, self.roles, self.storage)
        self.view_dtypes = {
            a.input: DataType.from_dtype(dtypes.to_trt(a.dtype), "tensorrt")
            for a in self.meta.aliases
        }
        self.view = _cache_view_class()
        self._views: dict[tuple[int, int], dict[str, object]] = {}  # (lo, B) -> cache views
        self.runner = TrtRunner(loaded.engine)
        self.runner.activate()
        self.closed = False

    def check_plan(self, plan: StepPlan) -> int:
        """The profile that runs ``plan``; raises as :func:`plan_profile`, changes nothing."""
        return plan_profile(self, plan)

    def _infer(self, plan: StepPlan) -> dict[str, object]:
        """Run ``plan``; every output as Polygraphy's ``DeviceArray`` (nothing downloaded)."""
        check_open("PolygraphyBackend", self.closed)
        profile = self.check_plan(plan)  # ShapeError: no profile holds the step
        steps = step_feed(plan, self.roles, self.embed)
        views = self.cache_views(plan.lo, len(plan.counts))
        feed: dict[str, object] = {**steps, **views}
        if profile != self.runner.context.active_optimization_profile:
            self.runner.set_profile(profile)
        return self.runner.infer(feed, copy_outputs_to_host=False)

    @one_thread
    def run(self, plan: StepPlan) -> np.ndarray:
        return last_token_logits(self._infer(plan)[self.roles.logits].numpy(), plan)

    @one_thread
    def run_top_k(self, plan: StepPlan) -> Candidates:
        """:meth:`run`'s step; downloads only the network's next-token candidates."""
        check_top_k(self.roles)  # ArgumentError: no candidates (nothing has run)
        outputs = self._infer(plan)
        names = self.roles.sampling_outputs()
        return top_k_candidates({n: outputs[n].numpy() for n in names}, self.roles)

    def cache_views(self, lo: int, b: int) -> dict[str, object]:
        """The device views ``[b, N, S_max, H]`` of every cache's window at slot ``lo``, made
        once per window and reused by every step on it.

        Raises:
            SlotError: the window is not 256-byte aligned (:meth:`DeviceCaches.address`).
        """
        views = self._views.get((lo, b))
        if views is None:
            shape = (b, *self.storage.slot_shape)
            views = {
                alias.input: self.view(
                    self.storage.address(alias.input, lo), shape, self.view_dtypes[alias.input]
                )
                for alias in self.meta.aliases
            }
            self._views[(lo, b)] = views
        return views

    @one_thread
    def close(self) -> None:
        """Deactivate the runner (Polygraphy frees its execution context and buffers) and
        drop it with the engine it holds, then free the caches (idempotent). Any later step
        raises :class:`ClosedError`; so does the session's cache access (the caches are
        gone)."""
        if self.closed:
            return
        from polygraphy.cuda import DeviceArray

        self.closed = True
        self._views = {}
        runner, self.runner = self.runner, None
        # Polygraphy 0.53.6's deactivate frees the input buffers and context memory but not
        # the output allocator's buffers (a DeviceArray frees nothing when collected): the
        # logits buffer would stay allocated. Found on the emulated device; freed here.
        allocator = getattr(runner, "output_allocator", None)
        try:
            runner.deactivate()
            for buffer in getattr(allocator, "buffers", {}).values():
                if isinstance(buffer, DeviceArray):
                    buffer.free()
        finally:
            self.storage.free()
