"""Tiny random transformers decoders exported to ONNX by torch, for the interpreter's ONNX
tests; this file holds no tests.

Two graphs per model: :func:`export_logits` (``input_ids``, ``attention_mask`` -> ``logits``,
by either exporter) here, and the growing cache (``past_key_values.*`` in, ``present.*`` out)
by scripts/export_decoder_onnx.py, the one exporter of that layout
(:func:`tests.support.onnx_models.export`).
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


def tiny_model(family: str, seed: int = 0, dropout: float = 0.0) -> torch.nn.Module:
    """A seeded random ``LlamaForCausalLM`` (GQA 4:2, V 97) or ``GPT2LMHeadModel`` (five
    heads, V 101), eager attention (matmul, added mask, softmax), eval mode; ``dropout`` its
    config's dropout probabilities (in training mode only)."""
    torch.manual_seed(seed)
    if family == "llama":
        args = hf_config_args(TINY_GQA_V97, initializer_range=0.3, attention_dropout=dropout)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**args))
    else:
        drops = {k: dropout for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_CONFIG, **drops))
    model.config._attn_implementation = "eager"
    return model.eval()


# The wrapper is put in eval mode before export: torch's exporter restores the wrapper's mode
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
