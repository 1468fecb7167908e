"""Decoders exported to ONNX with a growing cache by scripts/export_decoder_onnx.py (the
recipe docs/onnx.md shows; the tiny models are :func:`tests.support.onnx_decoders.tiny_model`),
and onnxruntime's greedy ids on such a graph: the oracle of the ONNX tests."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[5, 17, 42, 8, 33, 3, 61], [61, 3], [7, 9, 11, 13]]  # three lengths, one batch
NEW_TOKENS = 32


@cache
def exporter() -> object:
    """scripts/export_decoder_onnx.py as a module (``export_decoder``, ``cache_shape``)."""
    path = ROOT / "scripts" / "export_decoder_onnx.py"
    spec = importlib.util.spec_from_file_location("export_decoder_onnx", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def export(model: object, path: Path, dynamo: bool = False) -> Path:
    """``model`` exported to ``path`` by scripts/export_decoder_onnx.py (torch's TorchScript
    exporter, or its dynamo exporter)."""
    return exporter().export_decoder(model, path, dynamo=dynamo)


def ort_greedy(path: Path, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy ids after ``prompt`` from onnxruntime on the ORIGINAL graph at ``path``:
    one prompt alone, the cache growing by concatenation every step."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    pasts = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    feed = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in pasts}
    ids, out, start = list(prompt), [], 0
    while len(out) < n:
        step = np.array([ids[start:]], np.int64)
        total = len(ids)
        results = session.run(
            None,
            {
                "input_ids": step,
                "attention_mask": np.ones((1, total), np.int64),
                "position_ids": np.arange(start, total, dtype=np.int64)[None],
                **feed,
            },
        )
        names = [o.name for o in session.get_outputs()]
        got = dict(zip(names, results))
        feed = {p.name: got[p.name.replace("past_key_values.", "present.")] for p in pasts}
        token = int(np.argmax(got["logits"][0, -1]))
        out.append(token)
        ids.append(token)
        start = total
    return out
