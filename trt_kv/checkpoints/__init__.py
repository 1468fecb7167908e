"""Checkpoint readers: each produces one in-memory :class:`Checkpoint` (config, arrays under
Hugging Face names, EOS ids, tokenizer) that the architecture in ``trt_kv.models`` consumes.

read_checkpoint("default")            # SmolLM2-135M-Instruct, fetched once (see default.py)
read_checkpoint("path/to/folder")     # Hugging Face folder (config.json + safetensors)
read_checkpoint("path/to/model.gguf") # llama.cpp GGUF, dequantized
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_kv.checkpoints.checkpoint import Checkpoint
from trt_kv.checkpoints.default import default_checkpoint, default_gguf
from trt_kv.checkpoints.gguf import read_gguf
from trt_kv.checkpoints.hf import read_hf_folder
from trt_kv.checkpoints.tokenizer import TextTokenizer
from trt_kv.errors import ConfigError, mismatch


def read_checkpoint(
    spec: str | Path, dtype: str | np.dtype = np.float32, progress: bool = True
) -> Checkpoint:
    """``"default"``, a Hugging Face folder, or a ``.gguf`` file (dequantized to ``dtype``);
    ``progress``: show the default model's download progress.

    Raises:
        ConfigError: anything else, or what the reader raises. DownloadError: the default
            model cannot be obtained.
    """
    if str(spec) == "default":
        return default_checkpoint(progress=progress)
    path = Path(spec)
    if path.suffix.lower() == ".gguf":
        return read_gguf(path, dtype)
    if path.is_dir():
        return read_hf_folder(path)
    what = "a file that is not .gguf" if path.exists() else "missing"
    raise ConfigError(
        mismatch(
            "spec", "'default', a checkpoint folder or a .gguf file", "", f"{what} {str(spec)!r}"
        )
    )


__all__ = [
    "Checkpoint",
    "TextTokenizer",
    "default_checkpoint",
    "default_gguf",
    "read_checkpoint",
    "read_gguf",
    "read_hf_folder",
]
