"""GPT-2 configuration from a Hugging Face ``config.json`` (``GPT2Config``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trt_kv import build_defaults as defaults
from trt_kv.errors import ConfigError, ShapeError, mismatch
from trt_kv.models.config_values import positive_int, positive_number

# config.json keys whose other values trt_kv does not build, with the value it builds
_FIXED = {
    "activation_function": "gelu_new",
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class GPT2Config:
    """The sizes of a GPT-2 (``n_inner`` None in config.json is ``4 * n_embd``).

    Raises:
        ConfigError: a size that is not an integer > 0, ``layer_norm_epsilon`` not a finite
            number > 0 (each named as its ``config.json`` key).
    """

    vocab_size: int
    n_positions: int  # rows of the learned position table: the longest sequence
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name != "layer_norm_epsilon":
                positive_int(f"config.{f.name}", getattr(self, f.name))
        positive_number("config.layer_norm_epsilon", self.layer_norm_epsilon)
        object.__setattr__(self, "layer_norm_epsilon", float(self.layer_norm_epsilon))

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_hf(cls, d: dict) -> GPT2Config:
        """Raises ConfigError naming a missing or non-positive size (``n_inner`` 0 too: null
        is ``4 * n_embd``), ``layer_norm_epsilon`` NaN, not > 0 or not a number (the string
        ``"1e-5"``, which transformers refuses as well), ``n_embd`` not a multiple of
        ``n_head``, or a switch (activation, attention scaling, untied head) trt_kv does
        not build."""
        for key, value in _FIXED.items():
            if d.get(key, value) != value:
                raise ConfigError(mismatch(f"config.{key}", "", value, repr(d[key])))
        try:
            sizes = {k: d[k] for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")}
        except KeyError as err:
            raise ConfigError(mismatch("config.json", "GPT-2 key", err.args[0], "missing")) from err
        for k, v in sizes.items():
            positive_int(f"config.{k}", v)
        # null is 4 * n_embd; 0 is not (transformers builds a zero-width MLP, then refuses
        # the checkpoint's c_fc for its shape)
        inner = d.get("n_inner")
        inner = 4 * sizes["n_embd"] if inner is None else inner
        if sizes["n_embd"] % sizes["n_head"]:
            raise ConfigError(
                mismatch(
                    "config.n_embd",
                    f"a multiple of n_head = {sizes['n_head']}",
                    "",
                    sizes["n_embd"],
                )
            )
        return cls(**sizes, n_inner=inner, layer_norm_epsilon=d.get("layer_norm_epsilon", 1e-5))

    def to_json(self) -> dict:
        return {"model_type": "gpt2", **dataclasses.asdict(self)}

    def default_max_seq_len(self) -> int:
        """S_max when none is given: the default (:mod:`trt_kv.build_defaults`), or
        ``n_positions`` when that is smaller (a given S_max past it is refused)."""
        return min(defaults.MAX_SEQ_LEN, self.n_positions)

    def check_max_seq_len(self, max_seq_len: int, option: str = "max_seq_len") -> None:
        """Raise ShapeError naming ``option`` when S_max passes ``n_positions`` (the learned
        position table has no row for a later position)."""
        if max_seq_len > self.n_positions:
            raise ShapeError(
                mismatch(
                    option,
                    f"<= n_positions = {self.n_positions} (GPT-2's position table)",
                    "",
                    max_seq_len,
                )
            )
