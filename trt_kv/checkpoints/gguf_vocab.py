"""GGUF vocabularies (``tokenizer.ggml.*``) as ``tokenizers.Tokenizer`` objects, the way
llama.cpp tokenizes them:

- ``tokenizer.ggml.model == "gpt2"``: byte-level BPE with the file's merges, split by the
  pre-tokenizer ``tokenizer.ggml.pre`` names (:data:`GGUF_PRE_TOKENIZERS`); another name is
  refused.
- ``tokenizer.ggml.model == "llama"``: SentencePiece BPE (Llama 2, Mistral v0.1, Gemma,
  Phi-3): spaces written as "\u2581" (a leading one too, unless
  ``tokenizer.ggml.add_space_prefix`` is false, as Gemma's), the pair whose merged piece scores
  highest merged first (merges derived from ``tokenizer.ggml.scores``), characters outside the
  vocabulary as their ``<0xNN>`` byte tokens.

Control tokens (type 3) are special (kept whole, dropped by decode); user-defined ones (type 4,
like ``<think>``) are plain added tokens, kept whole and kept by decode.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from trt_kv.errors import ConfigError, mismatch

# GGUF token types (llama.cpp's llama_token_type): 3 = control (special), 4 = user defined.
_CONTROL, _USER_DEFINED = 3, 4


def _byte_level_pre(digits_apart: bool) -> object:
    """GPT-2's split and byte alphabet; ``digits_apart`` first splits off every digit."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if not digits_apart:
        return byte_level
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])


def _split_pre(regex: str) -> object:
    """Split by ``regex`` (each match a piece), then the byte alphabet without GPT-2's split."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# The splits of llama.cpp's llama-vocab.cpp (LLAMA_VOCAB_PRE_TYPE_LLAMA3 and _QWEN2), written
# as the models' tokenizer.json write them (``(?i:...)`` where llama.cpp spells out the cases):
# Llama 3 keeps runs of up to 3 digits, Qwen2 splits every digit off.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# tokenizer.ggml.pre -> the pre-tokenizer its merges were learned with (llama.cpp's names for
# each, from llama-vocab.cpp). "smollm" splits every digit off, then applies GPT-2's split (as
# SmolLM2's tokenizer.json does).
GGUF_PRE_TOKENIZERS = {
    "default": lambda: _byte_level_pre(False),
    "gpt2": lambda: _byte_level_pre(False),
    "smollm": lambda: _byte_level_pre(True),
    "llama3": lambda: _split_pre(_LLAMA3_SPLIT),
    "llama-v3": lambda: _split_pre(_LLAMA3_SPLIT),
    "llama-bpe": lambda: _split_pre(_LLAMA3_SPLIT),
    "smaug-bpe": lambda: _split_pre(_LLAMA3_SPLIT),
    "qwen2": lambda: _split_pre(_QWEN2_SPLIT),
    "deepseek-r1-qwen": lambda: _split_pre(_QWEN2_SPLIT),
}


_SPACE = "\u2581"  # SentencePiece's visible space


def _byte_level_bpe(pre: str, tokens: Sequence[str], merges: Sequence[str]) -> Tokenizer:
    if pre not in GGUF_PRE_TOKENIZERS:
        raise ConfigError(
            mismatch("tokenizer.ggml.pre", "one of", sorted(GGUF_PRE_TOKENIZERS), repr(pre))
        )
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    try:
        tokenizer = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False))
    except Exception as err:  # tokenizers raises a plain Exception: "Token `ab` out of vocabulary"
        raise ConfigError(
            mismatch("tokenizer.ggml.merges", "merges of tokens in the vocabulary", "", err)
        ) from err
    tokenizer.pre_tokenizer = GGUF_PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def score_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE as merges: every way to cut a piece into two pieces of the
    vocabulary, the best-scoring merged piece first (ties: longer left part, then longer right
    part, then vocabulary order)."""
    index = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for i, piece in enumerate(tokens):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in index and right in index:
                key = (-scores[i], -len(left), -len(right), i, index[left], index[right])
                ranked.append((key, (left, right)))
    ranked.sort(key=lambda item: item[0])
    return [pair for _, pair in ranked]


def _sentencepiece_bpe(
    tokens: Sequence[str], scores: Sequence[float], unk: int | None, add_space_prefix: bool
) -> Tokenizer:
    if len(scores) != len(tokens):
        raise ConfigError(
            mismatch("tokenizer.ggml.scores", "one per token", len(tokens), len(scores))
        )
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = score_merges(tokens, scores)
    tokenizer = Tokenizer(
        models.BPE(
            vocab,
            merges,
            unk_token=None if unk is None else tokens[unk],
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    spaces = [normalizers.Replace(" ", _SPACE)]
    prefix = [normalizers.Prepend(_SPACE)] if add_space_prefix else []
    tokenizer.normalizer = normalizers.Sequence(prefix + spaces)
    strip = [decoders.Strip(" ", 1, 0)] if add_space_prefix else []
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return tokenizer


def _space_pieces(tokens: Sequence[str]) -> set[int]:
    """Ids of the pieces Gemma's converter stores with real spaces ("  "): in the
    SentencePiece vocabulary they are "\u2581\u2581"..., merged like any other piece (as
    transformers respells them for Gemma), not added tokens."""
    return {i for i, t in enumerate(tokens) if t and not t.strip(" ")}


def gguf_vocab_tokenizer(
    *,
    model: str,
    pre: str,
    tokens: Sequence[str],
    merges: Sequence[str],
    scores: Sequence[float],
    token_types: Sequence[int],
    unk: int | None,
    add_space_prefix: bool,
    space_pieces: bool = False,
) -> Tokenizer:
    """The tokenizer a GGUF vocabulary describes (see the module docstring), without BOS;
    ``space_pieces``: pieces of only spaces are stored with real spaces (Gemma's files).

    Raises:
        ConfigError: a ``tokenizer.ggml.model`` other than "gpt2" and "llama", a
            ``tokenizer.ggml.pre`` not in :data:`GGUF_PRE_TOKENIZERS` (byte-level BPE), a
            SentencePiece vocabulary without one score per token.
    """
    spaces = _space_pieces(tokens) if space_pieces and model == "llama" else set()
    spelled = [_SPACE * len(t) if i in spaces else t for i, t in enumerate(tokens)]
    if model == "gpt2":
        tokenizer = _byte_level_bpe(pre, spelled, merges)
    elif model == "llama":
        tokenizer = _sentencepiece_bpe(spelled, scores, unk, add_space_prefix)
    else:
        raise ConfigError(
            mismatch(
                "tokenizer.ggml.model",
                "one of",
                ["gpt2 (byte-level BPE)", "llama (SentencePiece BPE)"],
                repr(model),
            )
        )
    for kind, add in (
        (_CONTROL, tokenizer.add_special_tokens),
        (_USER_DEFINED, tokenizer.add_tokens),
    ):
        add(
            [
                AddedToken(t, special=kind == _CONTROL, normalized=False)
                for i, (t, k) in enumerate(zip(spelled, token_types))
                if k == kind and i not in spaces
            ]
        )
    return tokenizer
