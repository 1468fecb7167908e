"""Text <-> token ids for a checkpoint: a ``tokenizers.Tokenizer`` plus BOS/EOS and the chat
template, from a Hugging Face folder (``tokenizer.json``) or from a GGUF vocabulary.

tok = TextTokenizer.from_folder("path/to/model")
ids = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
text = tok.decode(ids)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
)

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


class TextTokenizer:
    """Encodes text (BOS added when the model asks for it), renders chat templates as
    transformers does (jinja2, sandboxed), decodes ids (special tokens skipped)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        chat_template: str | None = None,
        special_tokens: dict[str, str | None] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})  # "bos_token" -> "<|im_start|>"...

    # -- text -> ids --------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``text`` -> ids (with the model's BOS when it adds one and ``add_special_tokens``)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text the model's chat template makes of ``messages``.

        Raises:
            ConfigError: the model has no chat template, or rendering it fails.
        """
        if not self.chat_template:
            raise ConfigError(mismatch("--chat", "a model with a chat template", "", "none"))
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = lambda x, indent=None: json.dumps(
            x, ensure_ascii=False, indent=indent
        )
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            template = env.from_string(self.chat_template)
            return template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except jinja2.exceptions.TemplateError as err:
            raise ConfigError(mismatch("chat template", "to render", "", err)) from err

    def encode_chat(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Ids of the rendered chat (the template writes its own special tokens)."""
        text = self.apply_chat_template(messages, add_generation_prompt)
        return self.encode(text, add_special_tokens=False)

    # -- ids -> text --------------------------------------------------------------------------
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def stream(self) -> decoders.DecodeStream:
        """A decoder fed one id at a time (``.step(tokenizer, id)`` -> new text or None), so
        characters split over several byte-level tokens print once whole."""
        return decoders.DecodeStream(skip_special_tokens=True)

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder: str | Path) -> TextTokenizer:
        """``tokenizer.json`` (+ ``tokenizer_config.json`` and ``chat_template.jinja`` when
        present) as transformers saves them.

        Raises:
            ConfigError: no ``tokenizer.json``, or a file that does not parse.
        """
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(mismatch(str(path), "a file", "", "missing"))
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises plain Exception on a bad file
            raise ConfigError(mismatch(str(path), "a tokenizer.json", "", err)) from err
        settings: dict = {}
        config_path = folder / "tokenizer_config.json"
        if config_path.is_file():
            try:
                settings = json.loads(config_path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise ConfigError(mismatch(str(config_path), "JSON", "", err)) from err
        template = settings.get("chat_template")
        jinja = folder / "chat_template.jinja"  # transformers >= 4.47 writes it apart
        if jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        special = {k: _token_text(settings.get(k)) for k in _SPECIAL_NAMES}
        return cls(tokenizer, chat_template=template, special_tokens=special)

    @classmethod
    def from_gguf_vocab(
        cls,
        *,
        model: str,
        pre: str,
        tokens: Sequence[str],
        merges: Sequence[str],
        token_types: Sequence[int],
        special_ids: dict[str, int | None],
        add_bos: bool,
        chat_template: str | None,
    ) -> TextTokenizer:
        """A byte-level BPE tokenizer from a GGUF's ``tokenizer.ggml.*`` metadata.

        Args:
            model: ``tokenizer.ggml.model``; only "gpt2" (byte-level BPE) is built.
            pre: ``tokenizer.ggml.pre``, one of ``GGUF_PRE_TOKENIZERS``.
            special_ids: "bos_token"/"eos_token"/"unk_token"/"pad_token" -> id or None.

        Raises:
            ConfigError: another tokenizer model or pre-tokenizer.
        """
        if model != "gpt2":
            raise ConfigError(mismatch("tokenizer.ggml.model", "", "gpt2 (byte-level BPE)", model))
        if pre not in GGUF_PRE_TOKENIZERS:
            raise ConfigError(
                mismatch("tokenizer.ggml.pre", "one of", sorted(GGUF_PRE_TOKENIZERS), repr(pre))
            )
        vocab = {t: i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        tokenizer = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False))
        tokenizer.pre_tokenizer = GGUF_PRE_TOKENIZERS[pre]()
        tokenizer.decoder = decoders.ByteLevel()
        # both kept whole; control tokens are special (dropped by decode), user-defined ones
        # (like <think>) are plain added tokens, as transformers and llama.cpp treat them
        for kind, add in (
            (_CONTROL, tokenizer.add_special_tokens),
            (_USER_DEFINED, tokenizer.add_tokens),
        ):
            add(
                [
                    AddedToken(t, special=kind == _CONTROL, normalized=False)
                    for t, k in zip(tokens, token_types)
                    if k == kind
                ]
            )
        bos = special_ids.get("bos_token")
        if add_bos and bos is not None:
            tokenizer.post_processor = processors.TemplateProcessing(
                single=f"{tokens[bos]} $A",
                pair=f"{tokens[bos]} $A $B",
                special_tokens=[(tokens[bos], bos)],
            )
        special = {k: (None if i is None else tokens[i]) for k, i in special_ids.items()}
        return cls(tokenizer, chat_template=chat_template, special_tokens=special)


_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None
