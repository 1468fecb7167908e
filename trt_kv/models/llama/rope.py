"""RoPE frequency tables (default and "llama3" scaling), shared by network and reference."""

from __future__ import annotations

import numpy as np

from trt_kv.models.llama.config import LlamaConfig


def inv_freq(config: LlamaConfig) -> np.ndarray:
    """Inverse frequencies ``[H/2]`` float64, with llama3 smoothing when configured."""
    h = config.head_dim
    freq = 1.0 / (config.rope_theta ** (np.arange(0, h, 2, dtype=np.float64) / h))
    s = config.rope_scaling
    if s is None:
        return freq
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * np.pi / freq
    scaled = np.where(wavelen > low_wavelen, freq / s.factor, freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def rope_tables(config: LlamaConfig, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)``, each ``[P, H/2]`` float32 for positions ``0..P-1``."""
    angles = np.arange(num_positions, dtype=np.float64)[:, None] * inv_freq(config)[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
