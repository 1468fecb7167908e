"""RoPE frequency tables (default and "llama3" scaling), shared by the network and the reference.

Computed the way Hugging Face computes them, in float32: inverse frequencies
``1 / theta ** (2i / H)`` rounded to float32, angles ``float32(position) * inv_freq`` rounded
to float32, then cos/sin. A float64 table rounded at the end differs from Hugging Face by
~2e-4 at position 4000 (the float32 angle's rounding error grows with the position), which
flips float16 roundings; these tables stay within one float32 ulp of Hugging Face's.
"""

from __future__ import annotations

import math

import numpy as np

from trt_kv.errors import ConfigError, mismatch
from trt_kv.models.llama.config import LlamaConfig, LongRope

_F32 = np.float32


def _reciprocal(x: np.ndarray) -> np.ndarray:
    return (_F32(1.0) / x).astype(_F32)


def inv_freq(config: LlamaConfig) -> np.ndarray:
    """Inverse frequencies ``[R/2]`` float32 (R = ``config.rotary_dim``), with llama3
    smoothing or longrope's short factors when configured.

    Every operation rounds to float32 as torch does (``scalar / tensor`` is a reciprocal
    times the scalar); ``theta ** e`` is the correctly rounded float32 power.
    """
    h = config.rotary_dim
    exponents = (np.arange(0, h, 2, dtype=_F32) / _F32(h)).astype(_F32)
    power = np.power(np.float64(config.rope_theta), exponents.astype(np.float64)).astype(_F32)
    s = config.rope_scaling
    if isinstance(s, LongRope):
        return _reciprocal((np.asarray(s.short_factor, _F32) * power).astype(_F32))
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


def rope_angles(config: LlamaConfig, num_positions: int) -> np.ndarray:
    """``[P, R/2]`` float32 angles ``float32(p) * inv_freq`` for positions ``0..P-1``."""
    positions = np.arange(num_positions, dtype=_F32)[:, None]
    return (positions * inv_freq(config)[None, :]).astype(_F32)


def rope_tables(config: LlamaConfig, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)``, each ``[P, R/2]`` float32 for positions ``0..P-1`` (times longrope's
    attention factor, in float32, as Hugging Face does).

    Raises:
        ConfigError: longrope with P past ``original_max_position_embeddings``: Hugging Face
            then switches every position, cached keys included, to the long factors, which a
            cache of already-rotated keys cannot follow; trt_kv builds the short factors only.
    """
    angles = rope_angles(config, num_positions).astype(np.float64)
    cos, sin = np.cos(angles).astype(_F32), np.sin(angles).astype(_F32)
    s = config.rope_scaling
    if isinstance(s, LongRope):
        if num_positions > s.original_max_position_embeddings:
            raise ConfigError(
                mismatch(
                    "max_seq_len (longrope)",
                    f"<= original_max_position_embeddings = {s.original_max_position_embeddings}"
                    " (short factors only)",
                    "",
                    num_positions,
                )
            )
        factor = _F32(s.attention_factor)
        cos, sin = (cos * factor).astype(_F32), (sin * factor).astype(_F32)
    return cos, sin
