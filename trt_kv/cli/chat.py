"""``trt-kv chat``: a conversation on stdin and stdout, the history rendered by the model's
chat template each turn; ``/reset`` forgets it, ``/exit`` (or the end of the input) quits.

Ctrl-C during an answer stops that answer, as in llama-cli and Python's REPL: the tokens it
had generated (shown, but for a last one caught between its choice and its text) stay in the
conversation as the assistant's message, as llama-cli keeps them; nothing of the turn stays
when none was generated. Ctrl-C (or Ctrl-D) at the prompt quits, status 0. ``--system`` must
leave room for a turn (:func:`check_room`). stdin must be UTF-8 (read a line at a time).

Works the same with stdin piped (one message per line, no prompt shown) as on a terminal.
Each answer streams to stdout as it is decoded and ends with a newline; the speed line and
the notes go to stderr. Each turn prefills the whole rendered conversation again (chunked,
within ``--max-seq-len``), so the ids equal ``generate --chat`` on that history.
"""

from __future__ import annotations

import argparse
import itertools
import sys

from trt_kv import build_defaults as defaults
from trt_kv.cli import backends, common, generate, options
from trt_kv.cli.checks import not_utf8
from trt_kv.errors import ArgumentError, mismatch

EXAMPLE = 'trt-kv chat --system "Be brief." --repetition-penalty 1.2'  # or: echo Hi | trt-kv chat
HELP_TEXT = "/reset forgets the conversation, /exit (or end of input) quits"


def add_arguments(p: argparse.ArgumentParser) -> None:
    common.add_model_arguments(p)
    p.add_argument("--system", help="system message opening the conversation")
    options.add_sampling_arguments(
        p,
        f"most tokens per answer (default: {defaults.MAX_NEW_TOKENS_CHAT}, at most what fits "
        "--max-seq-len)",
    )
    options.add_device_arguments(p)
    options.add_backend_argument(p)
    options.add_threads_argument(p)


def run(args: argparse.Namespace) -> int:
    return common.run_on_device(args, _run)


def _run(args: argparse.Namespace) -> int:
    backends.check_before_loading(args)
    model = common.load_cli_model(args)
    tokenizer = model.checkpoint.tokenizer()  # ConfigError without tokenizer.json
    opening = [{"role": "system", "content": args.system}] if args.system else []
    check_room(args, tokenizer.encode_chat([*opening, {"role": "user", "content": "?"}]))
    with backends.opened_backend(args, model.name, model.config, model.weights, 1) as backend:
        converse(args, backend, tokenizer, opening, model.checkpoint.eos_token_ids)
    return 0


def check_room(args: argparse.Namespace, shortest: list[int]) -> None:
    """Refuse a conversation that has no room for a turn: ``shortest`` (the ids of the
    opening, ``--system``'s message if any, with a one-character user message and the
    assistant's header) must leave room for one answer token, ``len <= --max-seq-len``.

    Raises:
        ArgumentError: naming ``--system`` (or ``--max-seq-len`` without one), both counts.
    """
    limit = args.max_seq_len
    if len(shortest) <= limit:
        return
    if args.system:
        raise ArgumentError(
            mismatch(
                "--system",
                f"a system prompt leaving room for a turn in --max-seq-len (S_max) {limit}: "
                f"with a one-character message and the answer's first token at most {limit} "
                "tokens",
                "",
                f"{len(shortest)} tokens",
            )
        )
    raise ArgumentError(
        mismatch(
            "--max-seq-len",
            "room for one turn of the chat template: at least",
            len(shortest),
            limit,
        )
    )


def read_message(number: int) -> str | None:
    """Line ``number`` of stdin (UTF-8, decoded here: a line at a time), or None at its end.

    Raises:
        ArgumentError: naming stdin, the line and the first byte that is not UTF-8.
        KeyboardInterrupt: Ctrl-C while waiting.
    """
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # a text stream given in place of stdin (a test's io.StringIO)
        return sys.stdin.readline() or None
    line = raw.readline()
    try:
        return line.decode("utf-8") or None
    except UnicodeDecodeError as err:
        raise not_utf8("stdin", err, f"at offset {err.start} of line {number}") from None


def converse(
    args: argparse.Namespace,
    backend: object,
    tokenizer: object,
    opening: list[dict[str, str]],
    eos_ids: tuple[int, ...],
) -> None:
    """The read-answer loop until ``/exit``, the end of stdin or Ctrl-C at the prompt."""
    from trt_kv.runtime.generate import generate as run_generation
    from trt_kv.runtime.session import Session

    session, sampler = Session(backend), options.sampler(args)
    terminal = sys.stdin.isatty()
    history, noted = list(opening), False  # noted: ids the tokenizer lacks were said
    for number in itertools.count(1):
        try:  # from the greeting on: a Ctrl-C right after it is one at the prompt
            if number == 1:
                print(f"chat on {backend.name}: {HELP_TEXT}", file=sys.stderr)
            if terminal:
                print("> ", end="", flush=True)
            line = read_message(number)
        except KeyboardInterrupt:  # Ctrl-C at the prompt: quit, as Ctrl-D does
            line = None
        if line is None:
            if terminal:
                print(flush=True)  # end the prompt's line
            break
        text = line.strip()
        if text == "/exit":
            break
        if text == "/reset":
            history = list(opening)
            print("(conversation forgotten)", file=sys.stderr)
            continue
        if not text or text.startswith("/"):
            if text:
                print(f"unknown command {text!r}: {HELP_TEXT}", file=sys.stderr)
            continue
        asked = [*history, {"role": "user", "content": text}]
        ids = tokenizer.encode_chat(asked)
        room = args.max_seq_len - len(ids) + 1
        if room < 1:
            print(
                f"the conversation is {len(ids)} tokens, --max-seq-len {args.max_seq_len}: "
                "/reset to start again",
                file=sys.stderr,
            )
            continue
        stream = generate.Stream(tokenizer)
        try:
            result = run_generation(
                session,
                [ids],
                min(args.max_new_tokens or defaults.MAX_NEW_TOKENS_CHAT, room),
                sampler,
                eos_ids=() if args.ignore_eos else eos_ids,
                on_token=stream,
                repetition_penalty=args.repetition_penalty,
            )
        except KeyboardInterrupt:  # Ctrl-C: this answer stops, the conversation goes on
            stream.end()
            kept = f"{len(stream.ids)} tokens kept" if stream.ids else "nothing kept"
            print(f"(answer stopped: {kept} in the conversation)", file=sys.stderr)
            if stream.ids:
                answer = tokenizer.decode(stream.ids)
                history = [*asked, {"role": "assistant", "content": answer}]
            continue
        stream.end()
        note = None if noted else generate.unknown_ids_note(tokenizer, result.ids)
        if note:  # once a conversation
            print(note, file=sys.stderr)
            noted = True
        print(f"{backend.name}: {generate.summary_text(result)}", file=sys.stderr)
        history = [*asked, {"role": "assistant", "content": tokenizer.decode(result.ids[0])}]
