"""``trt-kv chat``: a conversation on stdin and stdout, the history rendered by the model's
chat template each turn; ``/reset`` forgets it, ``/exit`` (or the end of the input) quits.

Works the same with stdin piped (one message per line, no prompt shown) as on a terminal.
Each answer streams to stdout as it is decoded and ends with a newline; the speed line and
the notes go to stderr. Each turn prefills the whole rendered conversation again (chunked,
within ``--max-seq-len``), so the ids equal ``generate --chat`` on that history.
"""

from __future__ import annotations

import argparse
import sys

from trt_kv import build_defaults as defaults
from trt_kv.cli import backends, common, generate, options

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


def run(args: argparse.Namespace) -> int:
    return common.run_on_device(args, _run)


def _run(args: argparse.Namespace) -> int:
    backends.check_before_loading(args)
    model = common.load_cli_model(args)
    tokenizer = model.checkpoint.tokenizer()  # ConfigError without tokenizer.json
    opening = [{"role": "system", "content": args.system}] if args.system else []
    tokenizer.encode_chat([*opening, {"role": "user", "content": "?"}])  # a chat template?
    with backends.opened_backend(args, model.name, model.config, model.weights, 1) as backend:
        converse(args, backend, tokenizer, opening, model.checkpoint.eos_token_ids)
    return 0


def converse(
    args: argparse.Namespace,
    backend: object,
    tokenizer: object,
    opening: list[dict[str, str]],
    eos_ids: tuple[int, ...],
) -> None:
    """The read-answer loop until ``/exit`` or the end of stdin."""
    from trt_kv.runtime.generate import generate as run_generation
    from trt_kv.runtime.session import Session

    session, sampler = Session(backend), options.sampler(args)
    terminal = sys.stdin.isatty()
    print(f"chat on {backend.name}: {HELP_TEXT}", file=sys.stderr)
    history, noted = list(opening), False  # noted: ids the tokenizer lacks were said
    while True:
        if terminal:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
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
        result = run_generation(
            session,
            [ids],
            min(args.max_new_tokens or defaults.MAX_NEW_TOKENS_CHAT, room),
            sampler,
            eos_ids=() if args.ignore_eos else eos_ids,
            on_token=generate.Stream(tokenizer),
            repetition_penalty=args.repetition_penalty,
        )
        print(flush=True)
        note = None if noted else generate.unknown_ids_note(tokenizer, result.ids)
        if note:  # once a conversation
            print(note, file=sys.stderr)
            noted = True
        print(f"{backend.name}: {generate.summary_text(result)}", file=sys.stderr)
        history = [*asked, {"role": "assistant", "content": tokenizer.decode(result.ids[0])}]
