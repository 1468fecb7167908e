"""What several subcommands share: the model/engine options, the model engine (reused or
built), and plain-text tables. Nothing heavy is imported at module level."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from trt_kv import build_defaults as defaults
from trt_kv.cli.checks import integer, routes
from trt_kv.contract import FLOAT_DTYPES
from trt_kv.engine import ENGINES_DIR

if TYPE_CHECKING:
    from trt_kv.engine.store import BuildOptions, BuiltFile
    from trt_kv.models.loading import Model

DTYPES = FLOAT_DTYPES  # --dtype
DEFAULT_DTYPE = defaults.DTYPE  # engines and the interpreter
WEIGHTS = (*DTYPES, "int8", "int4", "keep")  # --weights (trt_kv.quantization.storage)
DEFAULT_MODEL = "default"  # --model not given (and no --engine): SmolLM2-135M-Instruct


def resolve_model(args: argparse.Namespace) -> None:
    """``--model`` not given becomes :data:`DEFAULT_MODEL`, except beside an engine file
    (``generate --engine``, ``inspect``), whose sidecar gives every size: there it stays
    None. Done once, as the arguments are parsed (:class:`trt_kv.cli.parser.Parser`), so
    that every subcommand, and the emulated GPU it may run on, sees the same model."""
    if getattr(args, "model", False) is None and getattr(args, "engine", None) is None:
        args.model = DEFAULT_MODEL


class DefaultSize(int):
    """An option's value when the command line leaves it out: the int it is, marked so that
    :func:`load_cli_model` may replace it with the model's own default (GPT-2's S_max is at
    most its ``n_positions``) where a value given stays as given."""


def add_model_arguments(p: argparse.ArgumentParser, helps: dict[str, str] | None = None) -> None:
    """``--model --dtype --max-seq-len --max-batch --max-step-tokens --out --routes
    --compute-capability``; ``helps`` replaces the help of some (by dest) for a subcommand
    that reads them its own way."""
    text = {
        "model": f"'{DEFAULT_MODEL}' (SmolLM2-135M-Instruct), a Hugging Face folder (Llama "
        f"family or GPT-2) or a .gguf file (default: {DEFAULT_MODEL}, except beside --engine)",
        "dtype": f"weights and activations (default: {DEFAULT_DTYPE}; the reference backend "
        "computes in float32 only)",
        "max_seq_len": "S_max of every cache (default: %(default)s, or a GPT-2's n_positions "
        "when smaller)",
        "max_batch": "most sequences per step",
        "max_step_tokens": "most prompt tokens per step; longer prompts are prefilled in "
        f"chunks (default: min({defaults.MAX_STEP_TOKENS}, --max-seq-len))",
        "weights": "how the engine holds weights: in the activation dtype (the default), "
        "int8/int4 (quantized at build time per 32 weights: lossy), keep (a GGUF's quantized "
        "matrices as stored: INT8/INT4 with their block scales)",
        "device_top_k": "the engine also picks the next token's K best candidates on the GPU, "
        "so a decode step downloads K ids (and logits) instead of the logits; generate uses "
        "them when greedy, or with --top-k K and no --top-p or --repetition-penalty (1: "
        f"greedy only; 0: off; default: {defaults.DEVICE_TOP_K}, so a greedy step downloads "
        "4 bytes a sequence)",
        "out": "engine folder",
        "routes": "force network routes, e.g. attention=primitive,rope=elementwise "
        "(attention_v2|attention|primitive, rotary_layer|elementwise, layer|plugin, "
        "key_value_lengths); default: the best the installed TensorRT has",
        "compute_capability": "GPU targets of the engine: portable (TensorRT-RTX's default: "
        "8.0 8.6 8.9 12.0 12.1 and later) or e.g. 8.9 or 8.0,12.0 (TensorRT-RTX's "
        "set_compute_capability: 7.5 8.0 8.6 8.9 12.0 12.1)",
        **(helps or {}),
    }
    p.add_argument("--model", default=None, help=text["model"])  # None: resolve_model
    p.add_argument("--dtype", default=None, choices=DTYPES, help=text["dtype"])
    p.add_argument(
        "--max-seq-len",
        type=integer(1, 2**31 - 1),
        default=DefaultSize(defaults.MAX_SEQ_LEN),
        help=text["max_seq_len"],
    )
    p.add_argument(
        "--max-batch", type=integer(1), default=defaults.MAX_BATCH, help=text["max_batch"]
    )
    p.add_argument("--max-step-tokens", type=integer(1), default=None, help=text["max_step_tokens"])
    p.add_argument(
        "--weights", dest="weight_format", default=None, choices=WEIGHTS, help=text["weights"]
    )
    p.add_argument(
        "--device-top-k", type=integer(0), default=None, metavar="K", help=text["device_top_k"]
    )
    p.add_argument("--out", type=Path, default=ENGINES_DIR, help=text["out"])
    p.add_argument("--routes", type=routes, default=None, help=text["routes"])
    p.add_argument("--compute-capability", default=None, help=text["compute_capability"])


def load_cli_model(args: argparse.Namespace) -> Model:
    """``load_model(args.model)`` (progress bars unless ``--quiet``), then ``--max-seq-len``
    left out becomes the model's default S_max (the architecture's ``default_max_seq_len``:
    GPT-2's ``n_positions`` when below the default); a value given stays, and is judged
    against the model as before.

    Raises:
        ConfigError, ShapeError, DTypeError: as :func:`trt_kv.models.loading.load_model`.
    """
    from trt_kv.models.architectures import architecture_of
    from trt_kv.models.loading import load_model

    model = load_model(args.model, progress=not args.quiet)
    if isinstance(getattr(args, "max_seq_len", None), DefaultSize):
        args.max_seq_len = architecture_of(model.config).default_max_seq_len(model.config)
    return model


def max_step_tokens(args: argparse.Namespace) -> int:
    """``--max-step-tokens``, defaulting to
    :func:`trt_kv.build_defaults.default_step_tokens` of ``--max-seq-len``."""
    if args.max_step_tokens is None:
        return defaults.default_step_tokens(args.max_seq_len)
    return args.max_step_tokens


def build_options(args: argparse.Namespace, batch: int = 0) -> BuildOptions:
    """:class:`~trt_kv.engine.store.BuildOptions` from the parsed arguments: every field whose
    option the subcommand has (``--max-seq-len`` -> ``max_seq_len``...), so an option added
    to both joins the engine key by itself; ``max_batch`` at least ``batch``."""
    import dataclasses

    from trt_kv.engine.store import BuildOptions

    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(BuildOptions)
        if getattr(args, f.name, None) is not None
    }
    given["max_step_tokens"] = max_step_tokens(args)
    given["max_batch"] = max(batch, args.max_batch)
    return BuildOptions(**given)


def model_engine(
    args: argparse.Namespace, name: str, config: object, weights: object, batch: int
) -> BuiltFile:
    """The model engine for these arguments: reused from ``args.out`` when one was built
    from the same weights, config and every build option (except by ``trt-kv build``),
    else built, with the reason an engine found could not be reused.

    Raises:
        ArgumentError: ``--compute-capability`` the installed TensorRT cannot target
            (before anything is built).
    """
    import dataclasses

    from trt_kv.engine.digest import weights_sha256
    from trt_kv.engine.store import build_model_engine, find_model_engine
    from trt_kv.models.architectures import architecture_of

    options = build_options(args, batch)
    architecture_of(config).check_max_seq_len(config, options.max_seq_len, "--max-seq-len")
    options.targets("--compute-capability")
    digest = weights_sha256(args.model, weights)
    why = ""
    if args.command != "build":
        found, why = find_model_engine(name, config, options, args.out, digest)
        if found is not None:
            return found
    built = build_model_engine(
        name, config, weights, out_dir=args.out, weights_sha256=digest, **options.to_json()
    )
    return dataclasses.replace(built, rebuilt=why)


def engine_status(r: BuiltFile) -> str:
    """``"built now"``, ``"rebuilt: config changed in ['rms_norm_eps']"`` (an engine of that
    name replaced), ``"built: no engine for these weights (sha256 9c01ab34...; the one for
    sha256 3f2a9c01... stays)"`` or ``"reused (built 2026-11-22T03:10:00Z in 7.31 s)"``."""
    from trt_kv.engine.store import NO_ENGINE_FOR_WEIGHTS

    if not r.reused:
        verb = "built" if r.rebuilt.startswith(NO_ENGINE_FOR_WEIGHTS) else "rebuilt"
        return f"{verb}: {r.rebuilt}" if r.rebuilt else "built now"
    when = r.built_at or "at an unrecorded time"
    return f"reused (built {when} in {r.meta.build_seconds:.2f} s)"


