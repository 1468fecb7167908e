"""The decode loop: prefill once, then one token per sequence per step.

Longrope (Phi-3) with S_max past ``original_max_position_embeddings``: a sequence whose next
token takes it past that length is prefilled again, from its first token, at that step
(every key then rotated by the long table), as Hugging Face's Phi-3 ``generate`` does
(``Phi3ForCausalLM.prepare_inputs_for_generation`` drops the cache there). Hugging Face
does it for the whole batch when its longest row crosses; trt_kv per sequence, when that
sequence crosses: each sequence gets the ids Hugging Face gives it alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from trt_kv.errors import ArgumentError, CacheOverflowError, ShapeError, check_int, mismatch
from trt_kv.progress import bar
from trt_kv.runtime.backend import candidates_of
from trt_kv.runtime.penalty import check_repetition_penalty, penalize_repetitions
from trt_kv.runtime.sampling import Sampler
from trt_kv.runtime.session import Session


@dataclass(frozen=True)
class Generation:
    """What :func:`generate` produced, with prefill and decode timed apart.

    Prefill is the one ``session.prefill`` call over every prompt token; its logits give each
    sequence its first new token. Decode is everything after it (sampling, streaming, the
    ``steps - 1`` ``session.decode`` calls, longrope's prefill again of a sequence that
    crosses its original length), so its tokens are the new tokens but the first of each
    sequence.
    """

    ids: list[list[int]]  # generated ids only, one list per prompt
    seconds: float  # prefill_seconds + decode_seconds
    steps: int  # 1 prefill + decode steps
    prefill_tokens: int = 0  # prompt tokens fed to the prefill
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    # per sequence: "eos" (stopped at an end id, kept as its last id) or "length"
    # (max_new_tokens reached without one), as OpenAI-style APIs and Hugging Face name them
    finish_reasons: tuple[str, ...] = ()

    @property
    def decode_steps(self) -> int:
        return self.steps - 1

    @property
    def decode_tokens(self) -> int:
        """New tokens the decode steps produced (each sequence's first came from prefill)."""
        return sum(max(len(i) - 1, 0) for i in self.ids)

    @property
    def decode_ms_per_step(self) -> float | None:
        """Milliseconds per decode step; None when there was none."""
        return self.decode_seconds * 1e3 / self.decode_steps if self.decode_steps else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Decode tokens per second (all sequences); None without a decode step."""
        if not self.decode_steps or self.decode_seconds <= 0:
            return None
        return self.decode_tokens / self.decode_seconds


def generate(
    session: Session,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampler: Sampler | None = None,
    eos_ids: int | Iterable[int] | None = None,
    on_token: Callable[[int, int], None] | None = None,
    repetition_penalty: float = 1.0,
) -> Generation:
    """Generate up to ``max_new_tokens`` per prompt in slots ``0 .. len(prompts) - 1``.

    A sequence stops after it produces any of ``eos_ids`` (one id or several; the stop token
    is kept in its ids). ``on_token(k, token_id)`` is called for each new token of sequence
    ``k`` as soon as it is chosen (streaming). ``repetition_penalty`` (1: none) penalizes
    the logits of ids a sequence already holds, prompt included, before each choice
    (:func:`~trt_kv.runtime.penalty.penalize_repetitions`, transformers' semantics).

    Raises:
        ArgumentError: ``max_new_tokens`` not an integer >= 1; an ``eos_ids`` entry that is
            not a token id in ``[0, V)``; ``sampler`` not a :class:`Sampler`, ``on_token``
            not callable (both may be None); ``repetition_penalty`` not a number > 0.
        CacheOverflowError: before any step, when a prompt plus ``max_new_tokens`` would not
            fit in ``S_max``.
        ClosedError, ConcurrentUseError: the session's backend is closed, or another
            thread uses the session (:meth:`Session.exclusive`), before anything else.
        Everything :meth:`Session.prefill` raises, before any slot changes.
    """
    with session.exclusive("generate"):  # no other thread's step between ours
        return _generate(
            session, prompts, max_new_tokens, sampler, eos_ids, on_token, repetition_penalty
        )


def _generate(
    session: Session,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampler: Sampler | None,
    eos_ids: int | Iterable[int] | None,
    on_token: Callable[[int, int], None] | None,
    repetition_penalty: float,
) -> Generation:
    """:func:`generate`, the session held: its checks, then :func:`_loop`."""
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (Sequence, np.ndarray)):
        raise ShapeError(mismatch("prompts", "a list of token-id lists", "", repr(prompts)))
    if sampler is not None and not isinstance(sampler, Sampler):
        raise ArgumentError(mismatch("sampler", "a Sampler or None", "", repr(sampler)))
    if on_token is not None and not callable(on_token):
        raise ArgumentError(
            mismatch("on_token", "a callable on_token(k, token_id) or None", "", repr(on_token))
        )
    sampler = sampler or Sampler()
    penalty = check_repetition_penalty(repetition_penalty)
    stop = stop_ids(eos_ids, session.backend.vocab_size)
    s_max = session.state.max_seq_len
    for k, p in enumerate(prompts):
        if not hasattr(p, "__len__"):
            raise ShapeError(mismatch(f"prompt {k}", "a list of token ids", "", repr(p)))
        if len(p) + max_new_tokens - 1 > s_max:
            raise CacheOverflowError(
                mismatch(
                    f"prompt {k}",
                    f"length + max_new_tokens - 1 <= S_max = {s_max}",
                    "",
                    len(p) + max_new_tokens - 1,
                )
            )
    return _loop(session, prompts, max_new_tokens, sampler, stop, on_token, penalty)


def stop_ids(eos_ids: object, vocab: int) -> frozenset[int]:
    """``eos_ids`` (None, one id, or an iterable of ids; a NumPy array of either) as a set.

    Raises:
        ArgumentError: an entry that is not an integer in ``[0, vocab)`` (an id no logits
            row can produce would never stop anything).
    """
    if isinstance(eos_ids, np.ndarray):
        eos_ids = eos_ids.tolist()  # 0-d: one int; else a (nested) list
    one = isinstance(eos_ids, (str, bytes)) or not isinstance(eos_ids, Iterable)
    ids = [eos_ids] if one and eos_ids is not None else list(eos_ids or ())
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab:
            raise ArgumentError(mismatch("eos_ids", f"token ids in [0, {vocab})", "", repr(t)))
    return frozenset(int(t) for t in ids)


def _loop(
    session: Session,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampler: Sampler,
    stop: frozenset[int],
    on_token: Callable[[int, int], None] | None,
    penalty: float,
) -> Generation:
    """:func:`generate` after its checks: prefill, then decode until every sequence stops."""
    # live tokens/s, unless the caller streams the tokens itself
    shown = None if on_token else bar(len(prompts) * max_new_tokens, "generate", unit="tok")
    start = time.perf_counter()
    on_device = device_sampling(session, sampler, penalty)
    logits = session.prefill(prompts)
    prefilled = time.perf_counter()
    steps = 1
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    candidates = next_ids = None
    while True:
        if candidates is not None:
            chosen = sampler.choose(*candidates)
            if chosen is None:  # a tie the candidates cannot settle: the step again, logits
                for slot in range(len(prompts)):
                    session.crop(slot, -1)
                logits, candidates = session.decode(next_ids), None
            next_ids = chosen
        if candidates is None:
            if penalty != 1.0:
                histories = [[*map(int, p), *o] for p, o in zip(prompts, out)]
                logits = penalize_repetitions(logits, histories, penalty)
            next_ids = sampler(logits)
        for k, t in enumerate(next_ids):
            if not done[k]:
                out[k].append(int(t))
                done[k] = len(out[k]) >= max_new_tokens or int(t) in stop
                if on_token is not None:
                    on_token(k, int(t))
        if shown is not None:
            shown.update(sum(map(len, out)) - shown.n)
        if all(done):
            break
        steps += 1
        if on_device:
            candidates = session.decode_top_k(next_ids)
            continue
        logits = session.decode(next_ids)
        _recompute_long_rope(session, prompts, out, done, logits)
    end = time.perf_counter()
    if shown is not None:
        shown.close()
    return Generation(
        out,
        end - start,
        steps,
        prefill_tokens=sum(map(len, prompts)),
        prefill_seconds=prefilled - start,
        decode_seconds=end - prefilled,
        finish_reasons=tuple("eos" if o[-1] in stop else "length" for o in out),
    )


def device_sampling(session: Session, sampler: Sampler, penalty: float) -> bool:
    """True when :func:`generate`'s decode steps can take the network's own next-token
    candidates (``Session.decode_top_k``, only ``[B]`` or ``[B, k]`` values downloaded)
    instead of the logits ``[B, V]``: the backend has them (``device_top_k`` = k >= 1),
    the sampler picks among them as it would among the logits (greedy, or top-k with
    ``top_k < k`` and no top-p: :meth:`Sampler.takes_candidates`), no repetition penalty
    (it changes the logits first) and no longrope re-prefill (it needs a step's logits)."""
    plain = penalty == 1.0 and session.long_rope_after is None
    return plain and sampler.takes_candidates(candidates_of(session.backend))


def _recompute_long_rope(
    session: Session,
    prompts: Sequence[Sequence[int]],
    out: list[list[int]],
    done: list[bool],
    logits: np.ndarray,
) -> None:
    """Prefill again each live sequence the last decode step took past longrope's original
    length (its cached keys were rotated by the short table), and put its logits ``[V]``
    into ``logits [B, V]`` in place."""
    after = session.long_rope_after
    if after is None:
        return
    for k, prompt in enumerate(prompts):
        if not done[k] and session.length(k) == after + 1:
            history = [*map(int, prompt), *out[k]]
            logits[k] = session.prefill([history], lo=k)[0]
