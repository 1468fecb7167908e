"""The models ``--model`` names, loaded: the default SmolLM2-135M-Instruct, a folder of any
architecture trt_kv builds, a GGUF file; and the seeded random checkpoint of the default's
shape."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from trt_kv.checkpoints import Checkpoint, read_checkpoint
from trt_kv.errors import ArgumentError, DownloadError, mismatch
from trt_kv.models.architectures import architecture_of_hf
from trt_kv.models.llama import LlamaConfig, random_weights, to_hf_tensors
from trt_kv.onnx import is_onnx


@dataclass
class Model:
    """A checkpoint and what its architecture (:mod:`trt_kv.models.architectures`) made of it."""

    name: str  # engine files are named after it
    config: object  # LlamaConfig, GPT2Config
    weights: object  # LlamaWeights, GPT2Weights
    checkpoint: Checkpoint  # .tokenizer(), .eos_token_ids, .random


def random_checkpoint(seed: int = 0) -> Checkpoint:
    """The SmolLM2-135M shape with seeded random weights (not a trained model)."""
    config = LlamaConfig.smollm2_135m()
    tensors = to_hf_tensors(random_weights(config, seed=seed))
    return Checkpoint("smollm2-135m-random", config.to_hf(), tensors, random=True)


def load_model(
    spec: str | Path = "default",
    seed: int = 0,
    progress: bool = True,
    tokenizer: Path | None = None,
) -> Model:
    """``"default"`` (SmolLM2-135M-Instruct, fetched once; seeded random weights, said in one
    line on stderr, when it cannot be obtained), a Hugging Face folder, a GGUF file, or an
    ONNX decoder file (``.onnx``: :mod:`trt_kv.models.onnx_file`; its tokenizer from the
    folder ``tokenizer`` when given).

    Raises:
        ArgumentError: ``spec`` not a non-empty string or path.
        ConfigError, ShapeError, DTypeError: a checkpoint trt_kv cannot build.
    """
    if not isinstance(spec, (str, Path)) or str(spec) == "":
        raise ArgumentError(
            mismatch("spec", "'default', a checkpoint folder or a .gguf file", "", repr(spec))
        )
    if is_onnx(spec):
        from trt_kv.models.onnx_file import load_onnx_parts

        checkpoint, config, weights = load_onnx_parts(Path(spec), tokenizer)
        return Model(checkpoint.name, config, weights, checkpoint)
    try:
        checkpoint = read_checkpoint(spec, progress=progress)
    except DownloadError as err:
        if str(spec) != "default":
            raise
        print(
            f"trt_kv: default model unavailable ({err}); "
            "using seeded random weights (SmolLM2-135M shape, untrained: the text is noise)",
            file=sys.stderr,
        )
        checkpoint = random_checkpoint(seed)
    arch = architecture_of_hf(checkpoint.config)
    config = arch.config_from_hf(checkpoint.config)
    weights = arch.weights(checkpoint.tensors, config, checkpoint.quantized)
    return Model(checkpoint.name, config, weights, checkpoint)
