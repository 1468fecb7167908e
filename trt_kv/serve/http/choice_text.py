"""One choice's text as its tokens arrive: detokenized a token at a time (whole characters
only, as ``trt-kv generate`` streams), stop strings matched on that text and cut, never
echoed. Text that could still begin a stop string is held back until it cannot."""

from __future__ import annotations

from collections.abc import Sequence

from trt_kv.checkpoints.tokenizer import TextTokenizer, unknown_id_text


class ChoiceText:
    """Text of one choice. :meth:`push` each token id; it returns the text now released
    (``""`` while held); :attr:`stopped` turns True when a stop string appeared (the text
    before it released, the rest dropped); :meth:`flush` releases what is held at the end.

    ``tokenizer`` None (an engine without one): each id reads ``<|id:N|>``."""

    def __init__(self, tokenizer: TextTokenizer | None, stops: Sequence[str] = ()) -> None:
        self.decoder = tokenizer.stream() if tokenizer is not None else None
        self.stops = tuple(stops)
        self.hold = max(map(len, self.stops), default=1) - 1  # a stop's prefix can hide here
        self.text = ""  # released
        self.held = ""
        self.decoded = 0  # characters decoded so far (released, held, or cut)
        self.stopped = False

    def push(self, token_id: int) -> str:
        """The text released by ``token_id`` (nothing once stopped)."""
        if self.stopped:
            return ""
        piece = self.decoder.step(token_id) if self.decoder else unknown_id_text(token_id)
        self.decoded += len(piece or "")
        self.held += piece or ""
        found = [i for i in (self.held.find(s) for s in self.stops) if i >= 0]
        if found:
            self.stopped = True
            return self._release(min(found), drop_rest=True)
        return self._release(max(0, len(self.held) - self.hold))

    def flush(self) -> str:
        """The held text, released at the choice's end (it began no stop string)."""
        return "" if self.stopped else self._release(len(self.held))

    def _release(self, upto: int, drop_rest: bool = False) -> str:
        out = self.held[:upto]
        self.held = "" if drop_rest else self.held[upto:]
        self.text += out
        return out


def token_text(tokenizer: TextTokenizer | None, token_id: int) -> str:
    """One token's own text (special tokens shown), as logprobs name it."""
    if tokenizer is None:
        return unknown_id_text(token_id)
    return tokenizer.decode([token_id], skip_special_tokens=False)
