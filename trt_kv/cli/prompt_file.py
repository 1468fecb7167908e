"""``generate --prompt-file PATH``: prompts read from a file, or from stdin with ``-``.

A file whose every non-empty line is JSON, each a string or an object with a ``"prompt"``
string (JSON lines), is a batch: one prompt per line. Any other file is one prompt, its whole
text (one trailing newline dropped, as an editor or ``echo`` adds it). Imports nothing heavy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trt_kv.errors import ArgumentError, mismatch


def _json_prompt(line: str) -> str | None:
    """The prompt of one JSON line (a string, or ``{"prompt": "..."}``); None if not one."""
    try:
        item = json.loads(line)
    except ValueError:
        return None
    if isinstance(item, dict):
        item = item.get("prompt")
    return item if isinstance(item, str) else None


def parse_prompts(text: str) -> list[str]:
    """The prompts of a prompt file's ``text``: JSON lines -> one per line, else ``[text]``.

    Raises:
        ArgumentError: naming ``--prompt-file``, for a file with no prompt (empty or blank).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ArgumentError(mismatch("--prompt-file", "at least one prompt", "", "an empty file"))
    batch = [_json_prompt(line) for line in lines]
    if all(p is not None for p in batch):
        return batch
    return [text.removesuffix("\n")]


def read_prompts(path: Path) -> list[str]:
    """The prompts of ``path`` (``-``: stdin, read to its end).

    Raises:
        ArgumentError: naming ``--prompt-file``: no such file, unreadable, not UTF-8 text,
            or no prompt in it.
    """
    if str(path) == "-":
        return parse_prompts(sys.stdin.read())
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or type(err).__name__
        raise ArgumentError(
            mismatch("--prompt-file", "a readable UTF-8 text file or -", "", f"{path} ({reason})")
        ) from None
    return parse_prompts(text)
