"""``generate --prompt-file PATH``: prompts read from a file, or from stdin with ``-``.

JSON lines are a batch, one prompt per non-empty line, each a JSON string or an object with a
``"prompt"`` string: a file is JSON lines when every non-empty line is a JSON string or
object, or when its first is a JSON object; a line of a JSON-lines file that holds no prompt
(``{"promt": ...}``, or a line that is not JSON after an object) is refused by its number.
Any other file is one prompt, its whole text (one trailing newline dropped, as an editor or
``echo`` adds it). A UTF-8 byte order mark at the start is dropped; text that is not UTF-8
is refused naming the first bad byte. Imports nothing heavy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trt_kv.cli.checks import not_utf8
from trt_kv.errors import ArgumentError, mismatch

BOM = "\ufeff"  # what a UTF-8 byte order mark decodes to
JSON_LINES = 'JSON lines, each a string or an object with a "prompt" string'
_NOT_JSON = object()  # a line json.loads refuses


def _parsed(line: str) -> object:
    """The JSON value of one line, or :data:`_NOT_JSON`."""
    try:
        return json.loads(line)
    except ValueError:
        return _NOT_JSON


def _prompt_of(item: object) -> str | None:
    """The prompt of one JSON line's value (a string, or ``{"prompt": "..."}``); None if
    not one."""
    if isinstance(item, dict):
        item = item.get("prompt")
    return item if isinstance(item, str) else None


def _described(line: str, item: object) -> str:
    """What a JSON line that holds no prompt is, for the refusal."""
    if item is _NOT_JSON:
        return f"text that is not JSON: {line.strip()[:60]!r}"
    if isinstance(item, dict) and "prompt" in item:
        return f'an object whose "prompt" is {json.dumps(item["prompt"])[:60]}'
    if isinstance(item, dict):
        return f"an object with keys {', '.join(map(json.dumps, item)) or '(none)'}"
    return f"JSON {json.dumps(item)[:60]}"


def parse_prompts(text: str) -> list[str]:
    """The prompts of a prompt file's ``text``: JSON lines -> one per line, else ``[text]``
    (the module's rule; a leading byte order mark dropped).

    Raises:
        ArgumentError: naming ``--prompt-file``, for a file with no prompt (empty or blank);
            naming ``--prompt-file line N``, for a line of JSON lines that holds no prompt
            (what was expected and what the line is).
    """
    text = text.removeprefix(BOM)
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ArgumentError(mismatch("--prompt-file", "at least one prompt", "", "an empty file"))
    items = [_parsed(line) for _, line in lines]
    if not isinstance(items[0], dict) and not all(isinstance(i, (str, dict)) for i in items):
        return [text.removesuffix("\n")]
    prompts = []
    for (n, line), item in zip(lines, items):
        prompt = _prompt_of(item)
        if prompt is None:
            raise ArgumentError(
                mismatch(f"--prompt-file line {n}", JSON_LINES, "", _described(line, item))
            )
        prompts.append(prompt)
    return prompts


def read_prompts(path: Path) -> list[str]:
    """The prompts of ``path`` (``-``: stdin, read to its end).

    Raises:
        ArgumentError: naming ``--prompt-file``: no such file, unreadable, not UTF-8 text
            (the first bad byte and its offset), or no prompt in it; as
            :func:`parse_prompts`.
    """
    if str(path) == "-":
        try:
            return parse_prompts(sys.stdin.read())  # read() decodes all it reads at once
        except UnicodeDecodeError as err:
            raise not_utf8("--prompt-file", err, f"at offset {err.start} of stdin") from None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise not_utf8("--prompt-file", err, f"at offset {err.start} of {path}") from None
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise ArgumentError(
            mismatch("--prompt-file", "a readable UTF-8 text file or -", "", f"{path} ({reason})")
        ) from None
    return parse_prompts(text)
