"""Runtime: host cache state, cache storage, backends, the session API and the decode loop.

GPU backends (``TrtBackend``, ``PolygraphyBackend``) live in :mod:`trt_kv.runtime.gpu` and are
imported from their modules, so that importing the runtime never needs CUDA.
"""

from trt_kv.runtime.cache_state import CacheState, StepPlan
from trt_kv.runtime.generate import Generation, generate
from trt_kv.runtime.reference_backend import ReferenceBackend
from trt_kv.runtime.sampling import Sampler
from trt_kv.runtime.session import Session
from trt_kv.runtime.storage import CacheStorage, HostCaches

__all__ = [
    "CacheState",
    "CacheStorage",
    "Generation",
    "HostCaches",
    "ReferenceBackend",
    "Sampler",
    "Session",
    "StepPlan",
    "generate",
]
