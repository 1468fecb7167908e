"""``trt-kv demo``: build, then generate on the best backend this machine has."""

from __future__ import annotations

import argparse

from trt_kv.cli import build, generate

HELP = "build, then generate on the GPU (or the CPU interpreter without one)"
EXAMPLE = "trt-kv demo --max-new-tokens 16"


def add_arguments(p: argparse.ArgumentParser) -> None:
    generate.add_generation_arguments(p)


def run(args: argparse.Namespace) -> int:
    from trt_kv.runtime.cuda import gpu_unavailable_reason

    args.no_model = False
    build.run(args)
    reason = gpu_unavailable_reason()
    args.backend = "tensorrt" if reason is None else "interpreter"
    if reason is not None:
        print(
            f"\nno GPU here ({reason}): the engine above cannot run on this machine; "
            "running the same network's decode loop on the CPU interpreter instead"
        )
    print(
        f"\ngenerate: backend={args.backend} prompts={args.prompt_ids} "
        f"max_new_tokens={args.max_new_tokens}"
    )
    return generate.run(args)
