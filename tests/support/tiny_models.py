"""Small model shapes shared by tests (``from tests.support.tiny_models import TINY_GQA``).

Every tiny Llama config a test builds comes from here: a named shape below, or
:func:`tiny_llama` for a test's own variation of ``TINY_GQA``, named where it is used."""

import dataclasses

import numpy as np

from trt_kv.models.llama import LlamaConfig

# GQA 4:2, head_dim 8, two layers: the smallest shape that exercises every block.
TINY_GQA = LlamaConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
)


def tiny_llama(**overrides: object) -> LlamaConfig:
    """``TINY_GQA`` with ``overrides`` (any ``LlamaConfig`` field)."""
    return dataclasses.replace(TINY_GQA, **overrides)


# TINY_GQA with a vocabulary of 97 and a wider MLP (the session tests' prompts use ids to 61).
TINY_GQA_V97 = tiny_llama(vocab_size=97, intermediate_size=64)

# Heads of 16: D = 64 (the GPU runtime's engines).
WIDE_GQA = tiny_llama(vocab_size=97, hidden_size=64, intermediate_size=128, head_dim=16)

# GQA 6:2, untied head; query width 6 * 8 = 48 = D (the Llama network's oracle tests).
SMALL_GQA = tiny_llama(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=72,
    num_attention_heads=6,
    tie_word_embeddings=False,
)

# One layer, one KV head of 8 values: with float16 and S_max = 10, cache slots of 160 bytes.
ONE_KV_HEAD = tiny_llama(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)


def slow_to_build(layers: int) -> LlamaConfig:
    """A shape whose TensorRT build takes seconds (16 layers: time to press Ctrl-C in it)."""
    return tiny_llama(
        vocab_size=512, hidden_size=128, intermediate_size=256, head_dim=32,
        num_hidden_layers=layers,
    )  # fmt: skip


# A checkpoint small enough to write in a test: GQA (4 query heads, 2 KV heads), untied.
TINY_CHECKPOINT = tiny_llama(
    vocab_size=11, hidden_size=8, intermediate_size=12, head_dim=2, tie_word_embeddings=False
)
TINY_CHECKPOINT_TIED = dataclasses.replace(TINY_CHECKPOINT, tie_word_embeddings=True)

# Hugging Face tensor name -> shape for TINY_CHECKPOINT (V=11, D=8, F=12, q = 4 * 2, kv = 2 * 2).
TINY_CHECKPOINT_SHAPES = {
    "model.embed_tokens.weight": (11, 8),
    "model.norm.weight": (8,),
    "lm_head.weight": (11, 8),
    **{
        f"model.layers.{i}.{name}": shape
        for i in range(2)
        for name, shape in {
            "input_layernorm.weight": (8,),
            "self_attn.q_proj.weight": (8, 8),
            "self_attn.k_proj.weight": (4, 8),
            "self_attn.v_proj.weight": (4, 8),
            "self_attn.o_proj.weight": (8, 8),
            "post_attention_layernorm.weight": (8,),
            "mlp.gate_proj.weight": (12, 8),
            "mlp.up_proj.weight": (12, 8),
            "mlp.down_proj.weight": (8, 12),
        }.items()
    },
}


def tiny_checkpoint_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """TINY_CHECKPOINT's Hugging Face tensors, float32 standard normal (seeded)."""
    rng = np.random.default_rng(seed)
    return {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in TINY_CHECKPOINT_SHAPES.items()
    }


# The same kind of shape as a Hugging Face config.json (a checkpoint folder's config).
TINY_HF_CONFIG = {
    "model_type": "llama",
    "vocab_size": 97,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "max_position_embeddings": 64,
    "hidden_act": "silu",
}
