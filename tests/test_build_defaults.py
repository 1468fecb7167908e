"""Every default is defined once, in trt_kv/build_defaults.py, and read from there: the tokens
each command generates without --max-new-tokens, and the step width when max_step_tokens is
None (``default_step_tokens``: min(128, S_max), the same for the builder, build jobs, the
runtime's CacheState and the reference backends)."""

import argparse

import numpy as np
import pytest

from trt_kv import build_defaults
from trt_kv.cli import chat, demo, generate


def _help(add_arguments, option: str) -> str:
    p = argparse.ArgumentParser()
    add_arguments(p)
    (action,) = [a for a in p._actions if option in a.option_strings]
    return action.help


def test_each_command_generates_its_own_default_number_of_tokens():
    assert build_defaults.MAX_NEW_TOKENS_GENERATE_IDS == 8
    assert build_defaults.MAX_NEW_TOKENS_GENERATE_TEXT == 64
    assert build_defaults.MAX_NEW_TOKENS_DEMO == 24
    assert build_defaults.MAX_NEW_TOKENS_CHAT == 256


def test_the_help_of_max_new_tokens_reads_the_defaults():
    assert "(default: 8, or 64 with --prompt;" in _help(generate.add_arguments, "--max-new-tokens")
    assert "(default: 24)" in _help(demo.add_arguments, "--max-new-tokens")
    assert "(default: 256," in _help(chat.add_arguments, "--max-new-tokens")


@pytest.mark.parametrize(
    ("prompt", "max_seq_len", "expected"),
    [(None, 512, 8), (["text"], 512, 64), (None, 10, 6), (["text"], 10, 6)],
)
def test_generate_takes_8_for_ids_and_64_for_text_at_most_what_fits(prompt, max_seq_len, expected):
    args = argparse.Namespace(max_new_tokens=None, max_seq_len=max_seq_len, prompt=prompt)
    assert generate.new_tokens(args, [[1, 2, 3, 4, 5]]) == expected


# -- max_step_tokens None: default_step_tokens(S_max), one meaning everywhere ---------------

STEPS = [(512, 128), (129, 128), (128, 128), (64, 64)]  # (S_max, the step width it gets)


def _tiny_gpt2(n_positions: int):
    """A GPT-2 of one layer, D = 8, F = 16, V = 32: (config, seeded random weights)."""
    from trt_kv.models.gpt2 import GPT2Config, gpt2_weights

    d, f, v = 8, 16, 32
    config = GPT2Config(v, n_positions, n_embd=d, n_layer=1, n_head=2, n_inner=f)
    shapes = {"wte.weight": (v, d), "wpe.weight": (n_positions, d)}
    for name, shape in [("attn.c_attn", (d, 3 * d)), ("attn.c_proj", (d, d))]:
        shapes |= {f"h.0.{name}.weight": shape, f"h.0.{name}.bias": shape[1:]}
    for name, shape in [("mlp.c_fc", (d, f)), ("mlp.c_proj", (f, d))]:
        shapes |= {f"h.0.{name}.weight": shape, f"h.0.{name}.bias": shape[1:]}
    for norm in ("h.0.ln_1", "h.0.ln_2", "ln_f"):
        shapes |= {f"{norm}.weight": (d,), f"{norm}.bias": (d,)}
    rng = np.random.default_rng(0)
    tensors = {k: rng.normal(0, 0.3, s).astype(np.float32) for k, s in shapes.items()}
    return config, gpt2_weights(tensors, config)


@pytest.mark.parametrize(("s_max", "expected"), STEPS)
def test_the_default_step_is_min_128_s_max(s_max, expected):
    assert build_defaults.default_step_tokens(s_max) == expected


@pytest.mark.parametrize(("s_max", "expected"), STEPS)
def test_cache_state_without_max_step_tokens_takes_the_default_step(s_max, expected):
    from trt_kv.runtime.cache_state import CacheState

    assert CacheState(1, s_max).max_step_tokens == expected


@pytest.mark.parametrize(("s_max", "expected"), STEPS)
def test_the_reference_backends_without_max_step_tokens_take_the_default_step(s_max, expected):
    from tests.support.tiny_models import TINY_GQA
    from trt_kv.models.gpt2 import GPT2ReferenceBackend
    from trt_kv.models.llama import random_weights
    from trt_kv.models.llama.reference_backend import ReferenceBackend

    llama = ReferenceBackend(TINY_GQA, random_weights(TINY_GQA), capacity=1, max_seq_len=s_max)
    assert llama.max_step_tokens == expected
    gpt2 = GPT2ReferenceBackend(*_tiny_gpt2(512), capacity=1, max_seq_len=s_max)
    assert gpt2.max_step_tokens == expected


@pytest.mark.parametrize(("s_max", "expected"), STEPS)
def test_builds_without_max_step_tokens_take_the_default_step(s_max, expected):
    from trt_kv.engine.store import BuildOptions

    assert BuildOptions(max_seq_len=s_max).max_step_tokens == expected


def test_the_network_builders_without_max_step_tokens_take_the_default_step():
    from tests.support.tiny_models import TINY_GQA
    from trt_kv.models.gpt2 import build_gpt2_network
    from trt_kv.models.llama import build_llama_network, random_weights

    llama = build_llama_network(TINY_GQA, random_weights(TINY_GQA), max_seq_len=512, max_batch=1)
    assert llama.roles.max_step_tokens == 128
    gpt2 = build_gpt2_network(*_tiny_gpt2(512), max_seq_len=64, max_batch=1, dtype="float32")
    assert gpt2.roles.max_step_tokens == 64


def test_a_reference_session_prefills_a_prompt_past_128_in_chunks_with_the_same_logits():
    """The one change of issue 38: a reference backend without max_step_tokens used to take
    any step up to S_max; it now prefills 130 tokens as 128 + 2, as an engine would."""
    from tests.support.tiny_models import TINY_GQA
    from trt_kv.models.llama import random_weights
    from trt_kv.models.llama.reference_backend import ReferenceBackend
    from trt_kv.runtime import Session

    class Counted(ReferenceBackend):
        def run(self, plan):
            self.widths.append(plan.input_ids.shape[1])
            return super().run(plan)

    weights, prompt = random_weights(TINY_GQA), [[t % 60 + 1 for t in range(130)]]
    logits, widths = {}, {}
    for step in (None, 512):
        backend = Counted(TINY_GQA, weights, capacity=1, max_seq_len=512, max_step_tokens=step)
        backend.widths = widths[step] = []
        logits[step] = Session(backend).prefill(prompt)
    assert widths == {None: [128, 2], 512: [130]}
    np.testing.assert_allclose(logits[None], logits[512], rtol=1e-5, atol=1e-5)
