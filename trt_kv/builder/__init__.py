"""Build steps: cache inputs and updates, whole-model caches, the decoder contract, engine
bytes."""

from trt_kv.builder.contract import DecoderNetwork, decoder_roles
from trt_kv.builder.engine import BuiltEngine, Profile, build_engine, create_network
from trt_kv.builder.kv_cache import (
    CacheAlias,
    CacheUpdate,
    add_cache_input,
    add_kv_cache_update,
    cache_aliases,
    validate_cache_update,
)
from trt_kv.builder.model_caches import ModelCaches, add_model_caches, cache_names
from trt_kv.builder.routes import Routes, resolve_routes
from trt_kv.contract import DecoderRoles, check_roles

__all__ = [
    "BuiltEngine",
    "CacheAlias",
    "CacheUpdate",
    "DecoderNetwork",
    "DecoderRoles",
    "ModelCaches",
    "Profile",
    "Routes",
    "add_cache_input",
    "add_kv_cache_update",
    "add_model_caches",
    "build_engine",
    "cache_aliases",
    "cache_names",
    "check_roles",
    "create_network",
    "decoder_roles",
    "resolve_routes",
    "validate_cache_update",
]
