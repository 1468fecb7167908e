"""GPT-2 weights from Hugging Face tensor names, mapped at load time only.

``GPT2LMHeadModel`` stores its projections as ``Conv1D`` (``[In, Out]``, ``x W + b``) and the
query, key and value projections fused (``attn.c_attn``, ``[D, 3 D]``): the loader transposes
every projection to the ``nn.Linear`` layout ``[Out, In]`` the network and the reference share,
and splits ``c_attn`` into Q, K and V. The head is the token embedding (tied).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trt_kv.errors import ConfigError, ShapeError, mismatch
from trt_kv.models.gpt2.config import GPT2Config
from trt_kv.models.tied_head import check_tied_head


@dataclass(frozen=True)
class GPT2Layer:
    """One block; projections ``[Out, In]``."""

    ln_1: tuple[np.ndarray, np.ndarray]  # (weight [D], bias [D])
    wq: np.ndarray  # [D, D]
    wk: np.ndarray
    wv: np.ndarray
    bq: np.ndarray  # [D]
    bk: np.ndarray
    bv: np.ndarray
    wo: np.ndarray  # [D, D]
    bo: np.ndarray
    ln_2: tuple[np.ndarray, np.ndarray]
    w_fc: np.ndarray  # [F, D]
    b_fc: np.ndarray  # [F]
    w_proj: np.ndarray  # [D, F]
    b_proj: np.ndarray  # [D]


# GPT2Layer field -> the GPT2LMHeadModel tensor (in block ``h.{i}``) it is read from
_SOURCES = {
    "ln_1": ("ln_1.weight", "ln_1.bias"),
    "wq": "attn.c_attn.weight",
    "wk": "attn.c_attn.weight",
    "wv": "attn.c_attn.weight",
    "bq": "attn.c_attn.bias",
    "bk": "attn.c_attn.bias",
    "bv": "attn.c_attn.bias",
    "wo": "attn.c_proj.weight",
    "bo": "attn.c_proj.bias",
    "ln_2": ("ln_2.weight", "ln_2.bias"),
    "w_fc": "mlp.c_fc.weight",
    "b_fc": "mlp.c_fc.bias",
    "w_proj": "mlp.c_proj.weight",
    "b_proj": "mlp.c_proj.bias",
}


@dataclass(frozen=True)
class GPT2Weights:
    wte: np.ndarray  # [V, D], also the head
    wpe: np.ndarray  # [n_positions, D]
    layers: tuple[GPT2Layer, ...]
    ln_f: tuple[np.ndarray, np.ndarray]

    def arrays(self) -> list[np.ndarray]:
        """Every array, in a fixed order (for a digest)."""
        out = [self.wte, self.wpe, *self.ln_f]
        for layer in self.layers:
            for value in vars(layer).values():
                out += list(value) if isinstance(value, tuple) else [value]
        return out

    def named(self) -> list[tuple[str, np.ndarray]]:
        """``(checkpoint tensor name, array)`` of every array (q, k and v each under their
        fused ``c_attn``), for messages that name the tensor a value came from."""
        out = [("wte.weight", self.wte), ("wpe.weight", self.wpe)]
        out += [("ln_f.weight", self.ln_f[0]), ("ln_f.bias", self.ln_f[1])]
        for i, layer in enumerate(self.layers):
            for key, value in vars(layer).items():
                source = _SOURCES[key]
                if isinstance(value, tuple):
                    out += [(f"h.{i}.{n}", v) for n, v in zip(source, value)]
                else:
                    out.append((f"h.{i}.{source}", value))
        return out

    def astype(self, dtype: np.dtype) -> GPT2Weights:
        cast = lambda a: np.asarray(a, dtype)  # noqa: E731
        pair = lambda p: (cast(p[0]), cast(p[1]))  # noqa: E731
        layers = tuple(
            GPT2Layer(
                **{k: pair(v) if isinstance(v, tuple) else cast(v) for k, v in vars(lw).items()}
            )
            for lw in self.layers
        )
        return GPT2Weights(cast(self.wte), cast(self.wpe), layers, pair(self.ln_f))


def gpt2_weights(tensors: dict[str, np.ndarray], config: GPT2Config) -> GPT2Weights:
    """Weights from ``GPT2LMHeadModel`` names (``transformer.`` prefix optional).

    Raises:
        ConfigError: a tensor missing, naming it; a stored ``lm_head.weight`` other than
            ``wte.weight`` (the head is tied: :mod:`trt_kv.models.tied_head`).
        ShapeError: a tensor of another shape than ``config`` gives, naming it.
    """
    t = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    check_tied_head(t, "wte.weight")
    d, f, v = config.n_embd, config.n_inner, config.vocab_size

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in t:
            raise ConfigError(
                mismatch(f"tensor {name}", "present in the checkpoint", "", "missing")
            )
        if tuple(t[name].shape) != shape:
            raise ShapeError(mismatch(f"tensor {name}", "shape", list(shape), list(t[name].shape)))
        return t[name]

    def norm(prefix: str) -> tuple[np.ndarray, np.ndarray]:
        return get(f"{prefix}.weight", (d,)), get(f"{prefix}.bias", (d,))

    layers = []
    for i in range(config.n_layer):
        p = f"h.{i}"
        qkv = get(f"{p}.attn.c_attn.weight", (d, 3 * d)).T  # Conv1D [In, Out] -> [Out, In]
        bias = get(f"{p}.attn.c_attn.bias", (3 * d,))
        layers.append(
            GPT2Layer(
                ln_1=norm(f"{p}.ln_1"),
                wq=qkv[:d],
                wk=qkv[d : 2 * d],
                wv=qkv[2 * d :],
                bq=bias[:d],
                bk=bias[d : 2 * d],
                bv=bias[2 * d :],
                wo=get(f"{p}.attn.c_proj.weight", (d, d)).T,
                bo=get(f"{p}.attn.c_proj.bias", (d,)),
                ln_2=norm(f"{p}.ln_2"),
                w_fc=get(f"{p}.mlp.c_fc.weight", (d, f)).T,
                b_fc=get(f"{p}.mlp.c_fc.bias", (f,)),
                w_proj=get(f"{p}.mlp.c_proj.weight", (f, d)).T,
                b_proj=get(f"{p}.mlp.c_proj.bias", (d,)),
            )
        )
    wte = get("wte.weight", (v, d))
    wpe = get("wpe.weight", (config.n_positions, d))
    return GPT2Weights(wte, wpe, tuple(layers), norm("ln_f"))
