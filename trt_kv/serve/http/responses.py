"""A :class:`~trt_kv.serve.http.generation.Generation` in each endpoint's shapes: the whole
response, or a chunk per piece of a stream (chat: a first chunk with the role, then content
deltas; completions: text), logprobs in each API's shape, the usage chunk."""

from __future__ import annotations

from trt_kv.checkpoints.tokenizer import TextTokenizer
from trt_kv.serve.http.choice_text import token_text
from trt_kv.serve.http.generation import Generation, Piece
from trt_kv.serve.http.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Delta,
    Response,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from trt_kv.serve.scheduler import TokenEvent


class Format:
    """What both endpoints share: the response id, the model name, whether logprobs were
    asked for, and the tokenizer naming tokens."""

    def __init__(
        self, rid: str, model: str, tokenizer: TextTokenizer | None, logprobs: bool
    ) -> None:
        self.rid, self.model, self.tokenizer, self.logprobs = rid, model, tokenizer, logprobs

    def _top(self, token_id: int, logprob: float) -> TopLogprob:
        text = token_text(self.tokenizer, token_id)
        return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode()))

    def opening(self, n: int) -> list[Response]:
        """Chunks a stream starts with (none but chat's role)."""
        return []

    def chunk(self, piece: Piece) -> Response:
        raise NotImplementedError

    def whole(self, generation: Generation) -> Response:
        raise NotImplementedError

    def usage_chunk(self, usage: Usage) -> Response:
        raise NotImplementedError


class ChatFormat(Format):
    """``chat.completion`` and ``chat.completion.chunk``."""

    def _logprobs(self, events: list[TokenEvent]) -> ChatLogprobs | None:
        if not self.logprobs:
            return None
        content = []
        for e in events:
            top = self._top(e.token_id, e.logprob)
            alternatives = [self._top(i, lp) for i, lp in e.top_logprobs]
            content.append(TokenLogprob(**top.model_dump(), top_logprobs=alternatives))
        return ChatLogprobs(content=content)

    def opening(self, n: int) -> list[Response]:
        return [
            ChatCompletionChunk(
                id=self.rid,
                model=self.model,
                choices=[ChatChunkChoice(index=k, delta=Delta(role="assistant", content=""))],
            )
            for k in range(n)
        ]

    def chunk(self, piece: Piece) -> Response:
        events = [piece.token] if piece.token is not None else []
        choice = ChatChunkChoice(
            index=piece.choice,
            delta=Delta(content=piece.text or None),
            logprobs=self._logprobs(events) if events else None,
            finish_reason=piece.finish_reason,
        )
        return ChatCompletionChunk(id=self.rid, model=self.model, choices=[choice])

    def whole(self, generation: Generation) -> Response:
        choices = [
            ChatChoice(
                index=k,
                message=AssistantMessage(content=c.text.text),
                logprobs=self._logprobs(c.events),
                finish_reason=c.finish_reason,
            )
            for k, c in enumerate(generation.choices)
        ]
        return ChatCompletion(
            id=self.rid, model=self.model, choices=choices, usage=generation.usage()
        )

    def usage_chunk(self, usage: Usage) -> Response:
        return ChatCompletionChunk(id=self.rid, model=self.model, choices=[], usage=usage)


class CompletionFormat(Format):
    """``text_completion``, whole and as chunks (one shape for both)."""

    def _logprobs(self, events: list[TokenEvent], offset: int = 0) -> CompletionLogprobs | None:
        if not self.logprobs:
            return None
        out = CompletionLogprobs()
        for e in events:
            text = token_text(self.tokenizer, e.token_id)
            out.tokens.append(text)
            out.token_logprobs.append(e.logprob)
            out.top_logprobs.append({self._top(i, lp).token: lp for i, lp in e.top_logprobs})
            out.text_offset.append(offset)
            offset += len(text)
        return out

    def chunk(self, piece: Piece) -> Response:
        events = [piece.token] if piece.token is not None else []
        choice = CompletionChoice(
            index=piece.choice,
            text=piece.text,
            logprobs=self._logprobs(events) if events else None,
            finish_reason=piece.finish_reason,
        )
        return Completion(id=self.rid, model=self.model, choices=[choice])

    def whole(self, generation: Generation) -> Response:
        choices = [
            CompletionChoice(
                index=k,
                text=c.text.text,
                logprobs=self._logprobs(c.events),
                finish_reason=c.finish_reason,
            )
            for k, c in enumerate(generation.choices)
        ]
        return Completion(id=self.rid, model=self.model, choices=choices, usage=generation.usage())

    def usage_chunk(self, usage: Usage) -> Response:
        return Completion(id=self.rid, model=self.model, choices=[], usage=usage)
