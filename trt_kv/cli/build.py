"""``trt-kv build``: the doc example and the model engine, then a summary table."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from trt_kv.cli import common
from trt_kv.cli.checks import check_model

if TYPE_CHECKING:
    from typing import TextIO

EXAMPLE = "trt-kv build --max-seq-len 512 --max-batch 4 --out engines/"


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p)
    p.add_argument("--no-model", action="store_true", help="only the doc example")


def print_built(out: Path, rows: list, file: TextIO | None = None) -> None:
    """What happened to each engine in ``out`` (``"engines in engines/ (tensorrt_rtx
    1.7.1): 1 built now, 1 reused"``) and one table line per engine, on ``file`` (default:
    stdout)."""
    from trt_kv._trt import FEATURES

    reused = sum(r.reused for r in rows)
    counts = [f"{n} {what}" for n, what in ((len(rows) - reused, "built now"), (reused, "reused"))]
    said = ", ".join(c for c in counts if not c.startswith("0 "))
    print(f"engines in {out} ({FEATURES.module} {FEATURES.version}): {said}", file=file)
    print(common.engine_table(rows), file=file)


def run(args: argparse.Namespace) -> int:
    from trt_kv.engine.store import build_doc_example

    check_model(args)
    model_rows = []
    if not args.no_model:  # first: a bad checkpoint, route or build leaves --out untouched
        m = common.load_cli_model(args)
        model_rows = [common.model_engine(args, m.name, m.config, m.weights, args.max_batch)]
    print_built(args.out, [build_doc_example(args.out), *model_rows])
    return 0
