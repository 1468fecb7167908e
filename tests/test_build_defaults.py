"""Every default is defined once, in trt_kv/build_defaults.py, and read from there: the tokens
each command generates without --max-new-tokens, and the step width when max_step_tokens is
None (``default_step_tokens``: min(128, S_max), the same for the builder, build jobs, the
runtime's CacheState and the reference backends)."""

import argparse

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
