"""Next-token choice: greedy, or temperature / top-k / top-p sampling with a seed."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from trt_kv.errors import ArgumentError, check_int, check_real, mismatch

TEMPERATURES = (1e-3, 1e3)  # the range of a sampling temperature; 0 is greedy


def check_temperature(value: object) -> float:
    """``value`` as a temperature: 0 (greedy) or a finite number in :data:`TEMPERATURES`
    (below, ``logits / T`` overflows float64 to inf and the softmax to NaN; above, sampling
    is uniform to within float rounding).

    Raises:
        ArgumentError: anything else (the message gives the range).
    """
    lo, hi = TEMPERATURES
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentError(mismatch("temperature", "a real number", "", repr(value)))
    t = float(value)
    if t != 0 and not lo <= t <= hi:
        raise ArgumentError(
            mismatch("temperature", f"0 (greedy) or a number in [{lo:g}, {hi:g}]", "", value)
        )
    return t


@dataclass(frozen=True)
class Sampler:
    """``temperature == 0`` is greedy (argmax); else softmax(logits / T) over the tokens
    top-k and top-p keep, in Hugging Face's order (temperature, top-k, top-p): top-p keeps
    the most likely tokens whose probabilities sum to ``top_p`` (``TopPLogitsWarper``: a
    token is dropped when the tokens less likely than it, itself included, sum to at most
    ``1 - top_p``; the most likely token always stays).

    Immutable (its fields are checked once, when it is made); only the random generator's
    state advances as it samples.

    Raises:
        ArgumentError: ``temperature`` not 0 or in :data:`TEMPERATURES`; ``top_k`` not None
            and not an integer >= 1; ``seed`` not an integer >= 0; ``top_p`` not in
            ``[0, 1]``.
    """

    temperature: float = 0.0
    top_k: int | None = None
    seed: int = 0
    top_p: float = 1.0
    rng: np.random.Generator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        checked = {
            "temperature": check_temperature(self.temperature),
            "top_k": None if self.top_k is None else check_int("top_k", self.top_k, 1),
            "seed": check_int("seed", self.seed, 0),
            "top_p": check_real("top_p", self.top_p, 0.0, 1.0),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # frozen: set once, here
        object.__setattr__(self, "rng", np.random.default_rng(self.seed))

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """``logits [B, V]`` -> token ids ``[B]`` int64."""
        if self.temperature == 0:
            return np.argmax(logits, axis=-1)
        if self.top_k is not None and self.top_k < logits.shape[-1] and self.top_p == 1.0:
            kth = np.partition(logits, -self.top_k, axis=-1)[:, -self.top_k]
            kept = [np.flatnonzero(row >= t) for row, t in zip(logits, kth)]  # by id
            return np.array([self._draw(ids, row[ids]) for ids, row in zip(kept, logits)])
        p = softmax(self.filtered(logits))
        return np.array([self.rng.choice(p.shape[-1], p=row) for row in p])

    def takes_candidates(self, k: int) -> bool:
        """True when :meth:`choose` among a network's ``k`` best candidates can pick what
        ``self(logits)`` picks: greedy (k >= 1), or top-k without top-p with ``top_k < k``
        (the extra candidates show whether a tie at the top_k-th logit ends among them)."""
        if k < 1:
            return False
        if self.temperature == 0:
            return True
        return self.top_k is not None and self.top_k < k and self.top_p == 1.0

    def choose(self, ids: np.ndarray, logits: np.ndarray | None) -> np.ndarray | None:
        """The next ids ``[B]`` int64 from a step's candidates (:data:`~trt_kv.runtime.
        backend.Candidates`: ``ids [B, k]`` and ``logits [B, k]`` best first, or None for
        k = 1), or None when they cannot settle the step: top-k keeps every token tied with
        the top_k-th logit (Hugging Face's ``TopKLogitsWarper``), and a tie that reaches the
        last candidate may go on past it (the caller then takes the step's logits).

        The kept candidates are put in id order, so a seeded draw among them is the draw
        :meth:`__call__` makes among the same tokens of the full logits. Greedy takes the
        lowest id among the best candidates. A ``top_k`` of ``k`` or more keeps every
        candidate (``min(top_k, k)``, as ``TopKLogitsWarper`` takes ``min(top_k, V)``), the
        last one included, so tokens past them may be kept too: None; so does a sampler
        without top-k or with top-p (:meth:`takes_candidates` false)."""
        if logits is None:
            return ids[:, 0].astype(np.int64)
        if self.temperature == 0:
            best = logits == logits.max(axis=-1, keepdims=True)
            return np.where(best, ids, np.iinfo(ids.dtype).max).min(axis=-1).astype(np.int64)
        if not self.takes_candidates(logits.shape[-1]):  # top_k >= k, no top-k, or top-p
            return None
        kth = logits[:, self.top_k - 1 : self.top_k]  # the top_k-th best of each row
        kept = logits >= kth
        if kept[:, -1].any():  # a tie up to the last candidate: more may tie past it
            return None
        chosen = []
        for row_ids, row_logits, row_kept in zip(ids, logits, kept):
            order = np.argsort(row_ids[row_kept], kind="stable")
            chosen.append(self._draw(row_ids[row_kept][order], row_logits[row_kept][order]))
        return np.array(chosen, dtype=np.int64)

    def _draw(self, ids: np.ndarray, logits: np.ndarray) -> int:
        """One seeded draw from softmax(``logits [n]`` / T) over ``ids [n]`` (id order)."""
        p = softmax(logits.astype(np.float64)[None] / self.temperature)[0]
        return int(ids[self.rng.choice(len(ids), p=p)])

    def filtered(self, logits: np.ndarray) -> np.ndarray:
        """``logits [B, V]`` / temperature as float64, -inf where top-k or top-p drop a token
        (``temperature > 0``)."""
        z = logits.astype(np.float64) / self.temperature
        if self.top_k is not None and self.top_k < z.shape[-1]:
            kth = np.partition(z, -self.top_k, axis=-1)[:, -self.top_k][:, None]
            z = np.where(z < kth, -np.inf, z)
        if self.top_p < 1.0:
            order = np.argsort(z, axis=-1, kind="stable")  # [B, V] least likely first
            below = np.cumsum(softmax(np.take_along_axis(z, order, -1)), axis=-1)
            drop = below <= 1.0 - self.top_p
            drop[:, -1] = False  # the most likely token stays
            dropped = np.empty_like(drop)
            np.put_along_axis(dropped, order, drop, -1)  # back in token order
            z = np.where(dropped, -np.inf, z)
        return z


def softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (``-inf`` entries get probability 0)."""
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)
