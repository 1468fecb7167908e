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

from tokenizers import Tokenizer, decoders, processors

from trt_kv.checkpoints.gguf_vocab import GGUF_PRE_TOKENIZERS, gguf_vocab_tokenizer
from trt_kv.errors import ArgumentError, ConfigError, mismatch


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
        """``text`` -> ids (with the model's BOS when it adds one and ``add_special_tokens``).

        Raises:
            ArgumentError: ``text`` not a str, or holding characters UTF-8 cannot encode
                (a command-line argument of bytes that are not UTF-8 arrives as lone
                surrogates).
        """
        if not isinstance(text, str):
            raise ArgumentError(mismatch("text", "a str", "", type(text).__name__))
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ArgumentError(
                mismatch("text", "UTF-8 text", "", f"{text[:40]!r} (bytes that are not UTF-8)")
            ) from err
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def apply_chat_template(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The prompt text the model's chat template makes of ``messages``.

        Raises:
            ConfigError: the model has no chat template, or rendering it fails (a jinja
                error, or any exception the template's expressions raise).
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
        except Exception as err:  # the template's own expression failed: {{ 1/0 }}...
            raise ConfigError(
                mismatch("chat template", "to render", "", f"{type(err).__name__}: {err}")
            ) from err

    def encode_chat(
        self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Ids of the rendered chat (the template writes its own special tokens)."""
        text = self.apply_chat_template(messages, add_generation_prompt)
        return self.encode(text, add_special_tokens=False)

    # -- ids -> text --------------------------------------------------------------------------
    def unknown(self, ids: Sequence[int]) -> list[int]:
        """The ids of ``ids`` the tokenizer has no token for, in order, once each (a model's
        vocabulary may be padded past its tokenizer's: Phi-3's 32064 for 32011 tokens)."""
        to_token = self.tokenizer.id_to_token
        return list(dict.fromkeys(i for i in map(int, ids) if to_token(i) is None))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``; an id the tokenizer lacks is shown as ``<|id:N|>`` (see
        :func:`unknown_id_text`), never dropped."""
        ids = [int(i) for i in ids]
        unknown = set(self.unknown(ids))
        if not unknown:
            return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        text, run = [], []
        for i in [*ids, None]:
            if i is not None and i not in unknown:
                run.append(i)
                continue
            text.append(self.tokenizer.decode(run, skip_special_tokens=skip_special_tokens))
            run = []
            if i is not None:
                text.append(unknown_id_text(i))
        return "".join(text)

    def stream(self) -> TextStream:
        """A decoder fed one id at a time (``.step(id)`` -> new text or None), so characters
        split over several byte-level tokens print once whole."""
        return TextStream(self.tokenizer)

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder: str | Path) -> TextTokenizer:
        """``tokenizer.json`` (+ ``tokenizer_config.json`` and ``chat_template.jinja`` when
        present) as transformers saves them.

        Raises:
            ConfigError: no ``tokenizer.json``, a file that does not parse,
                ``tokenizer_config.json`` not a JSON object, ``chat_template.jinja`` not
                UTF-8.
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
            if not isinstance(settings, dict):
                got = type(settings).__name__
                raise ConfigError(mismatch(str(config_path), "a JSON object", "", got))
        template = settings.get("chat_template")
        jinja = folder / "chat_template.jinja"  # transformers >= 4.47 writes it apart
        if jinja.is_file():
            try:
                template = jinja.read_text(encoding="utf-8")
            except UnicodeDecodeError as err:
                raise ConfigError(mismatch(str(jinja), "UTF-8 text", "", err)) from err
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
        scores: Sequence[float] = (),
        add_space_prefix: bool = True,
        space_pieces: bool = False,
    ) -> TextTokenizer:
        """A tokenizer from a GGUF's ``tokenizer.ggml.*`` metadata (see
        :func:`~trt_kv.checkpoints.gguf_vocab.gguf_vocab_tokenizer`).

        Args:
            model: ``tokenizer.ggml.model``: "gpt2" (byte-level BPE) or "llama" (SentencePiece
                BPE, merges from ``scores``).
            pre: ``tokenizer.ggml.pre``, one of ``GGUF_PRE_TOKENIZERS`` (byte-level BPE only).
            special_ids: "bos_token"/"eos_token"/"unk_token"/"pad_token" -> id or None.
            add_space_prefix: ``tokenizer.ggml.add_space_prefix`` (SentencePiece only).
            space_pieces: pieces of only spaces are stored with real spaces (Gemma's files).

        Raises:
            ConfigError: another tokenizer model or pre-tokenizer.
        """
        tokenizer = gguf_vocab_tokenizer(
            model=model,
            pre=pre,
            tokens=tokens,
            merges=merges,
            scores=scores,
            token_types=token_types,
            unk=special_ids.get("unk_token"),
            add_space_prefix=add_space_prefix,
            space_pieces=space_pieces,
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


def unknown_id_text(token_id: int) -> str:
    """How an id the tokenizer has no token for is shown in text: ``<|id:61|>``."""
    return f"<|id:{token_id}|>"


class TextStream:
    """Streaming decode of one sequence; an id the tokenizer lacks comes out as
    :func:`unknown_id_text` (``tokenizers``' ``DecodeStream`` returns None for it)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.decoder = decoders.DecodeStream(skip_special_tokens=True)

    def step(self, token_id: int) -> str | None:
        """The new text ``token_id`` completes, or None while a character is incomplete."""
        if self.tokenizer.id_to_token(int(token_id)) is None:
            return unknown_id_text(int(token_id))
        return self.decoder.step(self.tokenizer, int(token_id))


_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


__all__ = ["GGUF_PRE_TOKENIZERS", "TextTokenizer"]
