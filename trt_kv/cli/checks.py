"""Argument checks of the ``trt-kv`` command line: argparse types that refuse what the
runtime would reinterpret (negative sizes, NaN, ``1,,2``), and the checks that need several
options at once (an option the chosen backend ignores, ``--out`` under a file, a missing
``--model`` folder). Each failure is one ``trt-kv: error: ...`` line and exit status 2.

Nothing heavy is imported here (``trt-kv --help`` stays fast).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from trt_kv.errors import ArgumentError, mismatch

ENGINE_BACKENDS = ("tensorrt", "polygraphy")  # run a TensorRT engine
NETWORK_BACKENDS = ("interpreter", *ENGINE_BACKENDS)  # build trt_kv's network
# Options that only some backends read: option -> (its dest, the backends that read it).
# Given (truthy) with another backend, check_backend_options refuses it by name.
BACKEND_ONLY = {
    "--engine": ("engine", ENGINE_BACKENDS),
    "--cuda-graph": ("cuda_graph", ("tensorrt",)),
    "--runtime-cache": ("runtime_cache", ("tensorrt",)),
    "--emulate-gpu": ("emulate_gpu", ENGINE_BACKENDS),
    "--compute-capability": ("compute_capability", ENGINE_BACKENDS),
    "--weights": ("weight_format", NETWORK_BACKENDS),
    "--device-top-k": ("device_top_k", NETWORK_BACKENDS),
}
# Of those, the ones the engine build reads: a command that builds the engine whatever
# backend then runs (demo) reads them on every backend.
BUILD_OPTIONS = ("--compute-capability", "--weights", "--device-top-k")


def integer(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer >= ``lo`` (and <= ``hi`` if given; ``--max-seq-len -3`` is
    refused by argparse)."""
    bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer {bounds}, got {text!r}"
            ) from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected an integer {bounds}, got {value}")
        return value

    parse.__name__ = f"integer {bounds}"
    return parse


def real(lo: float, hi: float | None = None) -> Callable[[str], float]:
    """argparse type: a finite number >= ``lo`` (and <= ``hi`` if given; ``nan``, ``inf``
    and ``-1`` refused)."""
    bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number {bounds}, got {text!r}") from None
        if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected a finite number {bounds}, got {text}")
        return value

    parse.__name__ = f"number {bounds}"
    return parse


def runtime_checked(module: str, check: str) -> Callable[[str], float]:
    """argparse type: a number that the runtime's own ``module.check`` accepts (imported
    when the option is given: the range is checked at one place); its message, less the
    runtime's name for the value, is argparse's, which names the option."""

    def parse(text: str) -> float:
        import importlib

        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        try:
            return getattr(importlib.import_module(module), check)(value)
        except ArgumentError as err:  # "temperature: expected ...": argparse names the option
            raise argparse.ArgumentTypeError(str(err).split(": ", 1)[1]) from None

    parse.__name__ = check.removeprefix("check_")
    return parse


# --temperature: 0 (greedy) or a number in trt_kv.runtime.sampling.TEMPERATURES
temperature = runtime_checked("trt_kv.runtime.sampling", "check_temperature")
# --repetition-penalty: a number in trt_kv.runtime.penalty.PENALTIES
repetition_penalty = runtime_checked("trt_kv.runtime.penalty", "check_repetition_penalty")


def routes(text: str) -> object:
    """argparse type: ``--routes attention=primitive,rope=elementwise`` as a
    :class:`trt_kv.builder.Routes` (imported only when the option is given)."""
    from trt_kv.builder.routes import Routes
    from trt_kv.errors import RouteError

    try:
        return Routes.parse(text)
    except RouteError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def prompt_ids(text: str) -> list[list[int]]:
    """``"1,2,3;4,5"`` -> ``[[1, 2, 3], [4, 5]]``; an empty prompt or item (``1,,2``,
    ``1,2;``), a non-integer or a negative id is refused, never skipped.

    Raises:
        ArgumentError: naming ``--prompt-ids``, the expected form and the text.
    """
    prompts = []
    for k, seq in enumerate(text.split(";")):
        items = seq.split(",")
        if any(not t.strip() for t in items):
            what = "a non-empty prompt" if not seq.strip() else "no empty item"
            raise ArgumentError(
                mismatch("--prompt-ids", f"'1,2,3;4,5' ({what} at prompt {k})", "", repr(text))
            )
        try:
            ids = [int(t) for t in items]
        except ValueError as err:
            raise ArgumentError(mismatch("--prompt-ids", "'1,2,3;4,5'", "", repr(text))) from err
        if min(ids) < 0:
            raise ArgumentError(mismatch("--prompt-ids", "token ids >= 0", "", min(ids)))
        prompts.append(ids)
    return prompts


