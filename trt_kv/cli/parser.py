"""What ``trt-kv``'s argparse does differently: one-line usage errors, defaults shown in
option help, ``--version`` importing its modules only when it runs.

Imported by :func:`trt_kv.cli.make_parser` only, so ``trt-kv --help`` (answered from
:data:`trt_kv.cli.HELP`) does not import argparse at all.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Epilogs kept as written; each option's default shown when it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # identity, not equality: a default of 0 or 0.0 (== False) is shown too
        hidden = action.default is None or action.default is False
        if (
            action.option_strings
            and not hidden
            and action.default is not argparse.SUPPRESS
            and "%(default)" not in text
        ):
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as every other error is: one line
    ``trt-kv: error: ...`` and exit status 2 (``--help`` shows the usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"trt-kv: error: {message}\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """argparse's, then ``--model``'s default resolved
        (:func:`trt_kv.cli.common.resolve_model`)."""
        from trt_kv.cli.common import resolve_model

        parsed = super().parse_args(args, namespace)
        resolve_model(parsed)
        return parsed


class VersionAction(argparse.Action):
    """``--version``: print :func:`trt_kv.cli.version.version_text` and exit 0 (its imports
    happen only then)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from trt_kv.cli.version import version_text

        print(version_text())
        parser.exit()
