"""Backend on the NumPy interpreter of the built network: the whole loop, on a CPU."""

from __future__ import annotations

import numpy as np

from trt_kv.builder.kv_cache import cache_aliases
from trt_kv.contract import DecoderRoles
from trt_kv.errors import ArgumentError, check_bool, check_int, mismatch
from trt_kv.interpreter import compile_network
from trt_kv.runtime.backend import (
    Candidates,
    StepProfiles,
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
from trt_kv.runtime.host_memory import keep_freed_memory
from trt_kv.runtime.storage import HostCaches


class InterpreterBackend:
    """Executes the exact ``INetworkDefinition`` an engine is built from, driven by the
    network's decoder roles (:mod:`trt_kv.contract`); the interpreter updates the
    bound cache windows in place, as the GPU does. Each step selects the optimization profile
    an engine would run it with (``profile``: its index), so a shape no profile holds raises
    ShapeError here as on a GPU.

    float16 caches are held as float32 arrays of float16 values (``wide_float16_caches``,
    the default): twice their memory, and no widening of every cache each step; the results
    are the same bits either way (:func:`~trt_kv.interpreter.compile_network`)."""

    name = "interpreter"

    def __init__(
        self,
        net: object,
        *,
        capacity: int | None = None,
        wide_float16_caches: bool = True,
        embed: EmbedFn | None = None,
    ) -> None:
        """``net``: any network with ``network``, ``profiles`` and ``roles`` attributes (a
        :class:`~trt_kv.builder.contract.DecoderNetwork`, a model's network such as
        ``LlamaNetwork``).

        Raises ArgumentError (before the process-wide malloc setting changes): ``net``
        without decoder roles, ``capacity`` not None or an integer >= 1 (0 was taken as "the
        network's max_batch"), ``wide_float16_caches`` not a bool, ``embed`` missing for a
        network of embeddings (or given for one of token ids: :mod:`trt_kv.runtime.embedding`)."""
        roles = getattr(net, "roles", None)
        if not isinstance(roles, DecoderRoles) or not hasattr(net, "network"):
            raise ArgumentError(
                mismatch(
                    "net",
                    "a network with decoder roles (DecoderNetwork, build_llama_network...)",
                    "",
                    type(net).__name__,
                )
            )
        if capacity is not None:
            check_int("capacity", capacity, 1)
        wide = check_bool("wide_float16_caches", wide_float16_caches)
        self.embed = step_embedder(roles, embed)
        keep_freed_memory()  # the steps' large temporaries reuse heap memory, no page faults
        self.net = net
        take_roles(self, roles)
        self.plan = compile_network(net.network, wide_float16_caches=wide)
        self.storage = HostCaches(
            cache_aliases(net.network), capacity or roles.max_batch, wide_float16_caches=wide
        )
        self.profile: int | None = None  # the profile of the last step
        self.step_profile = StepProfiles(net.profiles, roles, self.storage)

    def check_plan(self, plan: StepPlan) -> int:
        """The profile that runs ``plan``; raises as :func:`plan_profile`, changes nothing."""
        return plan_profile(self, plan)

    def _outputs(self, plan: StepPlan) -> dict[str, np.ndarray]:
        self.profile = self.check_plan(plan)
        feed = step_feed(plan, self.roles, self.embed)
        feed.update(self.storage.window(plan.lo, len(plan.counts)))
        return self.plan.run(feed)

    @one_thread
    def run(self, plan: StepPlan) -> np.ndarray:
        return last_token_logits(self._outputs(plan)[self.roles.logits], plan)

    @one_thread
    def run_top_k(self, plan: StepPlan) -> Candidates:
        """:meth:`run`'s step; the network's next-token candidates (``device_top_k`` >= 1)."""
        check_top_k(self.roles)  # ArgumentError: no candidates (nothing has run)
        return top_k_candidates(self._outputs(plan), self.roles)
