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

# The range of a repetition penalty (1: none). transformers takes any float > 0, but past
# these bounds the float32 factor is 0 or inf (1e-300: logits inf, the softmax NaN), and
# 1e3 already all but forbids a repeated token.
PENALTIES = (1e-3, 1e3)


def check_repetition_penalty(penalty: object) -> float:
    """``penalty`` as a float in :data:`PENALTIES` (1: no penalty); the one check of the
    range, which the CLI's ``--repetition-penalty`` calls too.

    Raises:
        ArgumentError: naming ``repetition_penalty``, the range and the value otherwise.
    """
    return check_real("repetition_penalty", penalty, *PENALTIES)


def penalize_repetitions(
    logits: np.ndarray, histories: Sequence[Sequence[int]], penalty: float
) -> np.ndarray:
    """``logits [B, V]`` with the logit of each id in ``histories[b]`` (the ids sequence
    ``b`` holds so far) divided by ``penalty`` where > 0, else multiplied by it; a new array
    of ``logits``' dtype (float32 from every backend), ``logits`` unchanged. Penalty 1 is
    the identity.

    Raises:
        ArgumentError: ``penalty`` not a number in :data:`PENALTIES`; ``histories`` not
            one list per row.
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
