"""Random-weight Hugging Face models written with ``save_pretrained``, and their greedy ids
(import as ``from hf_models import ...``)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from trt_kv.models.llama import LlamaConfig


def hf_config_args(config: LlamaConfig, **overrides: object) -> dict:
    """Hugging Face config arguments of the same model as ``config``, then ``overrides``."""
    args = config.to_json()
    scaling = args.pop("rope_scaling")
    rope = {"rope_type": "default", "rope_theta": args.pop("rope_theta")}
    if scaling is not None:
        rope.update(rope_type="llama3", **scaling)
    return {**args, "rope_parameters": rope, **overrides}


def save_random_model(
    model_class: type, config: transformers.PretrainedConfig, folder: Path, seed: int = 0
) -> object:
    """``model_class(config)`` with seeded random weights (RMSNorm weights and biases
    perturbed from their initial 1 or 0 so they matter), saved to ``folder``; returns the model
    in eval mode."""
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", ".bias")):
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model


def greedy_ids(model: object, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Hugging Face ``generate`` ids, one unpadded prompt at a time, never stopping early."""
    out = []
    for p in prompts:
        ids = model.generate(
            torch.tensor([p]),
            attention_mask=torch.ones(1, len(p), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=None,
            pad_token_id=0,
        )
        out.append(ids[0, len(p) :].tolist())
    return out
