"""``trt-kv generate --model FILE.gguf`` on a family other than Llama, text in and text out,
in a fresh interpreter as a user runs it: a Qwen2 file with a byte-level BPE vocabulary (pre
"qwen2"), run on the interpreter of the built network, against transformers' model and
tokenizer loaded from the same file."""

import json

import numpy as np
import torch
import transformers

from tests.support.cli_user import run_cli
from tests.support.gguf_files import trained_vocabulary, write_family_gguf
from tests.support.hf_models import greedy_ids, save_random_model
from trt_kv.checkpoints.tokenizer import GGUF_PRE_TOKENIZERS

PROMPT = "Hello world, it's 2024!"
CORPUS = ["Hello world, it's a test of 2024 and 1,000 things.", "naïve café, the quick fox."]


def test_generate_on_a_qwen2_gguf_file_gives_transformers_text(tmp_path):
    pre = GGUF_PRE_TOKENIZERS["qwen2"]()
    tokens, merges = trained_vocabulary(CORPUS, pre, 300, special=["<|endoftext|>"])
    config = transformers.Qwen2Config(
        vocab_size=len(tokens),
        hidden_size=40,
        intermediate_size=72,
        num_hidden_layers=2,
        num_attention_heads=5,
        num_key_value_heads=1,
        initializer_range=0.2,
    )
    model = save_random_model(transformers.Qwen2ForCausalLM, config, tmp_path / "hf")
    path = write_family_gguf(
        tmp_path / "qwen2.gguf",
        model,
        "qwen2",
        dtype=np.float16,
        **{
            "tokenizer.ggml.pre": "qwen2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.token_type": [3] + [1] * (len(tokens) - 1),
            "tokenizer.ggml.eos_token_id": 0,
        },
    )
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32
    )
    prompt_ids = hf_tokenizer.encode(PROMPT)
    expected = greedy_ids(hf_model, [prompt_ids], 8)[0]

    out = run_cli(
        "generate",
        "--model",
        path,
        "--prompt",
        PROMPT,
        "--backend",
        "interpreter",
        "--dtype",
        "float32",
        "--max-new-tokens",
        "8",
        "--ignore-eos",
        "--json",
        "-q",
    )
    result = json.loads(out.stdout)
    assert result["ids"] == [expected]
    assert result["text"] == [hf_tokenizer.decode(expected, skip_special_tokens=True)]
