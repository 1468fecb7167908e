"""An ONNX decoder file as a network of the decoder contract: read, rewritten (unless it is
already), parsed. What the CLI, the engine store and the emulator's recipes call."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import onnx

from trt_kv.builder.contract import DecoderNetwork
from trt_kv.onnx.parse import parse_decoder, parser_update_op
from trt_kv.onnx.reader import read_onnx
from trt_kv.onnx.rewrite import RewriteReport, rewrite_decoder, rewritten_report

REWRITTEN_SUFFIX = ".trt_kv.onnx"  # the rewritten graph, kept next to its engine


@dataclass
class OnnxDecoder:
    """A rewritten ONNX decoder: its bytes and their sha256, what the rewrite did, and the
    parsed network (``decoder``: ``Session(InterpreterBackend(d.decoder))`` runs it)."""

    source: Path
    data: bytes
    report: RewriteReport
    decoder: DecoderNetwork

    @property
    def sha256(self) -> str:
        """The sha256 of the rewritten model's bytes (what an engine's recipe records)."""
        return hashlib.sha256(self.data).hexdigest()

    @property
    def name(self) -> str:
        """The source file's stem: engine files are named after it."""
        stem = self.source.name
        return (
            stem[: -len(REWRITTEN_SUFFIX)] if stem.endswith(REWRITTEN_SUFFIX) else self.source.stem
        )

    def save(self, folder: Path) -> Path:
        """Write the rewritten model as ``<name>.trt_kv.onnx`` in ``folder`` (opens in
        Netron); returns its path."""
        path = Path(folder) / f"{self.name}{REWRITTEN_SUFFIX}"
        path.write_bytes(self.data)
        return path


def rewritten_model(path: Path, max_seq_len: int) -> tuple[onnx.ModelProto, RewriteReport]:
    """The ONNX file ``path`` rewritten with caches of ``max_seq_len`` rows and the update op
    the installed parser imports (:func:`~trt_kv.onnx.parse.parser_update_op`), or as it is
    when it is a rewritten file already (its own S_max then). Raises as :func:`read_onnx`,
    ``parser_update_op`` and :func:`~trt_kv.onnx.rewrite.rewrite_decoder`."""
    model = read_onnx(path)
    report = rewritten_report(model)
    if report is not None:
        return model, report
    return rewrite_decoder(model, max_seq_len, parser_update_op())


def load_onnx_decoder(
    path: Path, *, max_seq_len: int, max_batch: int, max_step_tokens: int
) -> OnnxDecoder:
    """The ONNX decoder file ``path`` rewritten (caches ``[B, N, max_seq_len, H]``) and
    parsed with B <= ``max_batch``, S <= ``max_step_tokens``.

    Raises:
        ArgumentError: no such file, not ONNX; bad sizes.
        NetworkError, ShapeError, UnsupportedLayerError: a graph the rewrite or the parser
            cannot take (each names the tensor or node).
    """
    path = Path(path)
    model, report = rewritten_model(path, max_seq_len)
    data = model.SerializeToString()
    decoder = parse_decoder(
        data,
        path.parent,
        max_batch=max_batch,
        max_step_tokens=min(max_step_tokens, report.max_seq_len),
    )
    return OnnxDecoder(path, data, report, decoder)
