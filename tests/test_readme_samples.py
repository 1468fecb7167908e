"""The code samples of the README and docs/ run as written: the KV-cache update network is
built into an engine by the real TensorRT-RTX builder; the user backend runs a tiny network."""

import re
from pathlib import Path

import numpy as np
from tiny_models import TINY_GQA

from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _sample(*needles: str) -> tuple[str, Path]:
    """The one ```python block of the README or docs/*.md holding every needle, and its file."""
    found = [
        (block, path)
        for path in DOCS
        for block in re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
        if all(n in block for n in needles)
    ]
    assert len(found) == 1, f"{len(found)} code blocks hold {needles}"
    return found[0]


def test_the_cache_update_sample_builds_an_engine(capsys):
    sample, path = _sample("add_kv_cache_update", "build_engine", "print(done.alias)")
    scope: dict = {}
    exec(compile(sample, str(path), "exec"), scope)
    assert capsys.readouterr().out.startswith(
        "CacheAlias(input='past_key', output='present_key', shape=(-1, 8, 1024, 64), "
        "dtype='float16')"
    )
    assert len(scope["engine"].data) > 0


def test_the_user_backend_sample_generates_what_the_interpreter_backend_does():
    """The sample's backend, on a tiny float32 network (batch 2, ragged prompts): the same
    ids as trt_kv's InterpreterBackend on the same network."""
    sample, path = _sample("class MyBackend")
    weights = random_weights(TINY_GQA, seed=3)
    net = build_llama_network(
        TINY_GQA, weights, max_seq_len=24, max_batch=2, max_step_tokens=4, dtype="float32"
    )
    scope: dict = {"net": net, "Session": Session}
    exec(compile(sample, str(path), "exec"), scope)
    prompts = [[3, 5, 7, 9, 11], [2, 4]]  # 5 tokens: a prefill in two steps of 4
    mine = generate(scope["session"], prompts, max_new_tokens=6)
    theirs = generate(Session(InterpreterBackend(net)), prompts, max_new_tokens=6)
    assert mine.ids == theirs.ids
    assert len(mine.ids[0]) == 6 and len(set(np.ravel(mine.ids))) > 1