def _caches(r: BuiltFile) -> str:
    """``"60 x [B, 3, 256, 64] float16"``: count, shape and dtype of the cache inputs."""
    kinds = sorted({(a.shape, a.dtype) for a in r.meta.aliases})
    shape = lambda s: "[" + ", ".join("B" if d == -1 else str(d) for d in s) + "]"  # noqa: E731
    return "; ".join(
        f"{sum((a.shape, a.dtype) == k for a in r.meta.aliases)} x {shape(k[0])} {k[1]}"
        for k in kinds
    )


def engine_table(rows: list[BuiltFile]) -> str:
    """One line per engine: file, bytes, caches, alias pairs, build seconds, built/reused."""
    head = ("engine", "bytes", "caches", "alias pairs", "build s", "status")
    body = [
        (
            r.path.name,
            f"{r.meta.nbytes:,}",
            _caches(r),
            str(len(r.meta.aliases)),
            f"{r.meta.build_seconds:.2f}",
            engine_status(r),
        )
        for r in rows
    ]
    return table(head, body)


def table(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, a dashed rule under the header."""
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, body)])


EMULATED_CC_VAR = "TRT_KV_EMULATED_CC"  # --emulate-gpu's compute capability, e.g. "9.0"


def emulated_cc() -> tuple[int, int] | None:
    """``$TRT_KV_EMULATED_CC`` as ``(major, minor)`` (None when unset: the default 8.9).

    Raises:
        ArgumentError: naming the variable, for text that is not ``major.minor``.
    """
    import os
    import re

    from trt_kv.errors import ArgumentError, mismatch

    text = os.environ.get(EMULATED_CC_VAR, "")
    if not text:
        return None
    if not re.fullmatch(r"\d{1,2}\.\d", text):
        raise ArgumentError(mismatch(EMULATED_CC_VAR, "major.minor, e.g. 9.0", "", repr(text)))
    major, minor = text.split(".")
    return int(major), int(minor)


EMULATED_MODELS_VAR = "TRT_KV_EMULATED_MODELS"  # more models --emulate-gpu may rebuild from


def engine_default_model(args: argparse.Namespace) -> list[str]:
    """``[DEFAULT_MODEL]`` for an engine file given without ``--model`` (``generate
    --engine``, ``inspect``) whose sidecar's recipe names the default model, the one model
    trt_kv finds by name; else ``[]`` (a missing or bad sidecar is the command's to say)."""
    engine = getattr(args, "engine", None)
    if engine is None or getattr(args, "model", None) is not None:
        return []
    from trt_kv.checkpoints.default import NAME
    from trt_kv.engine.file import read_sidecar, sidecar_path
    from trt_kv.errors import EngineFileError

    try:
        recipe = read_sidecar(sidecar_path(Path(engine))).metadata.get("recipe")
    except EngineFileError:
        return []
    return [DEFAULT_MODEL] if isinstance(recipe, dict) and recipe.get("model") == NAME else []


def run_on_device(args: argparse.Namespace, run: Callable[[argparse.Namespace], int]) -> int:
    """``run(args)`` inside :func:`on_device`."""
    with on_device(args):
        return run(args)


@contextmanager
def on_device(args: argparse.Namespace) -> Iterator[None]:
    """The block, inside :func:`trt_kv.emulator.emulated_gpu` with ``--emulate-gpu``:
    of compute capability ``$TRT_KV_EMULATED_CC``, and given ``--engine`` (or ``--out``) as
    the engine files and, as the rebuild function of their recipes,
    :func:`trt_kv.engine.recipes.recipe_rebuilder` of ``--model`` (and the ``load_model``
    specs in ``$TRT_KV_EMULATED_MODELS``, separated by ``os.pathsep``: for ``--engine``
    without ``--model``; and the default model for an engine of it,
    :func:`engine_default_model`): the models it may rebuild engines from (sidecars name no
    paths). Without ``--emulate-gpu``, the block as it is."""
    import os

    if not args.emulate_gpu:
        yield
        return
    from trt_kv.emulator import emulated_gpu
    from trt_kv.engine.recipes import recipe_rebuilder

    engines = [p for p in (getattr(args, "engine", None), getattr(args, "out", None)) if p]
    models = [args.model] if getattr(args, "model", None) else engine_default_model(args)
    models += [m for m in os.environ.get(EMULATED_MODELS_VAR, "").split(os.pathsep) if m]
    with emulated_gpu(emulated_cc(), engines=engines, rebuild=recipe_rebuilder(models)):
        yield
