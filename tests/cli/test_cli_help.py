"""``trt-kv --help`` prints argparse's help text stored in ``trt_kv.cli.HELP`` (issue 15:
start-up <= 60 ms without argparse); the stored text must never differ from argparse's."""

import subprocess
import sys

import pytest

from tests.support.cli_user import run_cli, user_env
from trt_kv.cli import HELP, HELP_COLUMNS, make_parser

FAST = pytest.mark.skipif(sys.version_info >= (3, 14), reason="argparse colours help on 3.14")


def argparse_help(monkeypatch, columns):
    """The top-level help as argparse formats it on a terminal of ``columns`` columns."""
    monkeypatch.setenv("COLUMNS", str(columns))
    return make_parser(None).format_help()


def test_stored_help_is_argparses_on_every_width_it_is_printed_on(monkeypatch):
    # if this fails after a change to the subcommands or options, paste the new text into HELP
    for columns in range(HELP_COLUMNS, 301):
        assert argparse_help(monkeypatch, columns) == HELP, f"COLUMNS={columns}"


def test_narrower_terminals_wrap_so_they_get_argparses_own_text(monkeypatch):
    assert argparse_help(monkeypatch, HELP_COLUMNS - 1) != HELP
    out = run_cli("--help", COLUMNS="60").stdout
    assert out == argparse_help(monkeypatch, 60)
    assert "    build     build the doc example and the model engine\n" in out


@FAST
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_the_stored_text_and_exits_0_without_argparse(flag):
    code = (
        "import sys\nfrom trt_kv.cli import main\ntry:\n"
        f"    main([{flag!r}])\nexcept SystemExit as e:\n"
        "    print('exit', e.code, 'argparse' in sys.modules, file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=user_env(COLUMNS="80"),
        check=True,
    )
    assert out.stdout == HELP
    assert out.stderr == "exit 0 False\n"


def test_help_with_other_words_still_goes_through_argparse():
    out = run_cli("build", "--help", COLUMNS="80").stdout
    assert out.startswith("usage: trt-kv build [-h]")
    expected = "S_max of every cache (default: 512, or a GPT-2's n_positions when smaller)"
    assert expected in " ".join(out.split())


def test_every_default_shows_once_the_greedy_temperature_too():
    out = " ".join(run_cli("generate", "--help", COLUMNS="200").stdout.split())
    assert "else interpreter) (default: auto)" in out
    assert out.count("(default: auto)") == 1 and "default: auto:" not in out
    assert "0: greedy (default: 0.0)" in out
    assert "sampling seed (default: 0)" in out


def test_top_level_help_has_examples():
    assert "\nexamples:\n  trt-kv demo " in HELP
    assert 'trt-kv generate --prompt "What is the capital of France?" --chat' in HELP
