"""Sessions and runs for the scheduler's tests (tests/serve/): one tiny model on every
backend, the solo oracle (``generate`` alone, what ``trt-kv generate`` runs) with each step's
logits, and a scheduler driven step by step to its end."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tests.support.tiny_models import TINY_GQA
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.models.llama.reference_backend import ReferenceBackend
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend
from trt_kv.serve.scheduler import Scheduler, Ticket

CONFIG = TINY_GQA
WEIGHTS = random_weights(CONFIG, seed=3, std=0.3)
SHAPES = {"max_seq_len": 48, "max_batch": 4, "max_step_tokens": 8}
# prompts of 3, 8, 13, 18 and 23 tokens: one chunk of 4 to six chunks
PROMPTS = [[(5 * t + k) % 60 + 1 for t in range(3 + 5 * k)] for k in range(5)]


def host_session(kind: str) -> Session:
    """``"reference"`` (NumPy, float32), or the interpreter at dtype ``kind``."""
    if kind == "reference":
        s_max, batch, step = SHAPES.values()
        backend = ReferenceBackend(
            CONFIG, WEIGHTS, capacity=batch, max_seq_len=s_max, max_step_tokens=step
        )
        return Session(backend)
    return Session(InterpreterBackend(build_llama_network(CONFIG, WEIGHTS, dtype=kind, **SHAPES)))


def solo(make: Callable[[], Session], prompt: Sequence[int], max_tokens: int):
    """The oracle: ``generate`` of ``prompt`` alone in a fresh session (greedy), and each
    step's logits row ``[V]`` (a second run, step by step, checked to pick the same ids)."""
    ids = generate(make(), [list(prompt)], max_tokens).ids[0]
    session, rows = make(), []
    logits = session.prefill([list(prompt)])
    for t in ids:
        rows.append(logits[0])
        assert int(np.argmax(logits[0])) == t
        logits = session.decode([t])
    return ids, rows


def top2_gap(row: np.ndarray) -> float:
    """The gap between the two largest logits of ``row [V]``."""
    a, b = np.sort(row)[-2:][::-1]
    return float(a - b)


def drain_events(ticket: Ticket) -> dict[int, list]:
    """Every event ``ticket`` holds now, per choice."""
    out: dict[int, list] = {i: [] for i in range(ticket.n)}
    while not ticket.events.empty():
        event = ticket.events.get_nowait()
        out[event.choice].append(event)
    return out


def run_to_end(
    scheduler: Scheduler, arrivals: dict[int, list[Callable[[], Ticket]]]
) -> tuple[list[Ticket], list[tuple[int, list[int]]]]:
    """Step ``scheduler`` until no work remains and no arrival is due; ``arrivals[k]``: the
    submits made before step k. Returns the tickets (in submit order) and, per step, its
    decode occupancy and each ticket's tokens so far."""
    tickets: list[Ticket] = []
    steps: list[tuple[int, list[int]]] = []
    while True:
        for submit in arrivals.get(len(steps), []):
            tickets.append(submit())
        more = scheduler.step()
        steps.append((scheduler.stats().occupancy, [t.completion_tokens for t in tickets]))
        if not more and len(steps) > max(arrivals, default=0):
            return tickets, steps


def shared_steps(steps: list[tuple[int, list[int]]], k: int) -> int:
    """Steps in which ticket ``k`` got a token from a decode step of more than one sequence."""
    shared, before = 0, 0
    for occupancy, counts in steps:
        now = counts[k] if k < len(counts) else 0
        shared += now > before and occupancy > 1
        before = now
    return shared
