"""Names only some TensorRT versions have are read through ``FEATURES``, never unconditionally:
the builder and the interpreter work on a TensorRT 10.15-like module (``add_attention`` with
a causal flag and a mask; no ``add_attention_v2``, ``CausalMaskKind``, ``AttentionIOForm``,
``IAttention.causal_kind`` or forms and lengths).

The installed TensorRT-RTX is turned into that module by deleting those names from it
(``monkeypatch``, restored after each test; in a child process for the import), and
``FEATURES`` is what trt_kv's own probe computes from the module so changed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv import _trt
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

# What TensorRT 10.15 lacks of TensorRT 11 / TensorRT-RTX, as (owner, attribute) paths.
MISSING_IN_10_15 = (
    ("", "CausalMaskKind"),
    ("", "AttentionIOForm"),
    ("INetworkDefinition", "add_attention_v2"),
    ("IAttention", "causal_kind"),
    ("IAttention", "query_form"),
    ("IAttention", "key_value_form"),
    ("IAttention", "query_lengths"),
    ("IAttention", "key_value_lengths"),
    ("IKVCacheUpdateLayer", "update_form"),
    ("IKVCacheUpdateLayer", "update_lengths"),
)
PROMPTS = [[5, 17, 3, 42, 7, 9], [60, 1, 33]]  # ragged: the second is right-padded
WEIGHTS = random_weights(TINY_GQA, seed=3, std=0.3)


def _owner(trt: object, path: str) -> object:
    return trt if not path else getattr(trt, path)


@pytest.fixture
def trt_10_15(monkeypatch):
    """The installed module without the TensorRT 11 names, and FEATURES probed from it."""
    trt = _trt.trt
    for owner, name in MISSING_IN_10_15:
        monkeypatch.delattr(_owner(trt, owner), name)
    monkeypatch.setattr(_trt, "FEATURES", _trt._features(trt))
    return _trt.FEATURES


def test_the_probe_sees_a_10_15_module(trt_10_15):
    assert trt_10_15.attention and not trt_10_15.attention_v2
    assert not (trt_10_15.causal_mask_kind or trt_10_15.attention_io_forms)
    assert not (trt_10_15.attention_kv_lengths or trt_10_15.packed_update_form)


def test_mask_route_network_builds_and_runs_on_the_interpreter_without_causal_kinds(trt_10_15):
    net = build_llama_network(
        TINY_GQA, WEIGHTS, max_seq_len=32, max_batch=2, max_step_tokens=8, dtype="float32"
    )
    assert net.routes.attention == "attention"  # add_attention with the explicit mask
    ours = generate(Session(InterpreterBackend(net)), PROMPTS, max_new_tokens=6).ids
    reference = ReferenceBackend(TINY_GQA, WEIGHTS, capacity=2, max_seq_len=32)
    assert ours == generate(Session(reference), PROMPTS, max_new_tokens=6).ids


def test_interpreter_imports_without_the_optional_layers_and_names():
    """A TensorRT 10.x without the attention, rotary and KV-cache layers (and their enums):
    importing the interpreter reads none of them."""
    module = _trt.FEATURES.module
    deleted = [
        *(f"{owner}.{name}" if owner else name for owner, name in MISSING_IN_10_15),
        "IRotaryEmbeddingLayer",
        "IKVCacheUpdateLayer",
        "KVCacheMode",
        "IAttentionBoundaryLayer",
        "AttentionNormalizationOp",
        "INetworkDefinition.add_attention",
        "INetworkDefinition.add_rotary_embedding",
        "INetworkDefinition.add_kv_cache_update",
    ]
    code = "\n".join(
        [
            f"import {module} as m",
            f"for path in {deleted!r}:",
            "    *owner, name = path.split('.')",
            "    delattr(getattr(m, owner[0]) if owner else m, name)",
            "from trt_kv import FEATURES",
            "import trt_kv.interpreter, trt_kv.builder",
            "print(FEATURES.attention, FEATURES.rotary_embedding, FEATURES.kv_cache_update_layer)",
        ]
    )
    env = {**os.environ, "TRT_KV_TRT_MODULE": module}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "False"]
