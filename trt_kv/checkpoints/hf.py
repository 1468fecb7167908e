"""Hugging Face checkpoint folders (as ``save_pretrained`` writes them) into a
:class:`Checkpoint`: ``config.json``, ``generation_config.json``, single or sharded
safetensors, and the tokenizer files."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np

from trt_kv.checkpoints.checkpoint import Checkpoint, check_finite, eos_ids, producible_eos
from trt_kv.checkpoints.tokenizer import TextTokenizer
from trt_kv.errors import ConfigError, mismatch


def read_json(path: Path) -> dict:
    """A JSON object from ``path``.

    Raises:
        ConfigError: missing, not UTF-8, not JSON, or not an object (the cause is kept).
    """
    if not path.is_file():
        raise ConfigError(mismatch(str(path), "a file", "", "missing"))
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(mismatch(str(path), "JSON", "", err)) from err
    if not isinstance(value, dict):
        raise ConfigError(mismatch(str(path), "a JSON object", "", type(value).__name__))
    return value


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a folder: the shards its index names, or ``model.safetensors``.

    Raises:
        ConfigError: neither file, a malformed index, or a shard it names missing.
    """
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise ConfigError(
                mismatch(f"{index}: weight_map", "an object of file names", "", weight_map)
            )
        files = [folder / n for n in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ConfigError(
                mismatch(str(index), "every shard it names", "", f"missing {missing}")
            )
        return files
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    raise ConfigError(
        mismatch(str(folder), "model.safetensors or model.safetensors.index.json", "", "neither")
    )


def read_safetensors(files: list[Path]) -> dict[str, np.ndarray]:
    """Every tensor of ``files`` by name (bfloat16 through ml_dtypes).

    Raises:
        ConfigError: a file safetensors cannot read, a name in two files, or a tensor
            holding NaN or infinities (:func:`~.checkpoint.check_finite`).
    """
    from safetensors import SafetensorError, safe_open

    from trt_kv.progress import track

    tensors: dict[str, np.ndarray] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as f:
                for key in track(list(f.keys()), f"load {path.name}", unit="tensor"):
                    if key in tensors:
                        raise ConfigError(
                            mismatch(key, "in one file only", "", f"again in {path.name}")
                        )
                    tensors[key] = f.get_tensor(key)
                    check_finite(key, tensors[key], path.name)
        except (SafetensorError, OSError, ValueError, TypeError) as err:
            if isinstance(err, ConfigError):
                raise
            raise ConfigError(mismatch(str(path), "a safetensors file", "", err)) from err
    return tensors


def read_generation_eos(folder: Path, config: dict) -> tuple[int, ...]:
    """EOS ids: ``generation_config.json``'s ``eos_token_id`` (one or several), else
    ``config.json``'s, as transformers' ``generate`` takes them."""
    path = folder / "generation_config.json"
    if path.is_file():
        generation = read_json(path)
        if "eos_token_id" in generation:
            return eos_ids(generation["eos_token_id"], f"{path}: eos_token_id")
    return eos_ids(config.get("eos_token_id"), f"{folder / 'config.json'}: eos_token_id")


def read_hf_folder(folder: str | Path) -> Checkpoint:
    """Read a Hugging Face folder into a checkpoint (arrays as stored, no dtype change; EOS
    ids past ``vocab_size`` dropped, said on stderr: :func:`~.checkpoint.producible_eos`).

    Raises:
        ConfigError: the folder, ``config.json`` or a shard missing; malformed JSON or
            safetensors (the library's error is the cause).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(mismatch(str(folder), "a checkpoint folder", "", "missing"))
    config = read_json(folder / "config.json")
    tensors = read_safetensors(safetensors_files(folder))
    has_tokenizer = (folder / "tokenizer.json").is_file()
    return Checkpoint(
        name=folder.resolve().name,
        config=config,
        tensors=tensors,
        eos_token_ids=producible_eos(
            read_generation_eos(folder, config), config.get("vocab_size"), str(folder)
        ),
        source=str(folder),
        tokenizer_loader=partial(TextTokenizer.from_folder, folder) if has_tokenizer else None,
    )
