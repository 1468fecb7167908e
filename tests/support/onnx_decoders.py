"""Tiny random transformers decoders exported to ONNX by torch, for the interpreter's ONNX
tests; this file holds no tests.

Two graphs per model: :func:`export_logits` (``input_ids``, ``attention_mask`` -> ``logits``,
by either exporter) and :func:`export_growing_cache` (TorchScript exporter; the layout
Optimum and transformers.js use: ``past_key_values.{i}.key/value`` ``[B, N, P, H]`` in,
``present.{i}.key/value`` ``[B, N, P + S, H]`` out, each layer concatenating its cache).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import transformers

from tests.support.gpt2_models import HF_CONFIG as GPT2_CONFIG
from tests.support.hf_models import hf_config_args
from tests.support.tiny_models import TINY_GQA_V97

OPSET = 18


def tiny_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A seeded random ``LlamaForCausalLM`` (GQA 4:2, V 97) or ``GPT2LMHeadModel`` (five
    heads, V 101), eager attention (matmul, added mask, softmax), eval mode."""
    torch.manual_seed(seed)
    if family == "llama":
        config = transformers.LlamaConfig(**hf_config_args(TINY_GQA_V97, initializer_range=0.3))
        model = transformers.LlamaForCausalLM(config)
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_CONFIG))
    model.config._attn_implementation = "eager"
    return model.eval()


# The wrappers are put in eval mode before export: torch's exporter restores the wrapper's mode
# afterwards, which for a fresh module (training) would switch the model's dropout on.


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).logits


def export_logits(model: torch.nn.Module, path: Path, dynamo: bool) -> Path:
    """``model``'s logits ``[B, S, V]`` for ``input_ids`` and ``attention_mask`` ``[B, S]``
    (int64, B and S dynamic), by torch's TorchScript (``dynamo=False``) or dynamo exporter."""
    ids = torch.ones((2, 5), dtype=torch.long)
    args = (_Logits(model).eval(), (ids, torch.ones_like(ids)), str(path))
    names = {"input_names": ["input_ids", "attention_mask"], "output_names": ["logits"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            b, s = torch.export.Dim("batch"), torch.export.Dim("sequence", min=2, max=32)
            shapes = {"input_ids": {0: b, 1: s}, "attention_mask": {0: b, 1: s}}
            torch.onnx.export(
                *args, **names, dynamic_shapes=shapes, dynamo=True, opset_version=OPSET,
                external_data=False, verbose=False,
            )  # fmt: skip
        else:
            axes = {
                n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask", "logits")
            }
            torch.onnx.export(*args, **names, dynamic_axes=axes, dynamo=False, opset_version=OPSET)
    return path


class _GrowingCache(torch.nn.Module):
    """``forward(input_ids, attention_mask, position_ids, *past)`` -> ``(logits, *present)``,
    past and present alternating each layer's key and value."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = transformers.DynamicCache(config=self.model.config)
        for i in range(len(past) // 2):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *present)


def cache_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of ``model``'s cache."""
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return (
        c.num_hidden_layers,
        heads,
        getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
    )


def export_growing_cache(model: torch.nn.Module, path: Path) -> Path:
    """``model`` with its cache as ``past_key_values.*`` inputs and ``present.*`` outputs
    (TorchScript exporter; B, S, P dynamic; ``attention_mask`` is ``[B, P + S]``)."""
    layers, heads, dim = cache_shape(model)
    past = [torch.zeros(1, heads, 3, dim) for _ in range(2 * layers)]
    kv = [f"{i}.{n}" for i in range(layers) for n in ("key", "value")]
    past_names, present_names = [f"past_key_values.{n}" for n in kv], [f"present.{n}" for n in kv]
    axes = {
        "input_ids": {0: "batch", 1: "sequence"},
        "position_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "total"},
        "logits": {0: "batch", 1: "sequence"},
        **{n: {0: "batch", 2: "past"} for n in past_names},
        **{n: {0: "batch", 2: "total"} for n in present_names},
    }
    ids = torch.tensor([[1, 2]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _GrowingCache(model).eval(),
            (ids, torch.ones(1, 5, dtype=torch.long), torch.tensor([[3, 4]]), *past),
            str(path),
            input_names=["input_ids", "attention_mask", "position_ids", *past_names],
            output_names=["logits", *present_names],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    return path
