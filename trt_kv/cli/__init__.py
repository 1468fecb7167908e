"""trt-kv: build engines, generate tokens, inspect engines, benchmark backends.

One module per subcommand (``trt_kv/cli/<name>.py``), each with ``HELP`` (one line),
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

SUBCOMMANDS = ("build", "generate", "demo", "inspect", "bench")


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


def make_parser() -> argparse.ArgumentParser:
    """The ``trt-kv`` parser with every subcommand's arguments."""
    from trt_kv.cli.version import VersionAction

    parser = Parser(prog="trt-kv", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--version", action=VersionAction, help="trt_kv, TensorRT and CUDA versions, then exit"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"trt_kv.cli.{name}")
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.HELP,
            epilog=f"example:\n  {module.EXAMPLE}\n",
            formatter_class=HelpFormatter,
        )
        module.add_arguments(p)
        p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
        p.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``trt-kv`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code (2 and
    one ``trt-kv: error: ...`` line on stderr for a :class:`TrtKvError`)."""
    args = make_parser().parse_args(argv)
    from trt_kv import progress

    progress.set_enabled(False if args.quiet else None)
    try:
        return args.func(args)
    except TrtKvError as e:
        print(f"trt-kv: error: {e}", file=sys.stderr)
        return 2
