"""GGUF vocabularies against transformers' tokenizer loaded from the same file
(``AutoTokenizer.from_pretrained(folder, gguf_file=...)``), on tricky text (spaces, digits,
contractions, unicode, newlines, special and user-defined tokens): byte-level BPE
(``tokenizer.ggml.model`` "gpt2") under every ``tokenizer.ggml.pre`` trt_kv builds, and
SentencePiece BPE ("llama") as Phi-3, Gemma and Llama 2 files carry it.

The vocabularies are trained here with the ``tokenizers`` library: the byte-level one on text
without any split (merges cross spaces, digits and punctuation), so each pre-tokenizer's split
shows in the ids.
"""

import numpy as np
import pytest
import transformers
from tokenizers import pre_tokenizers

from tests.support.gguf_files import trained_vocabulary, write_gguf
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
    whole = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokens, merges = trained_vocabulary(CORPUS, whole, 500, special=SPECIAL)
    return [*tokens, USER], merges


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


# -- SentencePiece BPE (tokenizer.ggml.model "llama": Llama 2, Mistral v0.1, Gemma, Phi-3) --

SPM_SPECIAL = ["<unk>", "<s>", "</s>"]  # types 2 (unknown), 3, 3
BYTES = [f"<0x{b:02X}>" for b in range(256)]  # type 6: characters outside the vocabulary


@pytest.fixture(scope="module")
def sentencepiece():
    """``(tokens, scores, types)``: pieces trained by BPE over "\\u2581"-spelled text, each
    scored by its merge order (the earlier, the higher), after the specials and byte tokens."""
    metaspace = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    trained, _ = trained_vocabulary(CORPUS, metaspace, 300, alphabet=False)
    pieces = [t for t in trained if t != "\u2581\u2581"]
    tokens = [*SPM_SPECIAL, *BYTES, *pieces]
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(pieces))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    return tokens, scores, types


def _write_spm(folder, tokens, scores, types, arch, add_space_prefix):
    if arch.startswith("gemma"):  # a piece of two spaces, stored as Gemma's converter does
        tokens, scores, types = [*tokens, "  "], [*scores, -1e4], [*types, 4]
    meta = {
        f"{arch}.block_count": 1,
        f"{arch}.embedding_length": 8,
        f"{arch}.attention.head_count": 2,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    if add_space_prefix is not None:
        meta["tokenizer.ggml.add_space_prefix"] = add_space_prefix
    embed = {"token_embd.weight": np.zeros((len(tokens), 8), np.float32)}
    return write_gguf(folder / f"{arch}.gguf", arch, meta, embed)


# (trt_kv's architecture, transformers', add_space_prefix). transformers' GGUF loader has no
# gemma (only gemma2/3, whose tokenizer builder is the same): its file says gemma2.
SPM_FILES = [("phi3", "phi3", None), ("gemma", "gemma2", False), ("llama", "llama", None)]


@pytest.mark.parametrize(("arch", "hf_arch", "prefix"), SPM_FILES, ids=["phi3", "gemma", "llama"])
def test_sentencepiece_encodings_equal_transformers_tokenizer(
    sentencepiece, tmp_path, arch, hf_arch, prefix
):
    (tmp_path / "ours").mkdir()
    ours = read_gguf(_write_spm(tmp_path / "ours", *sentencepiece, arch, prefix)).tokenizer()
    path = _write_spm(tmp_path, *sentencepiece, hf_arch, prefix)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    # For llama files transformers writes the leading space with Metaspace, which adds no
    # "\u2581" before text that starts with a space; llama.cpp (and Llama 2's tokenizer.json:
    # Prepend + Replace) always add one: test_leading_spaces_get_one_more_piece.
    texts = [t for t in TEXTS if arch != "llama" or not t.startswith(" ")]
    for text in texts:
        ids = ours.encode(text)
        assert ids == theirs.encode(text), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text


def test_leading_spaces_get_one_more_piece(sentencepiece, tmp_path):
    tokens = sentencepiece[0]
    ours = read_gguf(_write_spm(tmp_path, *sentencepiece, "llama", None)).tokenizer()
    assert [tokens[i] for i in ours.encode("  t")] == ["<s>", "\u2581", "\u2581", "\u2581t"]
    assert ours.decode(ours.encode("  t")) == "  t"


def test_unknown_tokenizer_model_is_refused_naming_it(tmp_path):
    meta = {"qwen2.block_count": 1, "tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["a"]}
    path = write_gguf(tmp_path / "t5.gguf", "qwen2", meta, {})
    with pytest.raises(ConfigError, match=r"tokenizer\.ggml\.model: expected one of .*got 't5'"):
        read_gguf(path).tokenizer()


def test_special_token_id_outside_the_vocabulary_is_refused_naming_its_key(tmp_path):
    meta = {
        "qwen2.block_count": 1,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": ["a", "b"],
        "tokenizer.ggml.padding_token_id": 2,
    }
    path = write_gguf(tmp_path / "pad.gguf", "qwen2", meta, {})
    with pytest.raises(
        ConfigError,
        match=r"tokenizer\.ggml\.padding_token_id: expected a token id in \[0, 2\), got 2",
    ):
        read_gguf(path).tokenizer()
