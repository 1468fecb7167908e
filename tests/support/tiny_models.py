"""Small model shapes shared by tests (import as ``from tiny_models import ...``)."""

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
