"""What one request asks of the scheduler (:class:`SamplingParams`) and what it gets back,
token by token (:class:`TokenEvent`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from trt_kv.errors import ArgumentError, check_int, check_real, mismatch
from trt_kv.runtime.penalty import check_repetition_penalty
from trt_kv.runtime.sampling import check_temperature

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
OPENAI_PENALTIES = (-2.0, 2.0)  # OpenAI's range of frequency_penalty and presence_penalty
FINISH_REASONS = ("stop", "length", "cancelled", "error")


@dataclass(frozen=True)
class SamplingParams:
    """One request's generation options (OpenAI's, plus ``top_k`` and
    ``repetition_penalty``). ``temperature`` 0 is greedy. ``seed`` None: a fresh random seed
    per request. ``frequency_penalty``/``presence_penalty`` subtract ``f * count`` and
    ``p * (count > 0)`` from the logits of the ids generated so far (OpenAI's definition),
    after ``repetition_penalty`` (transformers', over prompt and generated ids).
    ``top_logprobs`` None: no logprobs; k in 0..20: the chosen token's logprob and the k
    most likely alternatives. ``n`` choices share one prefill; choice 0 takes ``seed``,
    choice i > 0 a seed derived from ``(seed, i)``. ``stop_token_ids`` end a choice as the
    model's end ids do (kept as its last token). ``ignore_eos`` (vLLM's and llama-server's
    extension): the model's end ids do not end a choice (``stop_token_ids`` still do), so it
    runs to ``max_tokens``: what a benchmark sends to compare servers token for token."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    top_logprobs: int | None = None
    n: int = 1
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False

    def check(self, vocab_size: int, capacity: int) -> SamplingParams:
        """These parameters with every field checked (ints as ``int``, reals as ``float``).

        Raises:
            ArgumentError: naming the first bad field, its range and its value (``n`` above
                ``capacity``: the slots one request may take; a stop id outside
                ``[0, vocab_size)``).
        """
        lo, hi = OPENAI_PENALTIES
        if not isinstance(self.ignore_eos, bool):
            raise ArgumentError(mismatch("ignore_eos", "True or False", "", repr(self.ignore_eos)))
        stops = self.stop_token_ids
        if isinstance(stops, (str, bytes)) or not hasattr(stops, "__iter__"):
            raise ArgumentError(mismatch("stop_token_ids", "a set of token ids", "", stops))
        return replace(
            self,
            max_tokens=check_int("max_tokens", self.max_tokens, 1),
            temperature=check_temperature(self.temperature),
            top_p=check_real("top_p", self.top_p, 0.0, 1.0),
            top_k=None if self.top_k is None else check_int("top_k", self.top_k, 1),
            seed=None if self.seed is None else check_int("seed", self.seed, 0),
            repetition_penalty=check_repetition_penalty(self.repetition_penalty),
            frequency_penalty=check_real("frequency_penalty", self.frequency_penalty, lo, hi),
            presence_penalty=check_real("presence_penalty", self.presence_penalty, lo, hi),
            top_logprobs=None
            if self.top_logprobs is None
            else check_int("top_logprobs", self.top_logprobs, 0, MAX_TOP_LOGPROBS),
            n=check_int("n", self.n, 1, capacity),
            stop_token_ids=frozenset(
                check_int("stop_token_ids", t, 0, vocab_size - 1) for t in stops
            ),
        )


@dataclass(frozen=True)
class TokenEvent:
    """One new token of choice ``choice``, or a choice's end. ``finish_reason`` is set on the
    last event of a choice: "stop" (an end id, kept as ``token_id``), "length"
    (``max_tokens`` reached), "cancelled" (or the reason given to ``cancel``/``close``;
    ``token_id`` None), "error" (``error`` says why; ``token_id`` None). ``logprob`` and
    ``top_logprobs`` (``(id, logprob)`` best first) when the request asked for them."""

    choice: int
    token_id: int | None
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    finish_reason: str | None = None
    error: str | None = None
