"""One choice of a request as it decodes: its slot, its own sampler and penalties, the ids it
holds, and how a step's logits row becomes its next token."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from trt_kv.runtime.penalty import penalize_repetitions
from trt_kv.runtime.sampling import Sampler
from trt_kv.serve.scheduler.params import SamplingParams, TokenEvent

SEED_BITS = 63  # derived seeds are integers in [0, 2**63)


def choice_seed(seed: int, index: int) -> int:
    """Choice ``index``'s seed: ``seed`` itself for choice 0 (a one-choice request samples
    as ``trt-kv generate --seed`` does), else one drawn from ``SeedSequence([seed, index])``."""
    if index == 0:
        return seed
    (state,) = np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)
    return int(state) >> (64 - SEED_BITS)


def log_softmax(row: np.ndarray) -> np.ndarray:
    """``log softmax(row [V])`` in float64."""
    z = row.astype(np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


class Choice:
    """Choice ``index`` of a request whose prompt is ``prompt``, decoding in ``slot``.

    ``pending`` is its last chosen token, not yet fed (the next decode step feeds it).
    """

    def __init__(
        self, index: int, slot: int, prompt: Sequence[int], params: SamplingParams, seed: int
    ) -> None:
        self.index, self.slot, self.params = index, slot, params
        self.sampler = Sampler(
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            seed=choice_seed(seed, index),
        )
        self.history = [int(t) for t in prompt]  # prompt and generated ids
        self.generated: Counter[int] = Counter()
        self.count = 0  # tokens generated
        self.pending: int | None = None
        self.finished = False

    def next_token(self, logits: np.ndarray, stop: frozenset[int]) -> TokenEvent:
        """The next token from this choice's logits row ``[V]`` (float32): repetition
        penalty, then frequency/presence penalties, then its sampler; logprobs from the raw
        row. Sets ``pending`` and ``finished`` ("stop" at an id of ``stop``, "length" at
        ``max_tokens``)."""
        p = self.params
        row = logits[None]
        if p.repetition_penalty != 1.0:
            row = penalize_repetitions(row, [self.history], p.repetition_penalty)
        if self.generated and (p.frequency_penalty or p.presence_penalty):
            ids = np.fromiter(self.generated, np.int64)
            counts = np.fromiter(self.generated.values(), np.float64)
            row = np.array(row, copy=True)
            row[0, ids] -= (p.frequency_penalty * counts + p.presence_penalty).astype(row.dtype)
        token = int(self.sampler(row)[0])
        self.history.append(token)
        self.generated[token] += 1
        self.count += 1
        self.pending = token
        reason = "stop" if token in stop else "length" if self.count >= p.max_tokens else None
        self.finished = reason is not None
        logprob, top = None, ()
        if p.top_logprobs is not None:
            lp = log_softmax(logits)
            logprob = float(lp[token])
            best = np.argsort(-lp, kind="stable")[: p.top_logprobs]
            top = tuple((int(t), float(lp[t])) for t in best)
        return TokenEvent(self.index, token, logprob, top, finish_reason=reason)
