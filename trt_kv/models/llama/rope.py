"""RoPE frequency tables (default, "llama3" and "longrope" scaling), shared by the network and
the reference.

Computed the way Hugging Face computes them, in float32: inverse frequencies
``1 / theta ** (2i / H)`` rounded to float32, angles ``float32(position) * inv_freq`` rounded
to float32, then cos/sin. A float64 table rounded at the end differs from Hugging Face by
~2e-4 at position 4000 (the float32 angle's rounding error grows with the position), which
flips float16 roundings; these tables stay within one float32 ulp of Hugging Face's.

Longrope (Phi-3) has two tables, short factors and long factors, both times the one attention
factor Hugging Face fixes at load time. Hugging Face picks one per forward:
``max(position_ids) + 1 > original_max_position_embeddings`` (over the whole batch) takes the
long one, for every new token of that forward; keys already in the cache keep the rotation
they were written with. trt_kv makes the same choice per sequence, from ``rope_lengths [B]``
(the sequence's length after the request: the last chunk's, for a chunked prefill), inside the
network: when ``max_seq_len`` can pass the original length the tables are stacked, short rows
``0..P-1`` then long rows ``P..2P-1``, and each sequence's positions index the half its length
selects (:func:`rope_rows`, :func:`rope_row_ids`). Hugging Face's ragged batch differs: its
longest row picks the table for every row. Hugging Face's Phi-3 ``generate`` also drops the
cache once a sequence passes the original length and recomputes it on the long table;
trt_kv's :func:`~trt_kv.runtime.generate.generate` prefills that sequence again.
"""

from __future__ import annotations

import math

import numpy as np

from trt_kv.models.llama.config import LlamaConfig, LongRope

_F32 = np.float32


def _reciprocal(x: np.ndarray) -> np.ndarray:
    return (_F32(1.0) / x).astype(_F32)


def inv_freq(config: LlamaConfig, long: bool = False) -> np.ndarray:
    """Inverse frequencies ``[R/2]`` float32 (R = ``config.rotary_dim``), with llama3
    smoothing or longrope's short factors (``long``: its long factors) when configured.

    Every operation rounds to float32 as torch does (``scalar / tensor`` is a reciprocal
    times the scalar); ``theta ** e`` is the correctly rounded float32 power.
    """
    h = config.rotary_dim
    exponents = (np.arange(0, h, 2, dtype=_F32) / _F32(h)).astype(_F32)
    power = np.power(np.float64(config.rope_theta), exponents.astype(np.float64)).astype(_F32)
    s = config.rope_scaling
    if isinstance(s, LongRope):
        factors = np.asarray(s.long_factor if long else s.short_factor, _F32)
        return _reciprocal((factors * power).astype(_F32))
    freq = _reciprocal(power)
    if s is None:
        return freq
    old = s.original_max_position_embeddings
    low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
    wavelen = (_reciprocal(freq) * _F32(2 * math.pi)).astype(_F32)
    scaled = np.where(wavelen > low_wavelen, freq / _F32(s.factor), freq).astype(_F32)
    band = _F32(s.high_freq_factor - s.low_freq_factor)
    smooth = (_reciprocal(wavelen) * _F32(old) - _F32(s.low_freq_factor)) / band
    smoothed = (_F32(1) - smooth) * scaled / _F32(s.factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(_F32)


def rope_angles(config: LlamaConfig, num_positions: int, long: bool = False) -> np.ndarray:
    """``[P, R/2]`` float32 angles ``float32(p) * inv_freq`` for positions ``0..P-1``."""
    positions = np.arange(num_positions, dtype=_F32)[:, None]
    return (positions * inv_freq(config, long)[None, :]).astype(_F32)


def rope_tables(
    config: LlamaConfig, num_positions: int, long: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)``, each ``[P, R/2]`` float32 for positions ``0..P-1`` (longrope: its short
    factors, or its long ones with ``long``, times its attention factor in float32, as
    Hugging Face does)."""
    angles = rope_angles(config, num_positions, long).astype(np.float64)
    cos, sin = np.cos(angles).astype(_F32), np.sin(angles).astype(_F32)
    s = config.rope_scaling
    if isinstance(s, LongRope):
        factor = _F32(s.attention_factor)
        cos, sin = (cos * factor).astype(_F32), (sin * factor).astype(_F32)
    return cos, sin


def long_rope_after(config: LlamaConfig, max_seq_len: int) -> int | None:
    """The length past which a sequence takes longrope's long table
    (``original_max_position_embeddings``), or None when no sequence of a ``max_seq_len``
    cache can pass it (no longrope, or ``max_seq_len`` <= that length): one table then."""
    s = config.rope_scaling
    if isinstance(s, LongRope) and max_seq_len > s.original_max_position_embeddings:
        return s.original_max_position_embeddings
    return None


def rope_rows(config: LlamaConfig, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` float32 ``[T, R/2]`` that :func:`rope_row_ids` indexes: T = P rows of
    :func:`rope_tables`, or, when :func:`long_rope_after` is set, T = 2P: the short table's
    P rows, then the long table's."""
    cos, sin = rope_tables(config, num_positions)
    if long_rope_after(config, num_positions) is not None:
        long_cos, long_sin = rope_tables(config, num_positions, long=True)
        cos, sin = np.concatenate([cos, long_cos]), np.concatenate([sin, long_sin])
    return cos, sin


def rope_row_ids(
    config: LlamaConfig, position_ids: np.ndarray, rope_lengths: np.ndarray, num_positions: int
) -> np.ndarray:
    """``[B, S]`` int64 rows of :func:`rope_rows` for ``position_ids [B, S]``: the position,
    plus P where longrope's long table applies (``rope_lengths[b] >
    original_max_position_embeddings``, ``rope_lengths [B]``). The network builds the same
    with layers (:func:`trt_kv.models.llama.rope_layers.add_rope`)."""
    rows = np.asarray(position_ids, np.int64)
    after = long_rope_after(config, num_positions)
    if after is None:
        return rows
    return rows + np.where(np.asarray(rope_lengths) > after, num_positions, 0)[:, None]
