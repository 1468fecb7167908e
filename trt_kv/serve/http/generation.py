"""One submitted request's token events made into text pieces per choice: detokenized, stop
strings cut (the ticket cancelled with reason ``"stop"`` once every choice has ended), counted
(``usage``, the metrics) and timed (time to first token, between tokens). What the
endpoints render, streamed or whole (:mod:`trt_kv.serve.http.responses`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from trt_kv.checkpoints.tokenizer import TextTokenizer
from trt_kv.serve.http.choice_text import ChoiceText
from trt_kv.serve.http.metrics import ServerMetrics
from trt_kv.serve.http.protocol import PromptTokensDetails, Usage
from trt_kv.serve.scheduler import EngineLoop, Ticket, TokenEvent

STOP = "stop"  # OpenAI's finish_reason for an end token or a stop string


@dataclass
class Piece:
    """What one event of choice ``choice`` adds: released ``text``, the ``token`` event
    (for its logprobs; None when the event carried no token), and ``finish_reason`` /
    ``error`` when the choice ended with it."""

    choice: int
    text: str
    token: TokenEvent | None = None
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class ChoiceState:
    text: ChoiceText
    tokens: int = 0
    last: float | None = None  # time of the last token
    finish_reason: str | None = None
    error: str | None = None
    events: list[TokenEvent] = field(default_factory=list)  # tokens, for logprobs


class Generation:
    """The events of ``ticket`` as :class:`Piece` s (:meth:`pieces`), each choice's text
    through :class:`ChoiceText` with ``stops``; ``started`` (``time.monotonic()``) is when
    the request arrived."""

    def __init__(
        self,
        loop: EngineLoop,
        ticket: Ticket,
        tokenizer: TextTokenizer | None,
        stops: Sequence[str],
        metrics: ServerMetrics,
        started: float,
    ) -> None:
        self.loop, self.ticket, self.metrics, self.started = loop, ticket, metrics, started
        self.choices = [ChoiceState(ChoiceText(tokenizer, stops)) for _ in range(ticket.n)]
        metrics.prompt_tokens.inc(ticket.prompt_tokens)

    async def pieces(self) -> AsyncIterator[Piece]:
        """Each event as a piece, until every choice ended. Closing this iterator early (a
        client gone) closes the loop's event iterator, which cancels the ticket."""
        try:
            async with aclosing(self.loop.events(self.ticket)) as events:
                async for event in events:
                    state = self.choices[event.choice]
                    if state.finish_reason is not None:
                        continue  # ended by a stop string: its later tokens are not shown
                    yield self._piece(event, state)
                    if all(c.finish_reason is not None for c in self.choices):
                        if not self.ticket.done:  # a stop string ended the last choice
                            self.loop.cancel(self.ticket, STOP)
                        return
        finally:
            self.metrics.cached_tokens.inc(self.ticket.cached_tokens)

    def _piece(self, event: TokenEvent, state: ChoiceState) -> Piece:
        text, token = "", None
        if event.token_id is not None:
            self._count(state)
            state.events.append(event)
            text, token = state.text.push(event.token_id), event
        finish = STOP if state.text.stopped else event.finish_reason
        if finish is not None:
            text += state.text.flush()
            state.finish_reason, state.error = finish, event.error
        return Piece(event.choice, text, token, finish, event.error if finish else None)

    def _count(self, state: ChoiceState) -> None:
        now = time.monotonic()
        if state.last is None:
            self.metrics.first_token.observe(now - self.started)
        else:
            self.metrics.inter_token.observe(now - state.last)
        state.last = now
        state.tokens += 1
        self.metrics.generated_tokens.inc()

    def error(self) -> str | None:
        """The first choice's error, if a choice ended with one."""
        return next((c.error or "failed" for c in self.choices if c.finish_reason == "error"), None)

    def usage(self) -> Usage:
        """Exact: the prompt's tokens (those a slot held already as cached), and every
        token each choice generated up to its end (a stop string's last token included)."""
        generated = sum(c.tokens for c in self.choices)
        cached = self.ticket.cached_tokens
        return Usage(
            prompt_tokens=self.ticket.prompt_tokens,
            completion_tokens=generated,
            total_tokens=self.ticket.prompt_tokens + generated,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )
