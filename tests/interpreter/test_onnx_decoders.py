"""Whole decoders exported by torch (transformers' tiny random Llama and GPT-2), parsed by
TensorRT-RTX's ONNX parser and run by the interpreter: logits (and the grown caches) equal
onnxruntime's on the same file within float32 tolerance, and the logits equal
transformers'. Batches are ragged (left padding in the attention mask)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

import torch

from tests.support.onnx_decoders import export_logits, tiny_model
from tests.support.onnx_graphs import assert_matches, onnxruntime_outputs, parse
from tests.support.onnx_models import export, exporter

FAMILIES = ["llama", "gpt2"]
RNG = np.random.default_rng(11)
TOL = {"rtol": 1e-5, "atol": 1e-5}  # float32: logits of a few units, 2 layers


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return request.param, tiny_model(request.param)


def _ragged_batch(batch: int, length: int, total: int | None = None) -> dict:
    """``input_ids [B, S]`` and an ``attention_mask [B, total]`` whose last row is left-padded
    by two."""
    mask = np.ones((batch, total or length), np.int64)
    mask[-1, :2] = 0
    return {"input_ids": RNG.integers(0, 90, (batch, length)), "attention_mask": mask}


def _logits_match(hf: object, path: str) -> None:
    feed = _ragged_batch(3, 7)
    want = onnxruntime_outputs(path, feed)
    with torch.no_grad():
        expected = hf(**{k: torch.from_numpy(v) for k, v in feed.items()}).logits.numpy()
    parsed = parse(path)
    for fast in (True, False):
        got = parsed.run(feed, fast=fast)
        assert_matches(got, want, **TOL)
        np.testing.assert_allclose(got["logits"], expected, rtol=1e-4, atol=1e-4)


def test_logits_match_onnxruntime_and_transformers(model, tmp_path):
    family, hf = model
    _logits_match(hf, str(export_logits(hf, tmp_path / f"{family}.onnx", dynamo=False)))


def test_the_dynamo_exporters_llama_matches_too(tmp_path):
    """torch's default exporter (``dynamo=True``, through onnxscript): other ops and shape
    subgraphs than TorchScript's. Llama only: an export takes ~30 s."""
    hf = tiny_model("llama")
    _logits_match(hf, str(export_logits(hf, tmp_path / "llama.onnx", dynamo=True)))


@pytest.fixture(scope="module")
def growing(model, tmp_path_factory):
    family, hf = model
    path = export(hf, tmp_path_factory.mktemp("onnx") / f"{family}_past.onnx")
    return hf, str(path)


@pytest.mark.parametrize(("past", "new"), [(0, 5), (6, 1)], ids=["prefill", "decode_step"])
def test_a_growing_cache_step_matches_onnxruntime(growing, past, new):
    hf, path = growing
    layers, heads, dim = exporter().cache_shape(hf)
    feed = _ragged_batch(2, new, past + new)
    feed["position_ids"] = np.tile(np.arange(past, past + new), (2, 1))
    for i in range(layers):
        for kv in ("key", "value"):
            cache = RNG.standard_normal((2, heads, past, dim)).astype(np.float32)
            feed[f"past_key_values.{i}.{kv}"] = cache
    want = onnxruntime_outputs(path, feed)
    parsed = parse(path)
    assert "CONCATENATION" in parsed.layer_types()  # the cache grows by concatenation
    for fast in (True, False):
        assert_matches(parsed.run(feed, fast=fast), want, **TOL)
