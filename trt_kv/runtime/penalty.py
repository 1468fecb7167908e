"""Repetition penalty on next-token logits, with Hugging Face's semantics
(``RepetitionPenaltyLogitsProcessor``): every token id already in a sequence (prompt and
generated ids) has its logit divided by ``penalty`` where positive and multiplied by it where
negative, once however often it occurs. It runs on the full logits ``[B, V]`` before
sampling, as transformers runs its logits processors before its warpers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trt_kv.errors import ArgumentError, check_real, mismatch


def check_repetition_penalty(penalty: object) -> float:
    """``penalty`` as a float > 0 (1: no penalty). Raises ArgumentError naming
    ``repetition_penalty`` otherwise."""
    value = check_real("repetition_penalty", penalty, 0.0)
    if value == 0.0:
        raise ArgumentError(mismatch("repetition_penalty", "a number > 0", "", value))
    return value


def penalize_repetitions(
    logits: np.ndarray, histories: Sequence[Sequence[int]], penalty: float
) -> np.ndarray:
    """``logits [B, V]`` with the logit of each id in ``histories[b]`` (the ids sequence
    ``b`` holds so far) divided by ``penalty`` where > 0, else multiplied by it; a new array
    of ``logits``' dtype (float32 from every backend), ``logits`` unchanged. Penalty 1 is
    the identity.

    Raises:
        ArgumentError: ``penalty`` not a number > 0; ``histories`` not one list per row.
    """
    penalty = check_repetition_penalty(penalty)
    if len(histories) != logits.shape[0]:
        raise ArgumentError(
            mismatch("histories", "one id list per logits row =", logits.shape[0], len(histories))
        )
    out = np.array(logits, copy=True)
    factor = out.dtype.type(penalty)
    for b, ids in enumerate(histories):
        seen = np.unique(np.asarray(ids, dtype=np.int64))
        row = out[b, seen]
        out[b, seen] = np.where(row < 0, row * factor, row / factor)
    return out
