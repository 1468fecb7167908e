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
