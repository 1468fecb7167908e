"""An ONNX decoder file as a model ``--model`` names: its config, its "weights" (the file's
bytes: what an engine's recipe keys on), and its network (rewritten and parsed by
:mod:`trt_kv.onnx`). The ``onnx`` row of :mod:`trt_kv.models.architectures`."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np

from trt_kv import build_defaults as defaults
from trt_kv.builder.routes import Routes
from trt_kv.checkpoints import Checkpoint
from trt_kv.checkpoints.tokenizer import TextTokenizer
from trt_kv.errors import ArgumentError, ShapeError, mismatch

DTYPES = {1: "float32", 10: "float16", 16: "bfloat16"}  # ONNX elem_type -> dtype name


@dataclass(frozen=True)
class OnnxConfig:
    """What names an ONNX decoder: the file's sha256 (not its name or folder: a renamed copy
    is the same model), the caches' dtype and the vocabulary V (the ``logits`` output's last
    axis)."""

    sha256: str
    dtype: str
    vocab_size: int
    model_type: str = "onnx"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class OnnxWeights:
    """The ONNX file: its path and bytes (its external data, if any, stays beside it)."""

    path: Path
    data: bytes


@dataclass
class OnnxNetwork:
    """The parsed network with the fields of a model's network, and the rewritten graph
    (:attr:`beside_engine`: written next to its engine, where it opens in Netron)."""

    builder: object
    network: object
    profiles: list
    roles: object
    keep: object
    config: OnnxConfig
    rewritten: object  # trt_kv.onnx.decoder.OnnxDecoder

    def metadata(self) -> dict:
        """What the sidecar records beside the roles: the config and what was rewritten."""
        report = self.rewritten.report
        return {
            "model": "onnx",
            "config": self.config.to_json(),
            "dtype": self.config.dtype,
            "onnx_rewrite": {**report.to_json(), "sha256": self.rewritten.sha256},
        }

    def beside_engine(self) -> dict[str, bytes]:
        """File suffix -> bytes to keep next to the engine file: the rewritten graph."""
        from trt_kv.onnx.decoder import REWRITTEN_SUFFIX

        return {REWRITTEN_SUFFIX: self.rewritten.data}


def load_onnx_checkpoint(path: Path, tokenizer: Path | None = None) -> Checkpoint:
    """The file ``path`` as a checkpoint: no tensors, its bytes in :func:`onnx_weights`;
    the tokenizer of the folder ``tokenizer`` (``tokenizer.json``), else of the file's own
    folder when it has one (Optimum's layout), else none (ids only).

    Raises:
        ArgumentError: no such file; a ``tokenizer`` folder without ``tokenizer.json``.
    """
    path = Path(path)
    if not path.is_file():
        got = f"{str(path)!r} (no such file)"
        raise ArgumentError(mismatch("--model", "an ONNX file", "", got))
    folder = path.parent if tokenizer is None else Path(tokenizer)
    has = (folder / "tokenizer.json").is_file()
    if tokenizer is not None and not has:
        raise ArgumentError(
            mismatch("--tokenizer", "a folder with tokenizer.json", "", f"{str(tokenizer)!r}")
        )
    return Checkpoint(
        name=path.name[: -len(".onnx")],
        config={"model_type": "onnx", "file": str(path)},
        tensors={},
        source=str(path),
        tokenizer_loader=partial(TextTokenizer.from_folder, folder) if has else None,
    )


def onnx_config(hf_like: dict) -> OnnxConfig:
    """The config of the file a checkpoint's config names (sha256, the caches' dtype)."""
    import onnx

    path = Path(hf_like["file"])
    data = path.read_bytes()
    graph = onnx.load_model_from_string(data).graph
    past = [t for t in graph.input if t.name.startswith("past")] or list(graph.input)
    dtype = DTYPES.get(past[0].type.tensor_type.elem_type, "float32")
    logits = [t for t in graph.output if t.name == "logits"] or list(graph.output)
    vocab = logits[0].type.tensor_type.shape.dim[-1].dim_value if logits else 0
    if vocab < 1:
        raise ShapeError(mismatch(f"{path.name}: logits", "a static V (last axis)", "", vocab))
    return OnnxConfig(hashlib.sha256(data).hexdigest(), dtype, vocab)


def onnx_weights(tensors: dict, config: OnnxConfig, quantized: dict) -> OnnxWeights:
    """Never called: :func:`trt_kv.models.loading.load_model` reads an ONNX file's bytes
    itself (a checkpoint of one holds no tensors). Raises ArgumentError."""
    raise ArgumentError(mismatch("ONNX weights", "the file, read by load_model", "", "tensors"))


def load_onnx_parts(path: Path, tokenizer: Path | None = None) -> tuple:
    """``(checkpoint, config, weights)`` of the ONNX file ``path`` (as
    :func:`load_onnx_checkpoint`)."""
    checkpoint = load_onnx_checkpoint(path, tokenizer)
    config = onnx_config(checkpoint.config)
    return checkpoint, config, OnnxWeights(Path(path), Path(path).read_bytes())


def build_onnx_network(
    config: OnnxConfig,
    weights: OnnxWeights,
    *,
    max_seq_len: int = defaults.MAX_SEQ_LEN,
    max_batch: int = defaults.MAX_BATCH,
    max_step_tokens: int | None = None,
    dtype: str | None = None,
    all_logits: bool = True,
    routes: Routes | None = None,
    weight_format: str | None = None,
    device_top_k: int | None = None,
) -> OnnxNetwork:
    """The decoder network of the ONNX file (:func:`trt_kv.onnx.decoder.load_onnx_decoder`):
    caches ``[B, N, max_seq_len, H]``, logits of every position ``[B, S, V]``.

    Raises:
        ArgumentError: an option the graph fixes, given otherwise: ``dtype`` other than the
            graph's, ``routes``, ``weight_format``, ``device_top_k`` >= 1, ``all_logits`` off.
        NetworkError, ShapeError, UnsupportedLayerError: as ``load_onnx_decoder``.
    """
    from trt_kv.onnx.decoder import load_onnx_decoder

    fixed = {
        "dtype": (dtype, (None, config.dtype), f"the graph's {config.dtype}"),
        "routes": (routes, (None, Routes()), "auto (the graph's own layers)"),
        "weight_format": (weight_format, (None,), "none (the graph's own weights)"),
        "device_top_k": (device_top_k, (None, 0), "0 (the graph's logits [B, S, V])"),
        "all_logits": (all_logits, (True,), "true (the graph's logits [B, S, V])"),
    }
    for name, (value, allowed, want) in fixed.items():
        if value not in allowed:
            raise ArgumentError(mismatch(f"{name} of an ONNX model", "", want, repr(value)))
    step = max_step_tokens or defaults.default_step_tokens(max_seq_len)
    d = load_onnx_decoder(
        weights.path, max_seq_len=max_seq_len, max_batch=max_batch, max_step_tokens=step
    )
    n = d.decoder
    return OnnxNetwork(n.builder, n.network, n.profiles, n.roles, n.keep, config, d)


def refuse_reference(config: object, *args: object, **kwargs: object) -> None:
    """The reference backend runs trt_kv's own architectures only: ArgumentError."""
    raise ArgumentError(
        mismatch(
            "--backend reference",
            "a model of trt_kv's own architectures (llama, gpt2)",
            "",
            "an ONNX graph (use --backend interpreter, or a GPU backend)",
        )
    )


def onnx_arrays(weights: OnnxWeights) -> list[np.ndarray]:
    """The file's bytes as one array (what the weights' sha256 covers)."""
    return [np.frombuffer(weights.data, np.uint8)]
