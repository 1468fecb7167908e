"""GGUF byte-level BPE vocabularies (``tokenizer.ggml.model`` "gpt2") under every
``tokenizer.ggml.pre`` trt_kv builds, against transformers' tokenizer loaded from the same file
(``AutoTokenizer.from_pretrained(folder, gguf_file=...)``).

The vocabulary is trained here with the ``tokenizers`` library on text without any split
(merges cross spaces, digits and punctuation), so each pre-tokenizer's split shows in the ids.
"""

import json

import numpy as np
import pytest
import transformers
from gguf_files import write_gguf
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from trt_kv.checkpoints import read_gguf
from trt_kv.checkpoints.tokenizer import GGUF_PRE_TOKENIZERS
from trt_kv.errors import ConfigError

CORPUS = [
    "Hello world, it's a test. I've been told he'll say 3.14159 and 1,000,000 or 2024-11-22!",
    "naïve café 你好世界 нещо на Български 🚀 ✅ emojis, I'M sure WE'LL see 333 33 3",
    "def f(x):\n    return x ** 2  # comment\n\n\tindented\r\n  spaces   here\n\n\n",
    "The quick brown fox jumps over the lazy dog 12345 67890 and 'quoted' words.",
]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER = "<think>"  # a user-defined token (type 4): kept whole, not special
TEXTS = [
    "Hello world",
    "  leading and trailing   ",
    "tabs\tand\nnewlines\n\n\nx\r\n",
    "I've been 'told' he's there, 'RE you sure? We'Ve a'lL",
    "3 33 333 3333 12345678 3.14 1,000",
    "naïve café 你好世界 🚀😶\u200d🌫️ ✅ нещо",
    "<|im_start|>user\nhi<|im_end|>\n<think>x</think>",
    "```py\r\nreturn x ** 2\n```",
    "",
]


@pytest.fixture(scope="module")
def vocabulary():
    """``(tokens, merges)`` of a 500-token byte-level BPE trained on ``CORPUS`` lines whole."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 10, trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = [*sorted(model["vocab"], key=model["vocab"].get), USER]
    return tokens, [" ".join(m) for m in model["merges"]]


def _write(folder, tokens, merges, pre, add_bos):
    types = [3 if t in SPECIAL else 4 if t == USER else 1 for t in tokens]
    meta = {
        "qwen2.block_count": 1,
        "qwen2.embedding_length": 8,
        "qwen2.attention.head_count": 2,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.add_bos_token": add_bos,
    }
    embed = {"token_embd.weight": np.zeros((len(tokens), 8), np.float32)}
    return write_gguf(folder / "tok.gguf", "qwen2", meta, embed)


# transformers' GGUF loader has no split for "smollm" and falls back to GPT-2's, which keeps
# digit runs whole; llama.cpp's smollm split (and SmolLM2's tokenizer.json) puts every digit
# apart (test_the_split_decides_the_ids; the real SmolLM2 vocabulary: test_smollm2_text).
HF_READS = sorted(set(GGUF_PRE_TOKENIZERS) - {"smollm"})


@pytest.mark.parametrize("add_bos", [False, True], ids=["no_bos", "bos"])
@pytest.mark.parametrize("pre", HF_READS)
def test_encodings_equal_transformers_tokenizer_from_the_same_file(
    vocabulary, tmp_path, pre, add_bos
):
    path = _write(tmp_path, *vocabulary, pre, add_bos)
    ours = read_gguf(path).tokenizer()
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
    assert (ours.encode("Hello")[0] == vocabulary[0].index("<|endoftext|>")) == add_bos


@pytest.mark.parametrize(
    ("pre", "pieces"),
    [("llama-bpe", ["12", "3", "4", "5"]), ("qwen2", list("12345")), ("smollm", list("12345"))],
)
def test_the_split_decides_how_digits_merge(vocabulary, tmp_path, pre, pieces):
    """The same vocabulary (it merges "12", not "123" nor "45") under each split: Llama 3's
    pieces are "123" and "45", Qwen2's and SmolLM's one digit each."""
    tokens, merges = vocabulary
    tokenizer = read_gguf(_write(tmp_path, tokens, merges, pre, False)).tokenizer()
    assert [tokens[i] for i in tokenizer.encode("12345")] == pieces


def test_unknown_pre_tokenizer_is_refused_naming_it(vocabulary, tmp_path):
    path = _write(tmp_path, *vocabulary, "tekken", False)
    with pytest.raises(ConfigError, match=r"tokenizer\.ggml\.pre: expected one of .*got 'tekken'"):
        read_gguf(path).tokenizer()
