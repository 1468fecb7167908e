"""trt-kv: build engines, generate tokens, serve them, inspect and benchmark.

One module per subcommand (``trt_kv/cli/<name>.py``, its one-line help in ``SUBCOMMANDS``),
``EXAMPLE`` (the epilog), ``add_arguments(parser)`` and ``run(args) -> int``. Adding an
option to a subcommand is one edit in its ``add_arguments``; options several subcommands
share live in :mod:`trt_kv.cli.common`. Subcommand modules import nothing heavy (NumPy,
TensorRT, the runtime) at module level, so ``trt-kv --help`` stays fast: heavy imports go
inside ``run``. ``trt-kv --help`` itself prints :data:`HELP`, argparse's own help text
stored (a test keeps it equal), without importing argparse.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from trt_kv.errors import TrtKvError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import NoReturn

# name -> one-line help: here, not in the subcommand modules, so ``trt-kv --help`` imports
# none. At most 54 characters: the list then fits 70 columns unwrapped (see HELP; the usage
# line says COMMAND, not the list of names, which passed 80 columns when serve joined).
SUBCOMMANDS = {
    "build": "build the doc example and the model engine on the CPU",
    "generate": "generate tokens for prompts on a chosen backend",
    "chat": "talk with the model in its chat template (stdin)",
    "demo": "build, then generate on the GPU or the CPU interpreter",
    "inspect": "show an engine's tensors, profiles, aliases and recipe",
    "bench": "time prefill and decode per batch and context length",
    "serve": "OpenAI's HTTP API, batching requests continuously",
}

# ``make_parser(None).format_help()`` as argparse prints it on a terminal of HELP_COLUMNS
# columns or more (nothing wraps there, so every wider terminal gets the same text), stored
# so that ``trt-kv --help`` needs no argparse (~5 ms of its start-up).
# tests/cli/test_cli_help.py keeps it equal to argparse's output; after changing SUBCOMMANDS or
# the top-level options, paste what that test prints.
HELP = """\
usage: trt-kv [-h] [--version] COMMAND ...

trt-kv: build engines, generate tokens, serve them, inspect and benchmark.

positional arguments:
  COMMAND
    build     build the doc example and the model engine on the CPU
    generate  generate tokens for prompts on a chosen backend
    chat      talk with the model in its chat template (stdin)
    demo      build, then generate on the GPU or the CPU interpreter
    inspect   show an engine's tensors, profiles, aliases and recipe
    bench     time prefill and decode per batch and context length
    serve     OpenAI's HTTP API, batching requests continuously

options:
  -h, --help  show this help message and exit
  --version   trt_kv, TensorRT and CUDA versions, then exit

examples:
  trt-kv demo                 build the default model, then answer two prompts
  trt-kv generate --prompt "What is the capital of France?" --chat
  trt-kv chat --system "Be brief."
  trt-kv serve --port 8000    OpenAI's API at http://127.0.0.1:8000/v1
  trt-kv generate --help      every option of a subcommand, its default, an example
"""
HELP_COLUMNS = 70

EPILOG = """\
examples:
  trt-kv demo                 build the default model, then answer two prompts
  trt-kv generate --prompt "What is the capital of France?" --chat
  trt-kv chat --system "Be brief."
  trt-kv serve --port 8000    OpenAI's API at http://127.0.0.1:8000/v1
  trt-kv generate --help      every option of a subcommand, its default, an example
"""


def stored_help_applies(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for the top-level help (exactly ``-h`` or ``--help``) where
    :data:`HELP` is argparse's text: a terminal (or ``COLUMNS``; 80 when neither says) of
    at least :data:`HELP_COLUMNS` columns, as argparse measures it, and a Python before
    3.14 (whose argparse may colour its help)."""
    if list(argv) not in (["-h"], ["--help"]) or sys.version_info >= (3, 14):
        return False
    import shutil

    return shutil.get_terminal_size().columns >= HELP_COLUMNS


def make_parser(command: str | None = "*") -> argparse.ArgumentParser:
    """The ``trt-kv`` parser. Every subcommand is listed; the arguments (and the module) of
    ``command`` only, or of every one with ``"*"`` (the default), or of none with None (what
    ``trt-kv --help`` needs)."""
    from trt_kv.cli.parser import HelpFormatter, Parser, VersionAction

    parser = Parser(
        prog="trt-kv",
        description=__doc__.splitlines()[0],
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--version", action=VersionAction, help="trt_kv, TensorRT and CUDA versions, then exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)
        if command in (name, "*"):
            module = importlib.import_module(f"trt_kv.cli.{name}")
            p.epilog = f"example:\n  {module.EXAMPLE}\n"
            module.add_arguments(p)
            p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
            p.set_defaults(func=module.run)
    return parser


INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command Ctrl-C ended
_SIZES = ("max_seq_len", "max_batch", "max_step_tokens")  # options sizing host memory


def program() -> NoReturn:
    """The ``trt-kv`` command (``python -m trt_kv`` too): :func:`main`, then exit with its
    code; after Ctrl-C, by SIGINT itself, as Python ends on an uncaught KeyboardInterrupt, so
    that a shell loop running ``trt-kv`` stops as well (an exit status of 130 alone tells the
    shell the command handled the signal)."""
    code = main()
    if code == INTERRUPTED:
        import os
        import signal

        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(code)


def _failed_package(e: ImportError) -> str:
    """The top-level package an ImportError comes from: the module it names, else (a
    package's own ``raise ImportError(...)``, as NumPy's for a broken install) the module
    of the innermost frame it was raised in."""
    name = e.name
    if not name:
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        name = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    return (name or "").partition(".")[0]


def _end_streamed_line() -> bool:
    """End the line a streamed answer left open on stdout, if any (a newline); True when
    stdout is the terminal too, so that its newline also ended the line "^C" is on.
    Looked up, not imported: an import here could meet the Ctrl-C again."""
    generate = sys.modules.get("trt_kv.cli.generate")
    if generate is None or not generate.Stream.line_open:
        return False
    try:
        generate.Stream.end()
    except OSError:  # stdout closed (the reader left): nothing to end
        return False
    return sys.stdout.isatty()


def chosen(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word (the top-level options take no value),
    or None (``--help``, ``--version``, none, or a word that is no subcommand)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in SUBCOMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``trt-kv`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code: 2 and
    one ``trt-kv: error: ...`` line on stderr for a :class:`TrtKvError`; 1 and one line for
    host memory running out or a dependency that does not import; :data:`INTERRUPTED` and
    ``trt-kv: interrupted`` for Ctrl-C (:func:`program` then ends the process by SIGINT).
    None of them prints a traceback; the command closes what it opened (``finally``) before
    the line is printed."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = None  # until parsed: parsing imports the subcommand (TensorRT for --version)
    try:
        if stored_help_applies(argv):
            sys.stdout.write(HELP)
            sys.exit(0)  # what argparse's --help does
        args = make_parser(chosen(argv)).parse_args(argv)
        from trt_kv import progress

        progress.set_enabled(False if args.quiet else None)
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except TrtKvError as e:
        print(f"trt-kv: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C is the user's choice, not a failure to explain: no traceback. A streamed
        # answer's line is ended first (on stdout, where it is open), else on a terminal
        # a newline ends the line its "^C" left open: the message starts its own line.
        ended_terminal_line = _end_streamed_line()
        opened = "\n" if sys.stderr.isatty() and not ended_terminal_line else ""
        print(f"{opened}trt-kv: interrupted", file=sys.stderr)
        return INTERRUPTED
    except MemoryError as e:  # a step's activations, a cache, a table sized past the RAM
        detail = f" ({e})" if str(e) else ""
        sizes = [f"--{d.replace('_', '-')}" for d in _SIZES if hasattr(args, d)]
        hint = f"; try a smaller {' or '.join(sizes)}" if sizes else ""
        print(f"trt-kv: error: the host ran out of memory{detail}{hint}", file=sys.stderr)
        return 1
    except ImportError as e:
        # A dependency missing or broken (uninstalled, a half-upgraded environment, a shared
        # library it cannot load): one line naming it. trt_kv's own modules keep the traceback.
        package = _failed_package(e)
        if not package or package == "trt_kv":
            raise
        text = str(e).strip()
        reason = text.splitlines()[0] if text else type(e).__name__
        print(
            f"trt-kv: error: the Python package {package!r} did not import ({reason}); "
            "reinstall trt_kv with its requirements (pip install -e . in a checkout)",
            file=sys.stderr,
        )
        return 1
    except BrokenPipeError:
        # ``trt-kv ... | head``: the reader left. Python's documented recipe: point stdout at
        # devnull so the exit flush cannot raise again, and exit 1 without a traceback.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
