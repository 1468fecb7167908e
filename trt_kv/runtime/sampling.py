"""Next-token choice: greedy, or temperature / top-k sampling with a seed."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trt_kv.errors import check_int, check_real


@dataclass
class Sampler:
    """``temperature == 0`` is greedy (argmax); else softmax(logits / T) over the top k.

    Raises:
        ArgumentError: ``temperature`` negative, NaN or infinite; ``top_k`` not None and not
            an integer >= 1; ``seed`` not an integer >= 0.
    """

    temperature: float = 0.0
    top_k: int | None = None
    seed: int = 0
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.temperature = check_real("temperature", self.temperature, 0.0)
        if self.top_k is not None:
            self.top_k = check_int("top_k", self.top_k, 1)
        self.seed = check_int("seed", self.seed, 0)
        self.rng = np.random.default_rng(self.seed)

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """``logits [B, V]`` -> token ids ``[B]`` int64."""
        if self.temperature == 0:
            return np.argmax(logits, axis=-1)
        z = logits.astype(np.float64) / self.temperature
        if self.top_k is not None and self.top_k < z.shape[-1]:
            kth = np.partition(z, -self.top_k, axis=-1)[:, -self.top_k][:, None]
            z = np.where(z < kth, -np.inf, z)
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        return np.array([self.rng.choice(p.shape[-1], p=row) for row in p])
