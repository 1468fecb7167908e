"""``trt-kv demo``: build, then generate on the best backend this machine has."""

from __future__ import annotations

import argparse

from trt_kv.cli import build, generate
from trt_kv.cli.checks import check_backend_options, check_model

HELP = "build, then generate on the GPU (or the CPU interpreter without one)"
EXAMPLE = "trt-kv demo --max-new-tokens 16"


def add_arguments(p: argparse.ArgumentParser) -> None:
    generate.add_generation_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.emulate_gpu:
        from trt_kv.emulator import emulated_gpu

        with emulated_gpu():
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from trt_kv.runtime.cuda import gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    args.backend = "tensorrt" if reason is None else "interpreter"
    check_backend_options(args, args.backend, " (the demo's pick: no GPU)" if reason else "")
    check_model(args)
    generate.read_prompts(args)  # refuse bad prompts before building anything
    args.no_model = False
    build.run(args)
    if reason is not None:
        print(
            f"\nno GPU here ({reason}): the engine above cannot run on this machine; "
            "running the same network's decode loop on the CPU interpreter instead"
        )
    print(
        f"\ngenerate: backend={args.backend}{' (emulated GPU)' if args.emulate_gpu else ''} "
        f"prompts={args.prompt_ids or args.prompt or generate.DEFAULT_PROMPT_IDS} "
        f"max_new_tokens={args.max_new_tokens}"
    )
    return generate.run(args)
