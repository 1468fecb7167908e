"""The README's code samples run as written: the first (a KV-cache update network built
into an engine) on the real TensorRT-RTX builder; the user backend on a tiny network."""

import re
from pathlib import Path

import numpy as np
from tiny_models import TINY_GQA

from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

README = Path(__file__).resolve().parent.parent / "README.md"


def _samples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_cache_update_sample_builds_an_engine(capsys):
    sample = _samples()[0]
    assert "add_kv_cache_update" in sample and "build_engine" in sample
    scope: dict = {}
    exec(compile(sample, str(README), "exec"), scope)
    assert capsys.readouterr().out.startswith(
        "CacheAlias(input='past_key', output='present_key', shape=(-1, 8, 1024, 64), "
        "dtype='float16')"
    )
    assert len(scope["engine"].data) > 0


def test_the_user_backend_sample_generates_what_the_interpreter_backend_does():
    """The sample's backend, on a tiny float32 network (batch 2, ragged prompts): the same
    ids as trt_kv's InterpreterBackend on the same network."""
    sample = next(s for s in _samples() if "class MyBackend" in s)
    weights = random_weights(TINY_GQA, seed=3)
    net = build_llama_network(
        TINY_GQA, weights, max_seq_len=24, max_batch=2, max_step_tokens=4, dtype="float32"
    )
    scope: dict = {"net": net, "Session": Session}
    exec(compile(sample, str(README), "exec"), scope)
    prompts = [[3, 5, 7, 9, 11], [2, 4]]  # 5 tokens: a prefill in two steps of 4
    mine = generate(scope["session"], prompts, max_new_tokens=6)
    theirs = generate(Session(InterpreterBackend(net)), prompts, max_new_tokens=6)
    assert mine.ids == theirs.ids
    assert len(mine.ids[0]) == 6 and len(set(np.ravel(mine.ids))) > 1
