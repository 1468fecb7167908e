"""Backend on the NumPy interpreter of the built network: the whole loop, on a CPU."""

from __future__ import annotations

import numpy as np

from trt_kv.builder.kv_cache import cache_aliases
from trt_kv.errors import ArgumentError, check_bool, check_int, mismatch
from trt_kv.interpreter import compile_network
from trt_kv.models.llama.network import LOGITS, LlamaNetwork
from trt_kv.models.llama.rope import long_rope_after
from trt_kv.runtime.backend import last_token_logits, step_feed
from trt_kv.runtime.cache_state import StepPlan
from trt_kv.runtime.host_memory import keep_freed_memory
from trt_kv.runtime.profiles import select_profile
from trt_kv.runtime.storage import HostCaches


class InterpreterBackend:
    """Executes the exact ``INetworkDefinition`` an engine is built from; the interpreter
    updates the bound cache windows in place, as the GPU does. Each step selects the
    optimization profile an engine would run it with (``profile``: its index), so a shape no
    profile holds raises ShapeError here as on a GPU.

    float16 caches are held as float32 arrays of float16 values (``wide_float16_caches``,
    the default): twice their memory, and no widening of every cache each step; the results
    are the same bits either way (:func:`~trt_kv.interpreter.compile_network`)."""

    name = "interpreter"

    def __init__(
        self, net: LlamaNetwork, *, capacity: int | None = None, wide_float16_caches: bool = True
    ) -> None:
        """Raises ArgumentError (before the process-wide malloc setting changes): ``net`` not
        a :class:`LlamaNetwork`, ``capacity`` not None or an integer >= 1 (0 was taken as
        "the network's max_batch"), ``wide_float16_caches`` not a bool."""
        if not isinstance(net, LlamaNetwork):
            raise ArgumentError(
                mismatch("net", "a LlamaNetwork (build_llama_network)", "", type(net).__name__)
            )
        if capacity is not None:
            check_int("capacity", capacity, 1)
        wide = check_bool("wide_float16_caches", wide_float16_caches)
        keep_freed_memory()  # the steps' large temporaries reuse heap memory, no page faults
        self.net = net
        self.plan = compile_network(net.network, wide_float16_caches=wide)
        self.storage = HostCaches(
            cache_aliases(net.network), capacity or net.max_batch, wide_float16_caches=wide
        )
        self.inputs = frozenset(
            net.network.get_input(i).name for i in range(net.network.num_inputs)
        )
        self.max_step_tokens = net.max_step_tokens
        self.vocab_size = net.config.vocab_size
        self.long_rope_after = long_rope_after(net.config, net.max_seq_len)
        self.profile: int | None = None  # the profile of the last step

    def run(self, plan: StepPlan) -> np.ndarray:
        feed = step_feed(plan, self.inputs)
        feed.update(self.storage.window(plan.lo, len(plan.counts)))
        self.profile = select_profile(self.net.profiles, {k: v.shape for k, v in feed.items()})
        return last_token_logits(self.plan.run(feed)[LOGITS], plan)
