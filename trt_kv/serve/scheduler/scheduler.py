"""Continuous batching over one :class:`~trt_kv.runtime.session.Session`: requests wait in a
bounded queue, take free slots at step boundaries, are prefilled one chunk per step, and
decode together, each sequence in its own slot at its own length.

A step boundary (:meth:`Scheduler.step`) is, in order: the cancellations asked since the last
one; the head of the queue admitted when a prefill is not under way and ``n`` slots are free;
one decode step of every running sequence (one backend step over the window of their slots,
:meth:`Session.step_slots`: idle slots between them take a pad token, nothing is copied);
then at most one prefill chunk of ``prefill_chunk`` tokens of the admitted request, as a
backend step of its own. Two steps, not one padded step (a step's rows are padded to its
widest): on the interpreter (scripts/bench_serve_steps.py, default model, float16) a padded
step of 1 x 128 + 7 x 1 tokens took 2.6x a 128-token chunk plus a decode step of 8 (the issue
measured 6.4x: 1460 ms against 191 + 39 ms; docs/decisions.md, "the server's scheduler"). A
running stream so waits at most one chunk plus one decode step per token.

Failures stay with their request: a prefill chunk that raises ends its request with
``finish_reason`` "error" and the message; a decode step that raises ends every request of
that step with it (one shared backend step: which row failed is unknown), and their slots
are reset. The scheduler and the other requests go on.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from trt_kv.build_defaults import MAX_QUEUE, PREFILL_CHUNK
from trt_kv.errors import (
    ArgumentError,
    ClosedError,
    LimitError,
    QueueFullError,
    check_int,
    mismatch,
)
from trt_kv.runtime.cache_state import check_token_ids, id_array
from trt_kv.runtime.generate import stop_ids
from trt_kv.runtime.session import Session
from trt_kv.serve.scheduler.choice import SEED_BITS, Choice
from trt_kv.serve.scheduler.params import SamplingParams, TokenEvent
from trt_kv.serve.scheduler.slots import SlotTable
from trt_kv.serve.scheduler.ticket import SchedulerStats, Ticket


@dataclass
class _Request:
    """A request inside the scheduler: its ticket, seed, slots (the first prefills) and
    choices (made when its prefill ends)."""

    ticket: Ticket
    seed: int
    slots: list[int] = field(default_factory=list)
    fed: int = 0  # prompt tokens in slots[0]'s cache
    choices: list[Choice] = field(default_factory=list)


def _windows(slots: list[int], width: int) -> list[list[int]]:
    """Ascending ``slots`` in groups spanning at most ``width`` slots each."""
    groups: list[list[int]] = []
    for s in slots:
        if groups and s - groups[-1][0] < width:
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


class Scheduler:
    """Requests over ``session``'s slots (all of them: ``capacity`` = the session's). A
    choice stops at one of ``eos_ids`` (and its request's ``stop_token_ids``).

    Thread-safe: :meth:`submit` and :meth:`cancel` from any thread; :meth:`step` and
    :meth:`close` from one thread at a time (they serialize on a lock).

    Raises:
        ArgumentError: ``max_queue`` or ``prefill_chunk`` not an integer >= 1; ``eos_ids``
            not token ids of the model.
    """

    def __init__(
        self,
        session: Session,
        *,
        eos_ids: Iterable[int],
        max_queue: int = MAX_QUEUE,
        prefill_chunk: int = PREFILL_CHUNK,
    ) -> None:
        self.session = session
        self.vocab_size = session.backend.vocab_size
        self.eos = stop_ids(eos_ids, self.vocab_size)
        self.max_queue = check_int("max_queue", max_queue, 1)
        chunk = check_int("prefill_chunk", prefill_chunk, 1)
        self.prefill_chunk = min(chunk, session.backend.max_step_tokens)
        self.slots = SlotTable(session.capacity)
        # the widest window one step binds: an engine's batch (its roles' max_batch) where
        # the session has more slots than that
        roles = getattr(session.backend, "roles", None)
        self.max_window = min(session.capacity, getattr(roles, "max_batch", session.capacity))
        self._waiting: deque[_Request] = deque()
        # request id -> {choice (None: every one) -> reason}
        self._cancels: dict[str, dict[int | None, str]] = {}
        self._prefilling: _Request | None = None
        self._running: dict[int, tuple[_Request, Choice]] = {}  # slot -> its choice
        self._inbox = threading.Lock()  # the queue and the cancels
        self._stepping = threading.Lock()
        self._closed = False
        self._steps = self._occupancy = self._submitted = 0
        self._finished: Counter[str] = Counter()
        self._tokens = Counter()  # prompt, cached, generated

    @property
    def capacity(self) -> int:
        return self.slots.capacity

    @property
    def max_seq_len(self) -> int:
        return self.session.state.max_seq_len

    # -- requests in -------------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> Ticket:
        """Queue a request; its :class:`Ticket`.

        Raises (nothing queued):
            ArgumentError: ``params`` not SamplingParams, a bad field (named), an empty
                prompt or an id outside ``[0, V)``.
            LimitError: ``len(prompt_ids) + max_tokens`` > S_max (or, for a longrope model,
                past its original length: the scheduler never prefills again).
            QueueFullError: ``max_queue`` requests already wait.
            ClosedError: after :meth:`close`.
        """
        if not isinstance(params, SamplingParams):
            raise ArgumentError(mismatch("params", "SamplingParams", "", type(params).__name__))
        params = params.check(self.vocab_size, self.capacity)
        ids = id_array("prompt", prompt_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise ArgumentError(mismatch("prompt", "a non-empty list of token ids", "", ids.shape))
        check_token_ids("prompt", ids, self.vocab_size)
        total = ids.size + params.max_tokens
        if total > self.max_seq_len:
            limit = f"at most S_max = {self.max_seq_len} tokens"
        elif self.session.long_rope_after is not None and total > self.session.long_rope_after:
            # generate prefills a sequence again past longrope's original length; the
            # scheduler does not, so a request stays below it
            limit = f"at most longrope's original length {self.session.long_rope_after}"
        else:
            limit = None
        if limit is not None:
            raise LimitError(
                mismatch(
                    "prompt + max_tokens", limit, "", f"{ids.size} + {params.max_tokens} = {total}"
                )
            )
        seed = secrets.randbits(SEED_BITS) if params.seed is None else params.seed
        ticket = Ticket([int(t) for t in ids], params)
        with self._inbox:
            if self._closed:
                raise ClosedError(mismatch("scheduler", "an open scheduler", "", "closed"))
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(
                    mismatch("queue", f"at most max_queue = {self.max_queue} waiting", "", "full")
                )
            self._waiting.append(_Request(ticket, seed))
            self._submitted += 1
        return ticket

    def cancel(self, ticket: Ticket, reason: str = "cancelled", choice: int | None = None) -> None:
        """End ``ticket``'s request at the next step boundary (its slots freed there), each
        unfinished choice with a final event of ``finish_reason`` = ``reason``; with
        ``choice``, only that choice (its slot freed, the others go on: a stop string met by
        one of ``n``). Thread-safe; a finished or unknown ticket or choice is left alone.

        Raises:
            ArgumentError: ``choice`` not None nor an index in ``[0, n)``.
        """
        if choice is not None:
            check_int("choice", choice, 0, ticket.n - 1)
        with self._inbox:
            if not ticket.done and choice not in ticket.finish_reasons:
                self._cancels.setdefault(ticket.request_id, {}).setdefault(choice, reason)

    # -- the step boundary -------------------------------------------------------------
    def has_work(self) -> bool:
        """Requests waiting, prefilling or running, or cancellations to apply."""
        with self._inbox:
            inbox = bool(self._waiting or self._cancels)
        return inbox or self._prefilling is not None or bool(self._running)

    def step(self) -> bool:
        """One step boundary (see the module); whether work remains."""
        with self._stepping:
            self._apply_cancels()
            self._admit()
            self._decode()
            self._prefill_chunk()
            self._steps += 1
        return self.has_work()

    def _apply_cancels(self) -> None:
        """Whole requests end (a waiting one never runs); a single choice ends once its
        request has its choices (a cancel asked before its prefill ended waits till then)."""
        with self._inbox:
            cancels, self._cancels = self._cancels, {}
            dropped = [r for r in self._waiting if None in cancels.get(r.ticket.request_id, {})]
            self._waiting = deque(r for r in self._waiting if r not in dropped)
            for request in [*self._waiting, self._prefilling]:
                asked = cancels.get(request.ticket.request_id) if request else None
                if asked and None not in asked:
                    self._cancels[request.ticket.request_id] = asked
        for request in [*dropped, *self._live()]:
            asked = dict(cancels.get(request.ticket.request_id, {}))
            whole = asked.pop(None, None)
            for index, reason in asked.items() if request.choices else ():
                self._end_choice(request, request.choices[index], reason)
            if whole is not None:  # after the choices' own: theirs is the reason they ended
                self._end(request, whole)

    def _live(self) -> list[_Request]:
        """The requests holding slots: the one prefilling and those running."""
        live = {id(r): r for r, _ in self._running.values()}
        if self._prefilling is not None:
            live[id(self._prefilling)] = self._prefilling
        return list(live.values())

    def _admit(self) -> None:
        with self._inbox:
            if self._prefilling is not None or not self._waiting:
                return
            if self.slots.free < self._waiting[0].ticket.n:
                return  # the head waits for slots (first come, first served)
            request = self._waiting.popleft()
        ticket = request.ticket
        request.slots, request.fed = self.slots.take(ticket.prompt, ticket.n)
        ticket.cached_tokens = request.fed
        self._tokens.update(prompt=ticket.prompt_tokens, cached=request.fed)
        self._prefilling = request
        try:
            if request.fed:
                self.session.crop(request.slots[0], request.fed)
            else:
                self.session.reset(request.slots[0])
        except Exception as err:  # the request's failure, never the loop's
            self._fail([request], err)

    def _decode(self) -> None:
        """One decode step of every running sequence: one backend step per window of at
        most :attr:`max_window` slots (one window unless the engine's batch is narrower
        than the session's slots)."""
        batch = dict(sorted(self._running.items()))
        self._occupancy = len(batch)
        for window in _windows(list(batch), self.max_window):
            part = {s: batch[s] for s in window if not batch[s][1].finished}
            if not part:  # (its requests failed in an earlier window)
                continue
            try:
                logits = self.session.step_slots({s: [c.pending] for s, (_, c) in part.items()})
            except Exception as err:  # one shared step: every request in it fails
                self._fail({id(r): r for r, _ in part.values()}.values(), err)
                continue
            for row, (request, choice) in zip(logits, part.values()):
                self._emit(request, choice, row)

    def _prefill_chunk(self) -> None:
        request = self._prefilling
        if request is None:
            return
        prompt, slot = request.ticket.prompt, request.slots[0]
        chunk = prompt[request.fed : request.fed + self.prefill_chunk]
        try:
            logits = self.session.step_slots({slot: chunk})
            request.fed += len(chunk)
            if request.fed < len(prompt):
                return
            for other in request.slots[1:]:
                self.session.fork(slot, other)  # n > 1: one prefill, n caches
        except Exception as err:  # the request's failure, never the loop's
            self._fail([request], err)
            return
        self._prefilling = None
        request.choices = [
            Choice(i, s, prompt, request.ticket.params, request.seed)
            for i, s in enumerate(request.slots)
        ]
        for choice in request.choices:
            self._running[choice.slot] = (request, choice)
            self._emit(request, choice, logits[0])

    # -- choices out -------------------------------------------------------------------
    def _emit(self, request: _Request, choice: Choice, row: np.ndarray) -> None:
        """Choose ``choice``'s next token from its logits ``row [V]`` and deliver it."""
        params = request.ticket.params
        event = choice.next_token(
            row, (frozenset() if params.ignore_eos else self.eos) | params.stop_token_ids
        )
        self._tokens.update(generated=1)
        if choice.finished:
            self._free(choice, choice.history[:-1])  # the last token was never fed
            self._count(event.finish_reason)
        request.ticket.put(event)

    def _count(self, reason: str) -> None:
        with self._inbox:
            self._finished[reason] += 1

    def _free(self, choice: Choice, cached: list[int]) -> None:
        choice.finished = True
        self._running.pop(choice.slot, None)
        self.slots.release(choice.slot, cached)

    def _end_choice(self, request: _Request, choice: Choice, reason: str) -> None:
        """End one unfinished ``choice`` of ``request`` with ``reason``; free its slot."""
        if not choice.finished:
            self._free(choice, choice.history[:-1])
            self._count(reason)
            request.ticket.put(TokenEvent(choice.index, None, finish_reason=reason))

    def _end(self, request: _Request, reason: str, error: str | None = None) -> None:
        """End every unfinished choice of ``request`` with ``reason``; free its slots."""
        if request is self._prefilling:
            self._prefilling = None
            for s in request.slots:
                self.slots.release(
                    s, request.ticket.prompt[: request.fed] if s == request.slots[0] else []
                )
        for choice in request.choices:
            if not choice.finished:
                self._free(choice, choice.history[:-1])
        for i in range(request.ticket.n):
            if i not in request.ticket.finish_reasons:
                self._count(reason)
                request.ticket.put(TokenEvent(i, None, finish_reason=reason, error=error))

    def _fail(self, requests: Iterable[_Request], err: Exception) -> None:
        """End ``requests`` with "error" and ``err``'s message; reset their slots."""
        message = f"{type(err).__name__}: {err}"
        for request in list(requests):
            slots = list(request.slots)
            self._end(request, "error", message)
            for s in slots:
                self.slots.release(s, [])
                with contextlib.suppress(Exception):  # cached [] already: never reused
                    self.session.reset(s)

    # -- queries and the end -----------------------------------------------------------
    def stats(self) -> SchedulerStats:
        with self._inbox:  # stats may be read on another thread than the steps'
            waiting, finished = len(self._waiting), dict(self._finished)
        return SchedulerStats(
            queue_length=waiting,
            running=len(self._running),
            prefilling=int(self._prefilling is not None),
            free=self.slots.free,
            capacity=self.capacity,
            steps=self._steps,
            occupancy=self._occupancy,
            submitted=self._submitted,
            finished=finished,
            prompt_tokens=self._tokens["prompt"],
            cached_tokens=self._tokens["cached"],
            generated_tokens=self._tokens["generated"],
        )

    def abort(self, err: Exception) -> None:
        """End every request holding slots with "error" and ``err``'s message, resetting
        their slots (what a step that raised past its own handlers leaves to do); the queue
        and the scheduler go on."""
        with self._stepping:
            self._fail(self._live(), err)

    def close(self, reason: str = "cancelled") -> None:
        """End every queued and running request with a final event of ``reason``; later
        submits raise ClosedError."""
        with self._stepping:
            with self._inbox:
                self._closed = True
                waiting, self._waiting = list(self._waiting), deque()
                self._cancels.clear()
            for request in [*waiting, *self._live()]:
                self._end(request, reason)
