"""One checkpoint in memory, whatever file it came from: a config, named arrays, the tokens
that end a reply, and a way to get the tokenizer.

Every reader (Hugging Face folder, GGUF file, the built-in default) produces a
:class:`Checkpoint`; the architecture (``trt_kv.models``) consumes it. Names and layouts are
Hugging Face's: ``config`` holds the keys of a ``config.json`` as transformers writes it,
``tensors`` the arrays under their ``model.layers.{i}...`` names, ``nn.Linear`` weights
``[out_features, in_features]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from trt_kv.errors import ConfigError, mismatch

if TYPE_CHECKING:
    from trt_kv.checkpoints.tokenizer import TextTokenizer
    from trt_kv.quantization import QuantizedMatrix


@dataclass
class Checkpoint:
    """A model as read from disk (or made up from a seed, when ``random`` is set)."""

    name: str  # short name for engine files: "smollm2-135m-instruct", a folder's name...
    config: dict  # config.json keys, as transformers writes them
    tensors: dict[str, np.ndarray]  # Hugging Face name -> array
    eos_token_ids: tuple[int, ...] = ()  # generation stops at any of these by default
    source: str = ""  # the file or folder read (for messages)
    random: bool = False  # seeded random weights, not a trained model
    # Hugging Face name -> the matrix as the file stores it quantized (GGUF; for engines
    # built with weights="keep"), beside its float values in ``tensors``
    quantized: dict[str, QuantizedMatrix] = field(default_factory=dict, repr=False)
    tokenizer_loader: Callable[[], TextTokenizer] | None = field(default=None, repr=False)
    _tokenizer: TextTokenizer | None = field(default=None, init=False, repr=False)

    def tokenizer(self) -> TextTokenizer:
        """The model's tokenizer (built on first use).

        Raises:
            ConfigError: the checkpoint has none (a folder without ``tokenizer.json``, random
                weights) or it cannot be built.
        """
        if self.tokenizer_loader is None:
            raise ConfigError(
                mismatch(
                    f"model {self.name}",
                    "a tokenizer (tokenizer.json in the folder, or a GGUF vocabulary)",
                    "",
                    "none; pass token ids (--prompt-ids) instead of text",
                )
            )
        if self._tokenizer is None:
            self._tokenizer = self.tokenizer_loader()
        return self._tokenizer


def eos_ids(value: object, what: str) -> tuple[int, ...]:
    """``eos_token_id`` as transformers writes it (an int, a list of ints, or null) -> ids.

    Raises:
        ConfigError: anything else (``what`` names the file and key).
    """
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not items or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items
    ):
        raise ConfigError(mismatch(what, "a token id >= 0 or a list of them", "", repr(value)))
    return tuple(dict.fromkeys(items))


def producible_eos(ids: tuple[int, ...], vocab_size: object, source: str) -> tuple[int, ...]:
    """``ids`` less those the vocabulary cannot produce (``>= vocab_size``: no logits row,
    so never generated and never an end), each dropped one said in one line on stderr (a
    ``save_pretrained`` GPT-2 of a small vocabulary keeps ``GPT2Config``'s default 50256).
    A ``vocab_size`` that is not an integer > 0 drops nothing (the config refuses it)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 0:
        return ids
    dropped = [i for i in ids if i >= vocab_size]
    if dropped:
        import sys

        print(
            f"trt_kv: note: {source}: eos_token_id {', '.join(map(str, dropped))} outside the "
            f"vocabulary [0, {vocab_size}): the model can never generate it, so it is not an "
            "end id here",
            file=sys.stderr,
        )
    return tuple(i for i in ids if i < vocab_size)


_BLOCK = 1 << 22  # elements checked at a time: a bounded temporary, warm in cache


def check_finite(name: str, array: np.ndarray, source: str) -> None:
    """Refuse a weight array holding NaN or infinities (a broken checkpoint would otherwise
    run and produce argmax-of-NaN tokens). Integer and bool arrays pass unchecked.

    Raises:
        ConfigError: naming ``source``, the tensor, its dtype and how many values are NaN
            and how many infinite.
    """
    if array.dtype.kind in "biu" or array.size == 0:
        return
    flat = array.reshape(-1)
    for start in range(0, flat.size, _BLOCK):
        if not np.isfinite(flat[start : start + _BLOCK]).all():
            break
    else:
        return
    nan = int(np.count_nonzero(np.isnan(flat)))
    inf = int(flat.size - nan - np.count_nonzero(np.isfinite(flat)))
    raise ConfigError(
        mismatch(
            f"{source}: {name}",
            "finite weights",
            "",
            f"{nan:,} NaN and {inf:,} infinite of {flat.size:,} {array.dtype} values",
        )
    )
