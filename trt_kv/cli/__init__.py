"""trt-kv: build engines, generate tokens, run the demo.

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

SUBCOMMANDS = ("build", "generate", "demo")


def make_parser() -> argparse.ArgumentParser:
    """The ``trt-kv`` parser with every subcommand's arguments."""
    parser = argparse.ArgumentParser(prog="trt-kv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"trt_kv.cli.{name}")
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.HELP,
            epilog=f"example:\n  {module.EXAMPLE}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(func=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``trt-kv`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code (2 and
    one ``trt-kv: error: ...`` line on stderr for a :class:`TrtKvError`)."""
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except TrtKvError as e:
        print(f"trt-kv: error: {e}", file=sys.stderr)
        return 2
