"""Prompts wider than one step: ``generate`` prefills them in chunks of ``--max-step-tokens``
(its default fixed, whatever the prompts) with the ids of one wide prefill, and one engine
serves every prompt length."""

import re

import pytest

from tests.support.cli_user import run_json
from tests.support.cli_user import tiny_model as tiny_model  # the fixture
from trt_kv import build_defaults

PROMPT = ",".join(str((7 * t + 3) % 96 + 1) for t in range(14))  # 14 tokens


@pytest.mark.parametrize("backend", ["reference", "interpreter"])
def test_a_prompt_wider_than_a_step_gives_the_ids_of_one_wide_prefill(tiny_model, capsys, backend):
    ask = ["--model", str(tiny_model), "--prompt-ids", f"{PROMPT};5,6", "--max-seq-len", "32"]
    ask += ["--max-new-tokens", "6", "--backend", backend]
    ask += ["--dtype", "float32"] if backend == "interpreter" else []
    chunked = run_json(capsys, *ask, "--max-step-tokens", "4")  # chunks of 4, 4, 4, 2
    wide = run_json(capsys, *ask, "--max-step-tokens", "14")  # the prompt in one step
    assert chunked["ids"] == wide["ids"]
    assert chunked["prefill"]["tokens"] == 16


def test_prompts_of_70_100_and_130_tokens_share_one_engine(tiny_model, tmp_path, capsys):
    assert build_defaults.MAX_STEP_TOKENS == 128  # 130 tokens: chunks of 128 and 2
    common = ["--model", str(tiny_model), "--max-new-tokens", "2", "--max-batch", "1"]
    for n in (70, 100, 130):
        ids = ",".join(str((5 * t + 1) % 96 + 1) for t in range(n))
        ask = [*common, "--prompt-ids", ids]
        out = run_json(
            capsys, *ask, "--backend", "tensorrt", "--emulate-gpu", "--out", str(tmp_path)
        )
        assert out["ids"] == run_json(capsys, *ask, "--backend", "reference")["ids"]
        (engine,) = tmp_path.glob("*.engine")  # one engine, named by the weights' digest too
        assert re.fullmatch(
            rf"{tiny_model.name}-[0-9a-f]{{8}}-float16-s512-b1-t128-k1\.engine", engine.name
        )
