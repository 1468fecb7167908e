"""What every decoder network builder checks of its sizes before it adds a layer."""

from __future__ import annotations

from trt_kv import build_defaults as defaults
from trt_kv.errors import ShapeError, check_int, mismatch


def check_step_sizes(max_seq_len: int, max_batch: int, max_step_tokens: int | None) -> int:
    """``max_step_tokens`` (None: :func:`trt_kv.build_defaults.default_step_tokens`) once
    the sizes of a decoder network are checked.

    Raises:
        ArgumentError: a size not an integer >= 1; ``max_seq_len`` past 2^31 - 1 (int32
            write indices and lengths).
        ShapeError: ``max_step_tokens > max_seq_len``.
    """
    check_int("max_seq_len", max_seq_len, 1, 2**31 - 1)
    check_int("max_batch", max_batch, 1)
    if max_step_tokens is None:
        max_step_tokens = defaults.default_step_tokens(max_seq_len)
    check_int("max_step_tokens", max_step_tokens, 1)
    if max_step_tokens > max_seq_len:
        raise ShapeError(
            mismatch("max_step_tokens", f"<= max_seq_len = {max_seq_len}", "", max_step_tokens)
        )
    return max_step_tokens
