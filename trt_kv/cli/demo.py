"""``trt-kv demo``: build, then generate on the best backend this machine has."""

from __future__ import annotations

import argparse
import sys

from trt_kv import build_defaults as defaults
from trt_kv.cli import backends, build, common, generate
from trt_kv.cli.checks import check_model, prompt_ids

EXAMPLE = "trt-kv demo --max-new-tokens 16"

# (label, text, use the chat template): what the demo asks a model that has a tokenizer.
DEMO_PROMPTS = (
    ("chat", "What is the capital of France?", True),
    ("continue", "The three primary colors are", False),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    generate.add_generation_arguments(
        p, f"tokens to generate per prompt (default: {defaults.MAX_NEW_TOKENS_DEMO})"
    )


def backend_note(reason: str | None, emulated: bool, no_gpu: bool = True) -> str:
    """Why ``demo`` runs where it does (for stderr): the GPU, or why not (``reason``: no GPU,
    or, with ``no_gpu`` False, a GPU the installed TensorRT does not run)."""
    if reason is not None:
        where = "no GPU here" if no_gpu else "TensorRT cannot run on this GPU"
        return (
            f"note: {where} ({reason}): the engine above cannot run on this machine; "
            "running the same network's decode loop on the CPU interpreter instead"
        )
    if emulated:
        return "note: --emulate-gpu: running the engine with TensorRT on the emulated GPU"
    return "note: a CUDA GPU is usable: running the engine with TensorRT on it"


def run(args: argparse.Namespace) -> int:
    return common.run_on_device(args, _run)


def _run(args: argparse.Namespace) -> int:
    from trt_kv.engine.store import doc_example_engine
    from trt_kv.errors import ConfigError
    from trt_kv.runtime.gpu.cuda import gpu_unavailable_reason, tensorrt_refusal

    args.backend = "auto"
    backends.choose_backend(args, builds_engine=True)
    # no GPU, or one the installed TensorRT (or an engine for these targets) does not run
    reason = tensorrt_refusal(backends.engine_targets(args))
    no_gpu = gpu_unavailable_reason() is not None
    check_model(args)
    generate.check_prompt_options(args)  # refuse bad prompts before building anything
    if args.prompt is None and args.prompt_ids is not None:
        generate.check_fit(args, prompt_ids(args.prompt_ids), "--prompt-ids")
    model = common.load_cli_model(args)
    args.max_new_tokens = args.max_new_tokens or defaults.MAX_NEW_TOKENS_DEMO
    try:
        has_text = args.prompt_ids is None and model.checkpoint.tokenizer() is not None
    except ConfigError:
        has_text = False  # random weights or a folder without tokenizer.json: ids only
    runs = [(None, args.prompt, args.chat)]
    if args.prompt is None and has_text:
        runs = [(label, [text], chat) for label, text, chat in DEMO_PROMPTS]
    asked = []  # (label, prompt texts, chat, prompt ids, tokenizer), all checked first
    for label, prompt, chat in runs:
        args.prompt, args.chat = prompt, chat
        prompts, tokenizer = generate.prompts_of(args, model)
        generate.check_fit(args, prompts, "--prompt" if prompt else "--prompt-ids")
        asked.append((label, prompt, chat, prompts, tokenizer))
    # the model first: a route or build TensorRT refuses leaves --out untouched
    model_row = common.model_engine(args, model.name, model.config, model.weights, args.max_batch)
    talk = sys.stderr if args.json else sys.stdout  # --json: stdout holds the JSON lines only
    build.print_built(args.out, [doc_example_engine(args.out), model_row], file=talk)
    print(backend_note(reason, args.emulate_gpu, no_gpu), file=sys.stderr)
    where = " (emulated GPU)" if args.emulate_gpu and args.backend != "interpreter" else ""
    with backends.opened_backend(args, model.name, model.config, model.weights, 8) as backend:
        for label, prompt, chat, prompts, tokenizer in asked:
            args.prompt, args.chat = prompt, chat
            shown = f"{label}> {prompt[0]}" if label else f"prompts={args.prompt_ids or prompt}"
            print(f"\n[{model.name}, backend={backend.name}{where}] {shown}", file=talk)
            generate.generate_and_print(
                args, backend, prompts, tokenizer, model.checkpoint.eos_token_ids
            )
    return 0
