"""trt-kv: build engines, generate tokens, inspect engines, benchmark backends.

One module per subcommand (``trt_kv/cli/<name>.py``, its one-line help in ``SUBCOMMANDS``),
``EXAMPLE`` (the epilog), ``add_arguments(parser)`` and ``run(args) -> int``. Adding an
option to a subcommand is one edit in its ``add_arguments``; options several subcommands
share live in :mod:`trt_kv.cli.common`. Subcommand modules import nothing heavy (NumPy,
TensorRT, the runtime) at module level, so ``trt-kv --help`` stays fast: heavy imports go
inside ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from trt_kv.errors import TrtKvError

# name -> one-line help: here, not in the subcommand modules, so ``trt-kv --help`` imports none
SUBCOMMANDS = {
    "build": "build the doc example and the model engine (ahead of time, on the CPU)",
    "generate": "generate tokens for prompts on a chosen backend",
    "demo": "build, then generate on the GPU (or the CPU interpreter without one)",
    "inspect": "show an engine's tensors, profiles, alias pairs, cache memory and build recipe",
    "bench": "time prefill and decode apart per batch and context (median, spread, cache memory)",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Epilogs kept as written; each option's default shown when it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.option_strings
            and action.default not in (None, False, argparse.SUPPRESS)
            and "%(default)" not in text
        ):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as every other error is: one line
    ``trt-kv: error: ...`` and exit status 2 (``--help`` shows the usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"trt-kv: error: {message}\n")


class VersionAction(argparse.Action):
    """``--version``: print :func:`trt_kv.cli.version.version_text` and exit 0 (its imports
    happen only then)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from trt_kv.cli.version import version_text

        print(version_text())
        parser.exit()


def make_parser(command: str | None = "*") -> argparse.ArgumentParser:
    """The ``trt-kv`` parser. Every subcommand is listed; the arguments (and the module) of
    ``command`` only, or of every one with ``"*"`` (the default), or of none with None (what
    ``trt-kv --help`` needs)."""
    parser = Parser(prog="trt-kv", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--version", action=VersionAction, help="trt_kv, TensorRT and CUDA versions, then exit"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)
        if command in (name, "*"):
            module = importlib.import_module(f"trt_kv.cli.{name}")
            p.epilog = f"example:\n  {module.EXAMPLE}\n"
            module.add_arguments(p)
            p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
            p.set_defaults(func=module.run)
    return parser


def chosen(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word (the top-level options take no value),
    or None (``--help``, ``--version``, none, or a word that is no subcommand)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in SUBCOMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``trt-kv`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code (2 and
    one ``trt-kv: error: ...`` line on stderr for a :class:`TrtKvError`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = make_parser(chosen(argv)).parse_args(argv)
    from trt_kv import progress

    progress.set_enabled(False if args.quiet else None)
    try:
        return args.func(args)
    except TrtKvError as e:
        print(f"trt-kv: error: {e}", file=sys.stderr)
        return 2
