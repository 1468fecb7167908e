"""Build jobs: network -> engine bytes -> engine file with sidecar, as one call each."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_kv.builder import Profile, build_engine
from trt_kv.engine_file import ENGINES_DIR, EngineMeta, describe, save_engine
from trt_kv.examples import doc_example_network
from trt_kv.models.llama import LlamaConfig, LlamaWeights, build_llama_network


@dataclass(frozen=True)
class BuiltFile:
    """One engine on disk and its sidecar content."""

    path: Path
    meta: EngineMeta


def build_to_file(
    builder: object,
    network: object,
    profiles: list[Profile],
    path: Path,
    metadata: dict | None = None,
) -> BuiltFile:
    """Compile ``network`` and write ``path`` plus its sidecar."""
    built = build_engine(builder, network, profiles)
    meta = describe(network, built, profiles, metadata)
    return BuiltFile(save_engine(path, built, meta), meta)


def build_doc_example(out_dir: Path = ENGINES_DIR) -> BuiltFile:
    """The KVCacheUpdate documentation example (float32 cache [4, 2, 8, 1])."""
    builder, network, profiles = doc_example_network()
    return build_to_file(
        builder,
        network,
        profiles,
        out_dir / "kv_cache_doc_example.engine",
        {"model": "kv_cache_doc_example", "recipe": {"network": "kv_cache_doc_example"}},
    )


def model_engine_path(name: str, dtype: str, out_dir: Path = ENGINES_DIR) -> Path:
    return out_dir / f"{name}-{dtype}.engine"


def build_llama_engine(
    name: str,
    config: LlamaConfig,
    weights: LlamaWeights,
    *,
    out_dir: Path = ENGINES_DIR,
    dtype: str = "float16",
    max_seq_len: int = 512,
    max_batch: int = 8,
    max_step_tokens: int = 128,
    source: str | None = None,
) -> BuiltFile:
    """A Llama engine for prefill and decode, with the config in the sidecar metadata.

    ``source``: the ``load_model`` spec the weights came from ("default" or a checkpoint
    folder); the sidecar then records a recipe (source and weights sha256) from which the
    same network can be rebuilt, e.g. by the emulated TensorRT runtime."""
    net = build_llama_network(
        config,
        weights,
        max_seq_len=max_seq_len,
        max_batch=max_batch,
        max_step_tokens=max_step_tokens,
        dtype=dtype,
    )
    metadata = net.metadata()
    if source is not None:
        metadata["recipe"] = {
            "network": "llama",
            "model": source,
            "weights_sha256": weights_digest(weights),
        }
    return build_to_file(
        net.builder, net.network, net.profiles, model_engine_path(name, dtype, out_dir), metadata
    )


def weights_digest(weights: LlamaWeights) -> str:
    """sha256 over every weight array's dtype, shape and bytes, in a fixed order."""
    digest = hashlib.sha256()
    arrays = [weights.embed, weights.final_norm, weights.lm_head]
    arrays += [a for layer in weights.layers for a in vars(layer).values()]
    for a in arrays:
        if a is not None:
            a = np.ascontiguousarray(a)
            digest.update(f"{a.dtype.str}{a.shape}".encode())
            digest.update(a.reshape(-1).view(np.uint8))
    return digest.hexdigest()
