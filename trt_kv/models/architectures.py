"""Which architecture builds a checkpoint: the one table the loader, the engine store and the CLI
dispatch on (``config.json``'s ``model_type``: ``gpt2`` is GPT-2, ``onnx`` an ONNX decoder
file (:mod:`trt_kv.models.onnx_file`), any other is the Llama family, whose own table refuses
what it does not build).

Each row gives the steps a model goes through, as functions: config from ``config.json``,
weights from Hugging Face tensors, the network (a contract network:
:mod:`trt_kv.contract`), the reference backend (its oracle), the S_max check and
the S_max taken when none is given; and the config keys ``trt-kv inspect`` shows of an
engine's recipe (:func:`describe_recipe`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from trt_kv import build_defaults as defaults
from trt_kv.errors import ArgumentError, mismatch


@dataclass(frozen=True)
class Architecture:
    """The functions one architecture is built and checked with."""

    name: str  # "llama", "gpt2": the sidecar's recipe names it
    config_type: type
    weights_type: type
    config_from_hf: Callable[[dict], object]
    # (HF tensors, config, the checkpoint's quantized matrices by HF name) -> weights
    weights: Callable[[dict, object, dict], object]
    build_network: Callable[..., object]  # (config, weights, **BuildOptions) -> network
    reference_backend: Callable[..., object]  # (config, weights, capacity=, max_seq_len=, ...)
    check_max_seq_len: Callable[[object, int, str], None]  # (config, S_max, option name)
    default_max_seq_len: Callable[[object], int]  # config -> S_max when none is given
    weight_arrays: Callable[[object], list[np.ndarray]]  # every array, in a fixed order
    shown: tuple[str, ...]  # the config JSON keys ``trt-kv inspect`` shows, in order

    def describe(self, config: Mapping[str, object]) -> list[tuple[str, str]]:
        """The ``(key, value)`` rows ``trt-kv inspect`` prints of a sidecar's recipe
        ``config`` (its JSON as written: shown, not checked): the :attr:`shown` keys it has."""
        return _rows(self.shown, config)


def _llama() -> Architecture:
    from trt_kv.models.llama import LlamaConfig, LlamaWeights, build_llama_network, llama_weights
    from trt_kv.models.llama.reference_backend import ReferenceBackend
    from trt_kv.models.llama.rope_layers import check_table_memory

    def arrays(w: object) -> list[np.ndarray]:
        out = [w.embed, w.final_norm, w.lm_head]
        return out + [a for layer in w.layers for a in vars(layer).values()]

    return Architecture(
        "llama",
        LlamaConfig,
        LlamaWeights,
        LlamaConfig.from_hf,
        llama_weights,
        build_llama_network,
        ReferenceBackend,
        check_table_memory,
        lambda config: defaults.MAX_SEQ_LEN,
        arrays,
        (
            "model_type",
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
        ),
    )


def _gpt2() -> Architecture:
    from trt_kv.models.gpt2 import (
        GPT2Config,
        GPT2ReferenceBackend,
        GPT2Weights,
        build_gpt2_network,
        gpt2_weights,
    )

    def weights(tensors: dict, config: object, quantized: dict) -> object:
        if quantized:  # only GGUF files hold quantized matrices, and no GPT-2 GGUF is read
            raise ArgumentError(mismatch("GPT-2 weights", "float tensors", "", "quantized ones"))
        return gpt2_weights(tensors, config)

    return Architecture(
        "gpt2",
        GPT2Config,
        GPT2Weights,
        GPT2Config.from_hf,
        weights,
        build_gpt2_network,
        GPT2ReferenceBackend,
        GPT2Config.check_max_seq_len,
        GPT2Config.default_max_seq_len,
        lambda w: w.arrays(),
        ("model_type", "n_layer", "n_embd", "n_head", "n_positions"),
    )


def _onnx() -> Architecture:
    from trt_kv.models import onnx_file as f

    return Architecture(
        "onnx",
        f.OnnxConfig,
        f.OnnxWeights,
        f.onnx_config,
        f.onnx_weights,
        f.build_onnx_network,
        f.refuse_reference,
        lambda config, s_max, option: None,  # any S_max: the rewrite sizes the caches
        lambda config: defaults.MAX_SEQ_LEN,
        f.onnx_arrays,
        ("model_type", "sha256", "dtype"),
    )


_ARCHITECTURES = {"llama": _llama, "gpt2": _gpt2, "onnx": _onnx}


def architecture_named(name: str) -> Architecture:
    """Raises ArgumentError for a name not in the table."""
    if name not in _ARCHITECTURES:
        raise ArgumentError(mismatch("architecture", "one of", sorted(_ARCHITECTURES), repr(name)))
    return _ARCHITECTURES[name]()


def describe_recipe(model: object, config: Mapping[str, object]) -> list[tuple[str, str]]:
    """The ``(key, value)`` rows ``trt-kv inspect`` prints of a sidecar's recipe ``config``:
    those of the ``model`` its recipe names (:meth:`Architecture.describe`), or, for a model
    not in the table (a sidecar written elsewhere, or edited), every architecture's keys
    ``config`` has, each once, in table order."""
    if isinstance(model, str) and model in _ARCHITECTURES:
        return architecture_named(model).describe(config)
    keys = (key for name in _ARCHITECTURES for key in architecture_named(name).shown)
    return _rows(tuple(dict.fromkeys(keys)), config)


def _rows(keys: tuple[str, ...], config: Mapping[str, object]) -> list[tuple[str, str]]:
    return [(key, str(config[key])) for key in keys if key in config]


def architecture_of_hf(config: dict) -> Architecture:
    """The architecture of a ``config.json`` (by ``model_type``)."""
    kind = config.get("model_type")
    return architecture_named(kind if kind in ("gpt2", "onnx") else "llama")


def architecture_of(config_or_weights: object) -> Architecture:
    """The architecture of a parsed config (a ``LlamaConfig``, a ``GPT2Config``) or of its
    weights.

    Raises:
        ArgumentError: an object of no architecture.
    """
    for name in _ARCHITECTURES:
        arch = architecture_named(name)
        if isinstance(config_or_weights, (arch.config_type, arch.weights_type)):
            return arch
    raise ArgumentError(
        mismatch(
            "config",
            "a config or weights of " + ", ".join(_ARCHITECTURES),
            "",
            type(config_or_weights).__name__,
        )
    )
