"""``trt-kv generate``: prompts in, generated ids (and text) out, on any backend."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trt_kv import build_defaults as defaults
from trt_kv.cli import common, options
from trt_kv.cli.backends import check_before_loading, engine_sidecar, opened_backend
from trt_kv.cli.checks import (
    check_prompt_lengths,
    check_vocabulary,
    prompt_ids,
)
from trt_kv.errors import ArgumentError, mismatch

if TYPE_CHECKING:
    from trt_kv.models.loading import Model
    from trt_kv.runtime.generate import Generation

EXAMPLE = 'trt-kv generate --prompt "What is the capital of France?" --chat --backend interpreter'
DEFAULT_PROMPT_IDS = "1,2,3,4,5;6,7,8"
BACKENDS, GPU_BACKENDS = options.BACKENDS, options.GPU_BACKENDS
MAX_NEW_TOKENS_HELP = (
    f"tokens to generate per prompt (default: {defaults.MAX_NEW_TOKENS_GENERATE_IDS}, or "
    f"{defaults.MAX_NEW_TOKENS_GENERATE_TEXT} with --prompt; at most what fits S_max)"
)


def add_generation_arguments(
    p: argparse.ArgumentParser, max_new_tokens_help: str = MAX_NEW_TOKENS_HELP
) -> None:
    """Prompt, sampling and output options (``generate`` and ``demo``)."""
    common.add_model_arguments(p)
    p.add_argument(
        "--prompt-ids", help=f"token ids, ';' per prompt (default: {DEFAULT_PROMPT_IDS})"
    )
    p.add_argument(
        "--prompt",
        action="append",
        help="text prompt (repeat for a batch; replaces --prompt-ids); the answer streams",
    )
    p.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,  # None: the chat template when the model has one, else the raw text
        help="wrap each --prompt in the model's chat template as a user message (default: "
        "when the model has one; --chat refuses a model without one; --no-chat: complete "
        "the raw text; --prompt-ids stay raw)",
    )
    options.add_sampling_arguments(p, max_new_tokens_help)
    options.add_device_arguments(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON line: backend, ids, text, finish_reason (eos|length), prefill and "
        "decode timings",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_generation_arguments(p)
    p.add_argument(
        "--prompt-file",
        type=Path,
        help="read the prompts from a file ('-': stdin): JSON lines (a string or "
        '{"prompt": ...} each) are a batch, any other text one prompt',
    )
    options.add_backend_argument(p)
    options.add_threads_argument(p)


def _ids_text(args: argparse.Namespace) -> str:
    return DEFAULT_PROMPT_IDS if args.prompt_ids is None else args.prompt_ids


def check_prompt_options(args: argparse.Namespace) -> None:
    """Refuse prompt and sampling options that contradict each other or do not parse
    (``--top-k`` / ``--top-p`` with greedy decoding, which ignores them), before any model
    is loaded. Raises ArgumentError."""
    options.check_sampling_options(args)
    if args.prompt is not None and args.prompt_ids is not None:
        raise ArgumentError("--prompt: expected --prompt or --prompt-ids, got both")
    if args.chat and args.prompt is None:
        raise ArgumentError("--chat: expected --prompt TEXT as well, got none")
    if args.prompt is None:
        prompt_ids(_ids_text(args))


def take_prompt_file(args: argparse.Namespace) -> None:
    """``--prompt-file``'s prompts become ``--prompt`` texts (read once: stdin has no second
    reading). Raises ArgumentError for a file with ``--prompt``/``--prompt-ids`` too, and as
    :func:`trt_kv.cli.prompt_file.read_prompts`."""
    if getattr(args, "prompt_file", None) is None:
        return
    if args.prompt is not None or args.prompt_ids is not None:
        given = "--prompt" if args.prompt is not None else "--prompt-ids"
        raise ArgumentError(mismatch("--prompt-file", "no --prompt or --prompt-ids", "", given))
    from trt_kv.cli.prompt_file import read_prompts

    args.prompt, args.prompt_file = read_prompts(args.prompt_file), None


def prompts_of(args: argparse.Namespace, model: Model) -> tuple[list[list[int]], object | None]:
    """``(prompt ids, tokenizer or None)``: ``--prompt`` texts through the model's
    tokenizer, each as a user message in its chat template (:func:`uses_chat_template`),
    else ``--prompt-ids`` as given (decoded with the tokenizer when the model has one).

    Raises:
        ArgumentError: as :func:`check_prompt_options`, text without a token, ids outside
            the vocabulary. ConfigError: text for a model with no tokenizer (or ``--chat``
            for one with no chat template).
    """
    from trt_kv.errors import ConfigError

    check_prompt_options(args)
    if args.prompt is None:
        try:
            tokenizer = model.checkpoint.tokenizer()
        except ConfigError:
            tokenizer = None  # ids in, ids out
        prompts = prompt_ids(_ids_text(args))
        check_vocabulary(prompts, model.config.vocab_size, "--prompt-ids")
        return prompts, tokenizer
    tokenizer = model.checkpoint.tokenizer()
    if uses_chat_template(args, tokenizer):
        chats = [[{"role": "user", "content": text}] for text in args.prompt]
        prompts = [tokenizer.encode_chat(c) for c in chats]
    else:
        prompts = [tokenizer.encode(text) for text in args.prompt]
    for text, ids in zip(args.prompt, prompts):
        if not ids:
            raise ArgumentError(
                mismatch("--prompt", "text with at least one token", "", repr(text))
            )
    check_vocabulary(prompts, model.config.vocab_size, "--prompt")
    return prompts, tokenizer


def uses_chat_template(args: argparse.Namespace, tokenizer: object) -> bool:
    """Whether ``--prompt`` texts go through the chat template, as llama-cli does: by
    default when the model has one (an instruct model asked a raw question may answer with
    its end id at once: nothing), ``--chat`` always (a model without one is then refused),
    ``--no-chat`` never. A model without one completes the raw text, unannounced."""
    return bool(tokenizer.chat_template) if args.chat is None else args.chat


def unknown_ids_note(tokenizer: object, ids: list[list[int]]) -> str | None:
    """The one stderr line saying that ``ids`` hold ids the tokenizer has no token for
    (the text shows them as ``<|id:N|>``), or None when it has them all."""
    from trt_kv.checkpoints.tokenizer import unknown_id_text

    unknown = tokenizer.unknown([i for row in ids for i in row])
    if not unknown:
        return None
    more = ", ..." if len(unknown) > 8 else ""
    return (
        f"trt-kv: note: the model produced ids its tokenizer has no token for "
        f"({', '.join(map(str, unknown[:8]))}{more}), shown as {unknown_id_text(unknown[0])}"
    )


class Stream:
    """Writes sequence 0's text to stdout as its tokens arrive (whole characters only);
    ``ids`` are those it was given so far. :meth:`end` ends the line.

    ``Stream.line_open`` (one for the process, as stdout is one) is True while a streamed
    line is not ended: the Ctrl-C handler (:func:`trt_kv.cli.main`) ends it before it speaks.
    """

    line_open = False

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer
        self.decoder = tokenizer.stream()
        self.ids: list[int] = []

    def __call__(self, k: int, token: int) -> None:
        if k == 0:
            self.ids.append(token)  # first: a Ctrl-C after the write finds it here
            piece = self.decoder.step(token)
            if piece:
                sys.stdout.write(piece)
                sys.stdout.flush()
                Stream.line_open = not piece.endswith("\n")

    @staticmethod
    def end() -> None:
        """Ends the streamed line (a newline on stdout, flushed), whatever was streamed."""
        print(flush=True)
        Stream.line_open = False


def new_tokens(args: argparse.Namespace, prompts: list[list[int]]) -> int:
    """``--max-new-tokens``, else :data:`~trt_kv.build_defaults.MAX_NEW_TOKENS_GENERATE_IDS`
    for ids and ``MAX_NEW_TOKENS_GENERATE_TEXT`` for text, at most what fits ``S_max``."""
    if args.max_new_tokens is not None:
        return args.max_new_tokens
    room = args.max_seq_len - max(map(len, prompts)) + 1
    text = args.prompt is not None
    most = defaults.MAX_NEW_TOKENS_GENERATE_TEXT if text else defaults.MAX_NEW_TOKENS_GENERATE_IDS
    return max(1, min(most, room))


def check_fit(args: argparse.Namespace, prompts: list[list[int]], option: str) -> None:
    """Refuse prompts that with their new tokens do not fit the cache (ArgumentError naming
    ``option``); a prompt wider than ``--max-step-tokens`` is prefilled in chunks."""
    check_prompt_lengths(prompts, args.max_seq_len, new_tokens(args, prompts), option)


def timings(result: Generation) -> dict:
    """Prefill and decode apart, as ``--json`` gives them: ``{"prefill": {"tokens", "ms"},
    "decode": {"tokens", "steps", "ms_per_step", "tokens_per_s"}}`` (the last two None when
    no decode step ran: every sequence stopped at its first token)."""
    per_step, rate = result.decode_ms_per_step, result.decode_tokens_per_s
    return {
        "prefill": {"tokens": result.prefill_tokens, "ms": round(result.prefill_seconds * 1e3, 3)},
        "decode": {
            "tokens": result.decode_tokens,
            "steps": result.decode_steps,
            "ms_per_step": None if per_step is None else round(per_step, 3),
            "tokens_per_s": None if rate is None else round(rate, 3),
        },
    }


def summary_text(result: Generation) -> str:
    """``"prefill 8 tokens, 12.1 ms; decode 14 tokens in 7 steps, 3.05 ms/step, 655.7
    tokens/s"``: the two phases apart (decode tokens exclude each sequence's first token,
    which the prefill's logits give)."""
    prefill = f"prefill {result.prefill_tokens} tokens, {result.prefill_seconds * 1e3:.1f} ms"
    if not result.decode_steps:
        return f"{prefill}; no decode step (every sequence stopped at its first token)"
    return (
        f"{prefill}; decode {result.decode_tokens} tokens in {result.decode_steps} steps, "
        f"{result.decode_ms_per_step:.2f} ms/step, {result.decode_tokens_per_s:.1f} tokens/s"
    )


