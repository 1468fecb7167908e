"""Options ``generate``, ``demo`` and ``chat`` share beyond the model's: sampling (and its
checks, before any model loads), the device-only options and ``--backend``. Nothing heavy is
imported here."""

from __future__ import annotations

import argparse
from pathlib import Path

from trt_kv.cli.checks import integer, real, repetition_penalty, temperature
from trt_kv.errors import ArgumentError, mismatch

BACKENDS = ("reference", "interpreter", "tensorrt", "polygraphy")
GPU_BACKENDS = ("tensorrt", "polygraphy")


def add_sampling_arguments(p: argparse.ArgumentParser, max_new_tokens_help: str) -> None:
    """``--ignore-eos --max-new-tokens --temperature --top-k --top-p --seed
    --repetition-penalty``."""
    p.add_argument(
        "--ignore-eos", action="store_true", help="do not stop at the model's end-of-text ids"
    )
    p.add_argument("--max-new-tokens", type=integer(1), default=None, help=max_new_tokens_help)
    p.add_argument(
        "--temperature",
        type=temperature,
        default=0.0,
        help="sample at this temperature (refused outside Sampler's range, shown); 0: greedy",
    )
    p.add_argument("--top-k", type=integer(1), help="sample from the k most likely tokens")
    p.add_argument(
        "--top-p",
        type=real(0.0, 1.0),
        default=1.0,
        help="sample from the most likely tokens whose probabilities sum to p (1: all)",
    )
    p.add_argument("--seed", type=integer(0), default=0, help="sampling seed")
    p.add_argument(
        "--repetition-penalty",
        type=repetition_penalty,
        default=1.0,
        help="divide (multiply, if negative) the logit of every id already in a sequence by P, "
        "as transformers' repetition_penalty (1: none; refused outside its range, shown)",
    )


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    """``--engine --cuda-graph --runtime-cache --emulate-gpu`` (GPU backends only)."""
    p.add_argument("--engine", type=Path, help="engine file for tensorrt/polygraphy")
    p.add_argument("--cuda-graph", action="store_true", help="replay decode as a CUDA graph")
    p.add_argument(
        "--runtime-cache",
        type=Path,
        help="TensorRT-RTX's just-in-time kernel cache file: loaded if valid, saved at the end",
    )
    p.add_argument(
        "--emulate-gpu",
        action="store_true",
        help="run tensorrt/polygraphy on trt_kv's emulated GPU, on the CPU (a test of the "
        "decode loop; results are emulated, not measured on a GPU)",
    )


def add_backend_argument(p: argparse.ArgumentParser) -> None:
    """``--backend auto|reference|interpreter|tensorrt|polygraphy`` (its default once)."""
    p.add_argument(
        "--backend",
        choices=("auto", *BACKENDS),
        default="auto",
        help="where to run (auto: tensorrt where a GPU is usable, else interpreter)",
    )


def add_threads_argument(p: argparse.ArgumentParser) -> None:
    """``--threads N``: the CPU interpreter's threads (its default once, in build_defaults)."""
    p.add_argument(
        "--threads",
        type=integer(1),
        default=None,
        help="threads the interpreter's products run on, the same results for any count "
        "(default: $TRT_KV_THREADS, else the cores this process may run on)",
    )


def check_sampling_options(args: argparse.Namespace) -> None:
    """Refuse sampling options that contradict each other (``--top-k`` / ``--top-p`` with
    greedy decoding, which ignores them), before any model is loaded (argparse refused
    values out of range). Raises ArgumentError."""
    for flag, given in (("--top-k", args.top_k is not None), ("--top-p", args.top_p != 1.0)):
        if given and args.temperature == 0:
            raise ArgumentError(
                mismatch(flag, "--temperature > 0 (greedy decoding ignores it)", "", "0")
            )


def sampler(args: argparse.Namespace) -> object:
    """The :class:`~trt_kv.runtime.sampling.Sampler` of the sampling options."""
    from trt_kv.runtime.sampling import Sampler

    return Sampler(args.temperature, args.top_k, args.seed, args.top_p)
