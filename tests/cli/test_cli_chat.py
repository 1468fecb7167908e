"""``trt-kv chat`` through a pipe: one message per line, the history in the model's chat
template (the tiny checkpoint's ChatML-like one, ``cli_user.TINY_CHAT_TEMPLATE``), /reset,
/exit, streamed answers on stdout, one speed line per answer on stderr."""

import subprocess
import sys

import pytest

from tests.support.cli_user import (
    run_cli,
    run_json,
    user_env,
    write_tiny_model,
    write_tiny_tokenizer,
)

ASK = ["--backend", "reference", "--max-new-tokens", "3", "--ignore-eos", "-q"]
USER, ASSISTANT, SYSTEM, MARK = 3, 4, 2, 1  # the template's ids: "w1 wROLE content w1 "


@pytest.fixture(scope="module")
def talking_model(tmp_path_factory):
    return write_tiny_tokenizer(write_tiny_model(tmp_path_factory.mktemp("chat")))


def chat(model, stdin, *argv):
    out = run_cli("chat", "--model", model, *ASK, *argv, stdin=stdin)
    return out.stdout.splitlines(), out.stderr.splitlines()


def turn(role, words):
    return [MARK, role, *words, MARK]


def ids_after(capsys, model, prompt):
    """What ``generate`` answers to ``prompt`` ids (3 new tokens), as words."""
    ask = ["--model", str(model), "--prompt-ids", ",".join(map(str, prompt)), *ASK[:-1]]
    return " ".join(f"w{i}" for i in run_json(capsys, *ask)["ids"][0])


def test_chat_keeps_the_history_in_the_template_and_forgets_it_at_reset(talking_model, capsys):
    stdin = "w5 w17\n\nw9\n/reset\nw9\n/exit\nw60\n"
    answers, err = chat(talking_model, stdin, "--system", "w7")
    system = turn(SYSTEM, [7])
    first = ids_after(capsys, talking_model, [*system, *turn(USER, [5, 17]), MARK, ASSISTANT])
    said = [int(w[1:]) for w in first.split()]
    second_ids = [*system, *turn(USER, [5, 17]), *turn(ASSISTANT, said), *turn(USER, [9])]
    second = ids_after(capsys, talking_model, [*second_ids, MARK, ASSISTANT])
    fresh = ids_after(capsys, talking_model, [*system, *turn(USER, [9]), MARK, ASSISTANT])
    assert answers == [first, second, fresh]  # nothing after /exit
    speed = [line for line in err if line.startswith("reference: prefill ")]
    prefilled = [int(line.split()[2]) for line in speed]
    assert prefilled == [4 + 5 + 2, len(second_ids) + 2, 4 + 4 + 2]
    assert "(conversation forgotten)" in err


def test_chat_ends_at_the_end_of_input_and_names_unknown_commands(talking_model):
    answers, err = chat(talking_model, "/help\nw5\n")
    assert len(answers) == 1 and len(answers[0].split()) == 3
    assert any(line.startswith("unknown command '/help'") for line in err)


def test_chat_without_a_chat_template_is_one_line(tmp_path):
    model = write_tiny_tokenizer(write_tiny_model(tmp_path / "plain"))
    (model / "tokenizer_config.json").unlink()
    out = run_cli("chat", "--model", model, *ASK, stdin="w5\n", check=False)
    assert out.returncode == 2
    assert out.stderr.startswith("trt-kv: error: --chat: expected a model with a chat template")


def test_a_system_prompt_with_no_room_for_a_turn_is_refused_at_start(talking_model):
    system = " ".join(["w7"] * 56)  # with a one-word message: 2 + 56 + 1, 4, 2 = 65 tokens
    argv = ["--max-seq-len", "64", "--system", system]
    out = run_cli("chat", "--model", talking_model, *ASK, *argv, stdin="w5\n", check=False)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        "trt-kv: error: --system: expected a system prompt leaving room for a turn in "
        "--max-seq-len (S_max) 64: with a one-character message and the answer's first token "
        "at most 64 tokens, got 65 tokens\n"
    )


def test_a_max_seq_len_with_no_room_for_a_turn_is_refused_at_start(talking_model):
    out = run_cli("chat", "--model", talking_model, *ASK, "--max-seq-len", "5", check=False)
    assert (out.returncode, out.stdout) == (2, "")  # "w1 w3 ? w1 w1 w4": 6 tokens
    assert out.stderr == (
        "trt-kv: error: --max-seq-len: expected room for one turn of the chat template: "
        "at least 6, got 5\n"
    )


def test_a_system_prompt_leaving_room_for_one_token_gets_a_one_token_answer(talking_model):
    system = " ".join(["w7"] * 55)  # 64 tokens with a one-word message: room for 1 more
    answers, _ = chat(talking_model, "w5\n", "--max-seq-len", "64", "--system", system)
    assert [len(a.split()) for a in answers] == [1]


def test_chat_stdin_that_is_not_utf8_is_one_line_naming_the_line_and_byte(talking_model):
    out = subprocess.run(
        [sys.executable, "-m", "trt_kv", "chat", "--model", str(talking_model), *ASK],
        input=b"w5\nw9 \xff\n",
        capture_output=True,
        env=user_env(PYTHONIOENCODING="utf-8"),  # strict decoding, whatever the locale
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert len(out.stdout.decode().split()) == 3  # the first message was answered
    assert out.stderr.decode().splitlines()[-1] == (
        "trt-kv: error: stdin: expected UTF-8 text, got byte 0xff at offset 3 of line 2"
    )
    assert "Traceback" not in out.stderr.decode()
