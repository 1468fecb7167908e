"""Runtime: host cache state, cache storage, backends, the session API and the decode loop.

The runtime knows roles, not models: every backend drives a network by its decoder contract
(:mod:`trt_kv.contract`). Each model's reference backend (its oracle) lives beside
the model (``trt_kv.models.llama.reference_backend``, ``trt_kv.models.gpt2.reference``).

GPU backends (``TrtBackend``, ``PolygraphyBackend``) live in :mod:`trt_kv.runtime.gpu` and are
imported from their modules, so that importing the runtime never needs CUDA.
"""

from trt_kv.runtime.cache_state import CacheState, StepPlan
from trt_kv.runtime.generate import Generation, generate
from trt_kv.runtime.sampling import Sampler
from trt_kv.runtime.session import Session
from trt_kv.runtime.storage import CacheStorage, HostCaches

__all__ = [
    "CacheState",
    "CacheStorage",
    "Generation",
    "HostCaches",
    "Sampler",
    "Session",
    "StepPlan",
    "generate",
]