def generate_and_print(
    args: argparse.Namespace,
    backend: object,
    prompts: list[list[int]],
    tokenizer: object | None,
    eos_ids: tuple[int, ...],
) -> None:
    """Generate, printing as ``--json`` / text (streamed for one text prompt) / ids asks."""
    import json

    from trt_kv.runtime.generate import generate
    from trt_kv.runtime.session import Session

    text_mode = args.prompt is not None and not args.json
    stream = Stream(tokenizer) if text_mode and len(prompts) == 1 else None
    result = generate(
        Session(backend),
        prompts,
        new_tokens(args, prompts),
        options.sampler(args),
        eos_ids=() if args.ignore_eos else eos_ids,
        on_token=stream,
        repetition_penalty=args.repetition_penalty,
    )
    texts = [tokenizer.decode(ids) for ids in result.ids] if tokenizer else None
    note = unknown_ids_note(tokenizer, result.ids) if tokenizer else None
    if note:  # shown in the text as <|id:N|>; said once here
        print(note, file=sys.stderr)
    emulated = args.emulate_gpu and args.backend in GPU_BACKENDS  # not auto's CPU fallback
    where = " (emulated GPU)" if emulated else ""
    summary = f"{backend.name}{where}: {summary_text(result)}"
    if args.json:
        out = {"backend": backend.name, "emulated_gpu": emulated, "ids": result.ids}
        if texts is not None:
            out["text"] = texts
        out["finish_reason"] = list(result.finish_reasons)
        print(json.dumps({**out, **timings(result)}))
    elif stream is not None:
        stream.end()
        print(summary, file=sys.stderr)
    elif text_mode:
        for k, text in enumerate(texts):
            print(f"[{k}] {text}")
        print(summary, file=sys.stderr)
    else:
        for k, ids in enumerate(result.ids):
            print(f"[{k}] {ids}" + (f"  {texts[k]!r}" if texts else ""))
        print(summary, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    return common.run_on_device(args, _run)


def _engine_only(args: argparse.Namespace) -> int:
    """``--engine FILE`` without ``--model``: ids in, ids out, every size from the sidecar's
    decoder roles (``S_max``, the step width, the vocabulary); no tokenizer, no EOS."""
    if args.prompt is not None or getattr(args, "prompt_file", None) is not None:
        raise ArgumentError(
            mismatch("--prompt", "--prompt-ids (text needs --model's tokenizer)", "", "text")
        )
    check_prompt_options(args)
    roles = engine_sidecar(args.engine)  # checked by check_before_loading already
    args.max_seq_len, args.max_step_tokens = roles.max_seq_len, roles.max_step_tokens
    prompts = prompt_ids(_ids_text(args))
    check_vocabulary(prompts, roles.vocab_size, "--prompt-ids")
    check_fit(args, prompts, "--prompt-ids")
    if args.backend == "polygraphy":
        from trt_kv.runtime.gpu.polygraphy_backend import PolygraphyBackend as engine_backend
    else:
        from trt_kv.runtime.gpu.trt_backend import TrtBackend as engine_backend
    options = {"cuda_graph": args.cuda_graph, "runtime_cache": args.runtime_cache}
    options = {} if args.backend == "polygraphy" else options
    backend = engine_backend(args.engine, capacity=max(len(prompts), 1), **options)
    try:
        generate_and_print(args, backend, prompts, None, ())
    finally:
        backend.close()
    return 0


def _run(args: argparse.Namespace) -> int:
    check_before_loading(args)
    if args.model is None:  # --engine alone (common.resolve_model)
        return _engine_only(args)
    take_prompt_file(args)
    check_prompt_options(args)
    if args.prompt is None:  # ids: their lengths are known before loading
        check_fit(args, prompt_ids(_ids_text(args)), "--prompt-ids")
    model = common.load_cli_model(args)
    prompts, tokenizer = prompts_of(args, model)
    check_fit(args, prompts, "--prompt" if args.prompt is not None else "--prompt-ids")
    with opened_backend(args, model.name, model.config, model.weights, len(prompts)) as backend:
        generate_and_print(args, backend, prompts, tokenizer, model.checkpoint.eos_token_ids)
    return 0
