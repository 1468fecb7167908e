"""GGUF files (llama.cpp's format) into a :class:`Checkpoint`, read with the ``gguf`` package.

Every tensor type the package can dequantize (F32, F16, BF16, Q8_0, Q4_0, Q4_1, the K-quants,
the I-quants...) becomes a float array of the requested dtype. llama.cpp's converter permutes
the rows of the Q and K projections of Llama-architecture files for its RoPE layout, and
stores Gemma's norms as ``1 + w``; both are undone here, so the arrays are Hugging Face's. The
config comes from the ``{arch}.*`` metadata, translated to ``config.json`` keys by the
architecture table (:mod:`.gguf_archs`); the tokenizer from the ``tokenizer.ggml.*``
vocabulary and merges.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from trt_kv.checkpoints.checkpoint import Checkpoint, check_finite, producible_eos
from trt_kv.checkpoints.gguf_archs import (
    ROPE_TENSORS,
    TOP_TENSORS,
    GgufArchitecture,
    architecture,
    hf_config,
    token_id,
)
from trt_kv.checkpoints.gguf_blocks import keep_quantized
from trt_kv.checkpoints.tokenizer import TextTokenizer
from trt_kv.errors import ConfigError, mismatch
from trt_kv.progress import track
from trt_kv.quantization import QuantizedMatrix


def unpermute_rows(w: np.ndarray, n_head: int, name: str = "Q/K projection") -> np.ndarray:
    """Undo llama.cpp's Q/K permutation: per head, its converter interleaves the two halves
    of the rotary dimension (rows ``[0, H/2, 1, H/2 + 1, ...]``); this restores Hugging
    Face's half-split order. ``w [n_head * H, D]`` (a bias ``[n_head * H]`` too); ``name``
    is the GGUF tensor's, for the error.

    Raises:
        ConfigError: rows not a multiple of ``2 * n_head`` (head counts that do not fit the
            tensor: a malformed file).
    """
    rows = w.shape[0]
    if n_head < 1 or rows % (2 * n_head):
        raise ConfigError(mismatch(f"{name} rows", f"a multiple of 2 * {n_head} heads", "", rows))
    h = rows // n_head
    return w.reshape(n_head, h // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class _Fields:
    """``GGUFReader.fields`` as plain values, with messages naming the key."""

    def __init__(self, reader: object, path: Path) -> None:
        self.fields = reader.fields
        self.path = path

    def __contains__(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default: object = None) -> object:
        """The value of ``key`` (``default`` when absent). Raises ConfigError: text that is
        not UTF-8."""
        field = self.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except UnicodeDecodeError as err:
            raise ConfigError(
                mismatch(f"{self.path.name}: {key}", "UTF-8 text", "", repr(err.object[:40]))
            ) from err

    def require(self, key: str) -> object:
        if key not in self.fields:
            raise ConfigError(mismatch(f"{self.path.name}: {key}", "a metadata key", "", "missing"))
        return self.get(key)


def _open(path: Path) -> object:
    from gguf import GGUFReader

    if not path.is_file():
        raise ConfigError(mismatch(str(path), "a GGUF file", "", "missing"))
    try:
        return GGUFReader(str(path))
    except Exception as err:  # gguf raises ValueError, struct.error, IndexError... on bad bytes
        raise ConfigError(
            mismatch(str(path), "a GGUF file", "", f"{type(err).__name__}: {err}")
        ) from err


def check_data_layout(reader: object, path: Path) -> None:
    """llama.cpp's rule for where tensor data lies (``gguf_init_from_file_impl``): in the
    order of the tensor infos, each tensor's data starts where the previous one's ends,
    padded to ``general.alignment`` (the first at 0, the start of the data section), and
    is as long as its type and element count say (``n / block * block bytes``); the last
    one ends within the file, which holds nothing after it but its padding. A type that
    does not match the bytes written (Q8_0 in the header over F32 data) or two tensors
    pointed at the same bytes break the chain.

    Raises:
        ConfigError: naming the file, the tensor, the expected and the actual offset (and
            the tensor before it with its type and size), or the file's expected and actual
            size.
    """
    align, start = int(reader.alignment), int(reader.data_offset)
    expected, before = 0, "the start of the data section"
    for t in reader.tensors:
        offset = int(t.data_offset) - start
        if offset != expected:
            raise ConfigError(
                mismatch(
                    f"{path.name}: tensor {t.name}",
                    "data at offset",
                    f"{expected} ({before})",
                    offset,
                )
            )
        size = int(t.n_bytes)
        expected += -(-size // align) * align
        before = (
            f"after {t.name}'s {size} bytes of {t.tensor_type.name} "
            f"{[int(d) for d in t.shape]}, padded to {align}"
        )
    if not reader.tensors:
        return
    end, padded, actual = start + offset + size, start + expected, len(reader.data)
    if not end <= actual <= padded:
        raise ConfigError(
            mismatch(
                f"{path.name}: size",
                f"{end if end == padded else f'{end} to {padded}'} bytes (the last tensor, "
                f"{t.name}, ends at {end}; only its padding to {align} after it)",
                "",
                f"{actual} bytes",
            )
        )


def _tensor_name(name: str, arch: GgufArchitecture) -> str | None:
    if name in TOP_TENSORS:
        return TOP_TENSORS[name]
    parts = name.split(".", 2)
    if (
        len(parts) == 3
        and parts[0] == "blk"
        and parts[1].isdigit()
        and parts[2] in arch.block_tensors
    ):
        return f"model.layers.{parts[1]}.{arch.block_tensors[parts[2]]}"
    return None


def _dequantize(tensor: object, dtype: np.dtype, path: Path) -> np.ndarray:
    from gguf import quants

    try:
        array = quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as err:
        raise ConfigError(
            mismatch(
                f"{path.name}: {tensor.name}",
                "a tensor type gguf can dequantize",
                "",
                tensor.tensor_type.name,
            )
        ) from err
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists ne0 (columns) first
    with np.errstate(over="ignore"):  # past float16's range: inf, refused by check_finite
        return np.asarray(array, dtype=dtype).reshape(shape)


_SPECIAL_KEYS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def _tokenizer(fields: _Fields, arch: GgufArchitecture) -> TextTokenizer:
    """The file's tokenizer. Raises ConfigError: a special token id outside the vocabulary
    (named by its key), or what :meth:`TextTokenizer.from_gguf_vocab` raises."""
    tokens = fields.require("tokenizer.ggml.tokens")
    ids = {name: token_id(fields.get, key) for name, key in _SPECIAL_KEYS.items()}
    for name, value in ids.items():
        if value is not None and not value < len(tokens):
            raise ConfigError(
                mismatch(_SPECIAL_KEYS[name], f"a token id in [0, {len(tokens)})", "", value)
            )
    model = fields.require("tokenizer.ggml.model")
    return TextTokenizer.from_gguf_vocab(
        model=model,
        pre=fields.get("tokenizer.ggml.pre", "default"),
        tokens=tokens,
        merges=fields.get("tokenizer.ggml.merges", []),
        scores=fields.get("tokenizer.ggml.scores", []),
        token_types=fields.get("tokenizer.ggml.token_type", []),
        special_ids=ids,
        # llama.cpp (and transformers) add BOS to a SentencePiece vocabulary that does not
        # say otherwise
        add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", model == "llama")),
        add_space_prefix=bool(fields.get("tokenizer.ggml.add_space_prefix", True)),
        space_pieces=arch.space_pieces,
        chat_template=fields.get("tokenizer.chat_template"),
    )


def read_gguf(path: str | Path, dtype: str | np.dtype = np.float32) -> Checkpoint:
    """Read a GGUF file: config from metadata, every tensor dequantized to ``dtype`` under its
    Hugging Face name (Q/K rows back in Hugging Face order), each quantized matrix also as
    stored (``Checkpoint.quantized``, see :mod:`.gguf_blocks`), EOS ids, the tokenizer. A
    progress bar counts the tensors dequantized (see :mod:`trt_kv.progress`).

    Raises:
        ConfigError: a missing or malformed file (tensor data out of llama.cpp's order or
            size: :func:`check_data_layout`), an architecture not in ``ARCHITECTURES``
            (:mod:`.gguf_archs`, which also refuses metadata it does not build),
            a tensor name or type not known, missing metadata, a tensor holding NaN or
            infinities once dequantized to ``dtype`` (:func:`~.checkpoint.check_finite`).
    """
    path = Path(path)
    reader = _open(path)
    check_data_layout(reader, path)
    fields = _Fields(reader, path)
    arch_name = fields.require("general.architecture")
    arch = architecture(arch_name, path.name)
    by_name = {t.name: t for t in reader.tensors}
    rope = {
        n: _dequantize(by_name[n], np.dtype(np.float32), path) for n in ROPE_TENSORS if n in by_name
    }
    for n, array in rope.items():
        check_finite(n, array, path.name)
    names = {n: _tensor_name(n, arch) for n in by_name if n not in ROPE_TENSORS}
    unknown = sorted(k for k, v in names.items() if v is None)
    if unknown:
        raise ConfigError(
            mismatch(f"{path.name}: tensors", "only known names", "", f"unknown {unknown[:8]}")
        )
    config = hf_config(fields.get, arch_name, set(names.values()), rope)
    if "vocab_size" not in config and "token_embd.weight" in by_name:
        config["vocab_size"] = int(by_name["token_embd.weight"].shape[-1])
    heads = config.get("num_attention_heads")
    permuted = {
        "self_attn.q_proj": heads,
        "self_attn.k_proj": config.get("num_key_value_heads") or heads,
    }
    tensors: dict[str, np.ndarray] = {}
    quantized: dict[str, QuantizedMatrix] = {}
    for name, hf_name in track(names.items(), f"dequantize {path.name}", unit="tensor"):
        tensor = by_name[name]
        array = _dequantize(tensor, np.dtype(dtype), path)
        stored = None
        if array.ndim == 2:
            f32 = partial(_dequantize, tensor, np.dtype(np.float32), path)
            stored = keep_quantized(tensor.tensor_type.name, tensor.data, array.shape, f32)
        if arch.permuted:
            for proj, n_head in permuted.items():
                if f".{proj}." in hf_name and n_head:
                    order = unpermute_rows(np.arange(array.shape[0]), int(n_head), name)
                    array = array[order]
                    stored = None if stored is None else stored.permuted(order)
        if stored is not None:
            quantized[hf_name] = stored
        if arch.norm_offset and hf_name.endswith("norm.weight"):
            # minus the offset in float32, then rounded to dtype once: float16(1 + w) - 1
            # would carry 1's rounding step (2**-11) into every small w
            stored = _dequantize(by_name[name], np.dtype(np.float32), path)
            array = (stored - np.float32(arch.norm_offset)).astype(dtype)
        check_finite(name, array, path.name)  # after dequantizing: as the model gets it
        tensors[hf_name] = array
    eos = [token_id(fields.get, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot")]
    return Checkpoint(
        name=path.stem,
        config=config,
        tensors=tensors,
        eos_token_ids=producible_eos(
            tuple(dict.fromkeys(e for e in eos if e is not None)),
            config.get("vocab_size"),
            path.name,
        ),
        source=str(path),
        quantized=quantized,
        tokenizer_loader=partial(_tokenizer, fields, arch)
        if "tokenizer.ggml.model" in fields
        else None,
    )
