"""Export a Hugging Face causal LM to ONNX with its cache as flat tensors, the layout Optimum
and transformers.js use: inputs ``input_ids``, ``attention_mask``, ``position_ids`` and
``past_key_values.{i}.key/value`` ``[B, N, P, H]``; outputs ``logits`` and
``present.{i}.key/value`` ``[B, N, P + S, H]``. The input ``trt-kv --model FILE.onnx`` takes.

    python scripts/export_decoder_onnx.py MODEL_FOLDER decoder.onnx [--dynamo]

It uses torch's TorchScript exporter (``dynamo=False``: one trace, graphs of plain ONNX ops;
seconds for SmolLM2), or with ``--dynamo`` torch's dynamo exporter (``torch.export`` then
onnxscript; torch 2.13's default: every size marked ``Dim.DYNAMIC``, the graph computes
shapes from the caches' symbolic past length, which trt_kv's rewrite maps), and the eager
attention (matmul, an added mask, softmax), which trt_kv's rewrite reads.
transformers 5 keeps its cache in a ``DynamicCache``; :class:`FlatCache` takes and returns the
flat tensors.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
import transformers
from transformers.cache_utils import DynamicCache


class FlatCache(torch.nn.Module):
    """``model`` with its cache as flat tensors: ``forward(input_ids, attention_mask,
    position_ids, *past)`` -> ``(logits, *present)``, ``past`` and ``present`` alternating key
    and value of each layer."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        cache = DynamicCache(config=self.model.config)
        for i in range(len(past) // 2):
            cache.update(past[2 * i], past[2 * i + 1], i)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        return (
            out.logits,
            *(t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)),
        )


def cache_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """``(layers, N, H)`` of ``model``'s cache: each layer's keys and values ``[B, N, P, H]``."""
    c = model.config
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_hidden_layers, kv_heads, head_dim


def export_decoder(
    model: torch.nn.Module, path: Path, opset: int = 18, dynamo: bool = False
) -> Path:
    """Write ``model`` (a causal LM, attention ``"eager"``) to ``path`` by torch's TorchScript
    exporter (``dynamo=False``, the default) or its dynamo exporter (``torch.export``, needs
    onnxscript); ``model`` is in eval mode after (dropout off), whatever its mode before."""
    layers, kv_heads, head_dim = cache_shape(model)
    past = [torch.zeros(1, kv_heads, 3, head_dim) for _ in range(2 * layers)]
    ids, positions = torch.tensor([[1, 2]]), torch.tensor([[3, 4]])
    mask = torch.ones(1, 5, dtype=torch.long)
    cache_names = [f"{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    past_names = [f"past_key_values.{n}" for n in cache_names]
    present_names = [f"present.{n}" for n in cache_names]
    if dynamo:  # every size dynamic: torch.export finds how they relate (P + S = total)
        d = torch.export.Dim.DYNAMIC
        rows, cache = {0: d, 1: d}, {0: d, 2: d}
        shapes = {"dynamic_shapes": (rows, rows, rows, (cache,) * len(past)), "dynamo": True}
        shapes.update(external_data=False, verbose=False)
    else:
        axes = {
            "input_ids": {0: "batch", 1: "sequence"},
            "position_ids": {0: "batch", 1: "sequence"},
            "attention_mask": {0: "batch", 1: "total"},
            "logits": {0: "batch", 1: "sequence"},
            **{n: {0: "batch", 2: "past"} for n in past_names},
            **{n: {0: "batch", 2: "total"} for n in present_names},
        }
        shapes = {"dynamic_axes": axes, "dynamo": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            FlatCache(model).eval(),  # a new module trains: export restores that mode, model's too
            (ids, mask, positions, *past),
            str(path),
            input_names=["input_ids", "attention_mask", "position_ids", *past_names],
            output_names=["logits", *present_names],
            opset_version=opset,
            **shapes,
        )
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a Hugging Face model folder (or hub id)")
    p.add_argument("out", type=Path, help="the .onnx file to write")
    p.add_argument(
        "--dynamo",
        action="store_true",
        help="torch's dynamo exporter (torch.export, needs onnxscript) instead of TorchScript's",
    )
    args = p.parse_args()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model, attn_implementation="eager", dtype=torch.float32
    ).eval()
    print(export_decoder(model, args.out, dynamo=args.dynamo))


if __name__ == "__main__":
    main()
