"""Backend on Polygraphy's ``TrtRunner`` (GPU only).

Caches are passed as ``DeviceView``s of trt_kv's device buffers; Polygraphy (>= 0.53) binds
each aliased output to its input's address, so the updates land in our buffers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_kv.models.llama.network import LOGITS
from trt_kv.runtime.backend import last_token_logits, step_feed
from trt_kv.runtime.cache_state import StepPlan
from trt_kv.runtime.device import DeviceCaches
from trt_kv.runtime.engine_loader import load_cuda_engine


class PolygraphyBackend:
    """Runs a trt_kv engine file through ``polygraphy.backend.trt.TrtRunner``."""

    name = "polygraphy"

    def __init__(self, engine_path: str | Path, *, capacity: int | None = None) -> None:
        from polygraphy.backend.trt import TrtRunner

        engine, _, self.meta = load_cuda_engine(engine_path)
        md = self.meta.metadata
        self.max_step_tokens = md["max_step_tokens"]
        self.vocab_size = md["config"]["vocab_size"]
        self.storage = DeviceCaches(self.meta.aliases, capacity or md["max_batch"])
        self.inputs = frozenset(t.name for t in self.meta.inputs)
        self.runner = TrtRunner(engine)
        self.runner.activate()

    def run(self, plan: StepPlan) -> np.ndarray:
        from polygraphy.cuda import DeviceView

        b = len(plan.counts)
        feed: dict[str, object] = dict(step_feed(plan, self.inputs))
        for alias in self.meta.aliases:
            feed[alias.input] = DeviceView(
                self.storage.address(alias.input, plan.lo),
                (b, *self.storage.slot_shape),
                self.storage.dtypes[alias.input],
            )
        outputs = self.runner.infer(feed, copy_outputs_to_host=False)
        return last_token_logits(outputs[LOGITS].numpy(), plan)

    def close(self) -> None:
        self.runner.deactivate()