def check_vocabulary(prompts: list[list[int]], vocab_size: int, option: str) -> None:
    """ArgumentError naming ``option`` when an id is outside ``[0, vocab_size)``."""
    top = max(max(p) for p in prompts)
    if top >= vocab_size:
        raise ArgumentError(mismatch(option, f"token ids in [0, {vocab_size})", "", top))


def check_prompt_lengths(
    prompts: list[list[int]], max_seq_len: int, new_tokens: int, option: str
) -> None:
    """ArgumentError naming ``option`` when the longest prompt with ``new_tokens`` more does
    not fit the cache (``--max-seq-len``; a prompt wider than one step is prefilled in
    chunks)."""
    longest = max(len(p) for p in prompts)
    if longest + new_tokens - 1 > max_seq_len:
        raise ArgumentError(
            mismatch(
                option,
                f"longest prompt + --max-new-tokens - 1 <= --max-seq-len = {max_seq_len}",
                "",
                longest + new_tokens - 1,
            )
        )


def check_backend_options(
    args: argparse.Namespace, backend: str, note: str = "", builds_engine: bool = False
) -> None:
    """ArgumentError for an option given that ``backend`` would ignore (:data:`BACKEND_ONLY`:
    ``--cuda-graph`` or ``--engine`` on a CPU backend, ``--compute-capability`` on the
    interpreter, ``--weights`` or ``--device-top-k`` on the reference; a ``--dtype`` other
    than float32 on the reference). ``note`` (set when ``backend`` is auto's pick) spares
    ``--emulate-gpu``: the emulated device was asked for, and auto looked at it before
    picking. ``builds_engine`` (demo) spares :data:`BUILD_OPTIONS`."""
    for flag, (dest, backends) in BACKEND_ONLY.items():
        if (flag == "--emulate-gpu" and note) or (builds_engine and flag in BUILD_OPTIONS):
            continue
        if getattr(args, dest, None) and backend not in backends:
            raise ArgumentError(
                mismatch(flag, "--backend", " or ".join(backends), f"{backend}{note}")
            )
    dtype = getattr(args, "dtype", None)
    if backend == "reference" and dtype not in (None, "float32"):
        raise ArgumentError(
            mismatch(
                "--dtype",
                "float32 or none with --backend reference (it computes in",
                "float32)",
                dtype,
            )
        )


def check_model(args: argparse.Namespace) -> None:
    """``--model`` is ``default``, an existing folder, a ``.gguf`` or ``.onnx`` file;
    ``--tokenizer`` a folder; ``--out`` is (or can become) a folder; ``--max-step-tokens`` <=
    ``--max-seq-len``. Raises ArgumentError."""
    model = getattr(args, "model", None)  # None: generate --engine alone
    path = Path(model or "default")
    a_file = path.suffix.lower() in (".gguf", ".onnx") and path.is_file()
    if model not in (None, "default") and not path.is_dir() and not a_file:
        state = "a file, not .gguf or .onnx" if path.exists() else "no such folder or file"
        raise ArgumentError(
            mismatch(
                "--model",
                "'default', a model folder, a .gguf or an .onnx file",
                "",
                f"{model} ({state})",
            )
        )
    tokenizer = getattr(args, "tokenizer", None)
    if tokenizer is not None and not (Path(tokenizer) / "tokenizer.json").is_file():
        raise ArgumentError(
            mismatch("--tokenizer", "a folder with tokenizer.json", "", str(tokenizer))
        )
    out = getattr(args, "out", None)
    if out is not None:
        for folder in (Path(out), *Path(out).parents):
            if folder.exists():
                if not folder.is_dir():
                    raise ArgumentError(
                        mismatch("--out", "a folder", "", f"{out} ({folder} is a file)")
                    )
                break
    seq, step = getattr(args, "max_seq_len", None), getattr(args, "max_step_tokens", None)
    if seq is not None and step is not None and step > seq:
        raise ArgumentError(mismatch("--max-step-tokens", f"<= --max-seq-len = {seq}", "", step))


def not_utf8(name: str, err: UnicodeDecodeError, where: str) -> ArgumentError:
    """The refusal of input text that is not UTF-8 (a prompt file, stdin): ``"<name>:
    expected UTF-8 text, got byte 0xff <where>"``, ``where`` saying where the byte is."""
    byte = err.object[err.start : err.start + 1].hex()
    return ArgumentError(mismatch(name, "UTF-8 text", "", f"byte 0x{byte} {where}".rstrip()))
