"""``generate --prompt-file``, ``--repetition-penalty`` and ``--json``'s ``finish_reason``,
on a tiny checkpoint (the penalty also on the default model, against transformers)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.support.cli_user import (
    run_cli,
    run_json,
    user_env,
    write_tiny_model,
    write_tiny_tokenizer,
)
from trt_kv.cli import main
from trt_kv.cli.prompt_file import parse_prompts, read_prompts
from trt_kv.errors import ArgumentError
from trt_kv.runtime.penalty import penalize_repetitions


@pytest.fixture(scope="module")
def talking_model(tmp_path_factory):
    """The tiny checkpoint with a word-level tokenizer and a chat template."""
    return write_tiny_tokenizer(write_tiny_model(tmp_path_factory.mktemp("talking")))


def test_finish_reason_is_eos_for_a_stopped_sequence_and_length_for_the_other(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "tiny")
    args = ["--model", str(model), "--prompt-ids", "1,2,3;40,41", "--max-new-tokens", "6"]
    args += ["--backend", "reference"]
    free = run_json(capsys, *args)
    assert free["finish_reason"] == ["length", "length"]
    first, second = free["ids"]
    stop = next(t for t in first[1:5] if t not in second and t not in first[: first.index(t)])
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop]}))
    out = run_json(capsys, *args)
    assert out["ids"] == [first[: first.index(stop) + 1], second]
    assert out["finish_reason"] == ["eos", "length"]
    assert run_json(capsys, *args, "--ignore-eos")["finish_reason"] == ["length", "length"]


def _generate_piped(stdin: str, *argv: str) -> dict:
    """``python -m trt_kv generate --json ARGV`` with ``stdin`` piped in (no terminal)."""
    out = run_cli("generate", "--json", "-q", *argv, stdin=stdin)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_prompt_file_from_a_pipe_as_one_prompt_and_as_json_lines(talking_model, capsys):
    ask = ["--model", str(talking_model), "--backend", "reference", "--max-new-tokens", "3"]
    texts = ["w5 w17 w42", "w9 w3"]
    expected = [run_json(capsys, *ask, "--prompt", t)["ids"][0] for t in texts]
    one = _generate_piped("w5 w17\nw42\n", *ask, "--prompt-file", "-")
    assert one["ids"] == [expected[0]]  # the whole text, its line break a separator
    lines = f'"{texts[0]}"\n\n{{"prompt": "{texts[1]}"}}\n'
    assert _generate_piped(lines, *ask, "--prompt-file", "-")["ids"] == expected


def test_prompt_file_from_a_path_with_the_chat_template(talking_model, tmp_path, capsys):
    ask = ["--model", str(talking_model), "--backend", "reference", "--max-new-tokens", "3"]
    path = tmp_path / "prompt.txt"
    path.write_text("w5 w17 w42\n")
    expected = run_json(capsys, *ask, "--chat", "--prompt", "w5 w17 w42")
    out = run_json(capsys, *ask, "--chat", "--prompt-file", str(path))
    assert (out["ids"], out["prefill"]["tokens"]) == (expected["ids"], 8)  # 3 words + 5 of chat


def test_a_json_lines_prompt_file_with_a_mistyped_key_names_the_line():
    text = '{"prompt": "w5 w17"}\n\n{"promt": "w9"}\n{"prompt": "w3"}\n'
    with pytest.raises(ArgumentError) as err:
        parse_prompts(text)
    assert str(err.value) == (
        '--prompt-file line 3: expected JSON lines, each a string or an object with a "prompt" '
        'string, got an object with keys "promt"'
    )


def test_a_json_lines_prompt_file_with_a_line_that_is_not_json_names_the_line():
    with pytest.raises(
        ArgumentError,
        match=r"^--prompt-file line 2: expected JSON lines, .*"
        r"got text that is not JSON: 'w9 w3'$",
    ):
        parse_prompts('{"prompt": "w5 w17"}\nw9 w3\n')


def test_a_prompt_file_saved_with_a_utf8_bom_is_read_without_it(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes('{"prompt": "w5 w17"}\n"w9"\n'.encode("utf-8-sig"))
    assert read_prompts(path) == ["w5 w17", "w9"]
    path.write_bytes("w5 w17\n".encode("utf-8-sig"))
    assert read_prompts(path) == ["w5 w17"]


def test_prompt_file_stdin_that_is_not_utf8_is_one_line_naming_the_byte(talking_model):
    out = subprocess.run(
        [sys.executable, "-m", "trt_kv", "generate", "--model", str(talking_model),
         "--prompt-file", "-"],
        input=b"w5 w17 \xff w9\n",
        capture_output=True,
        env=user_env(PYTHONIOENCODING="utf-8"),  # strict decoding, whatever the locale
        check=False,
    )  # fmt: skip
    assert (out.returncode, out.stdout) == (2, b""), out.stderr
    assert out.stderr.decode() == (
        "trt-kv: error: --prompt-file: expected UTF-8 text, got byte 0xff at offset 7 of stdin\n"
    )


TEXT_ASK = ["--backend", "reference", "--max-new-tokens", "3", "--prompt", "w5 w17 w42"]


def test_a_text_prompt_is_put_in_the_chat_template_when_the_model_has_one(talking_model, capsys):
    default = run_json(capsys, "--model", str(talking_model), *TEXT_ASK)
    chat = run_json(capsys, "--model", str(talking_model), *TEXT_ASK, "--chat")
    assert (default["ids"], default["prefill"]["tokens"]) == (chat["ids"], 8)  # 3 + 5 of chat


def test_no_chat_completes_the_raw_text(talking_model, capsys):
    out = run_json(capsys, "--model", str(talking_model), *TEXT_ASK, "--no-chat")
    assert out["prefill"]["tokens"] == 3


def test_a_model_without_a_chat_template_completes_the_raw_text_silently(tmp_path, capsys):
    model = write_tiny_tokenizer(write_tiny_model(tmp_path / "plain"))
    (model / "tokenizer_config.json").unlink()
    assert main(["generate", "--model", str(model), *TEXT_ASK, "--json", "-q"]) == 0
    out, err = capsys.readouterr()
    assert (json.loads(out)["prefill"]["tokens"], err) == (3, "")
    assert main(["generate", "--model", str(model), *TEXT_ASK, "--chat"]) == 2
    assert capsys.readouterr().err == (
        "trt-kv: error: --chat: expected a model with a chat template, got none\n"
    )


def test_penalty_equals_transformers_repetition_penalty_processor():
    import torch
    from transformers import RepetitionPenaltyLogitsProcessor

    rng = np.random.default_rng(5)
    logits = rng.standard_normal((3, 50)).astype(np.float32) * 4
    histories = [[3, 3, 7, 49], [0], [10, 11, 12, 10, 3]]
    for penalty in (0.7, 1.0, 1.3, 2.0):
        ours = penalize_repetitions(logits, histories, penalty)
        ids = torch.nn.utils.rnn.pad_sequence(
            [torch.tensor(h) for h in histories], batch_first=True, padding_value=histories[0][0]
        )
        ids[1, 1:] = 0  # pad with an id the row already holds: the processor's rule is a set
        ids[2, 5:] = 10
        theirs = RepetitionPenaltyLogitsProcessor(penalty)(ids, torch.from_numpy(logits.copy()))
        np.testing.assert_array_equal(ours, theirs.numpy())
    assert (logits == penalize_repetitions(logits, histories, 1.5)).sum() < logits.size


@pytest.mark.parametrize("bad", ["0", "-1", "nan"])
def test_a_penalty_not_above_zero_is_refused(bad, capsys):
    try:
        code = main(["generate", "--repetition-penalty", bad])
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    assert code == 2
    assert "--repetition-penalty" in capsys.readouterr().err


@pytest.mark.parametrize("penalty", [1e-300, 0.000999, 1000.001])
def test_a_penalty_outside_a_thousandth_to_a_thousand_is_refused_before_the_logits(penalty):
    """Past these the float32 factor is 0 or inf (1e-300: the logits inf, the softmax NaN)."""
    logits = np.ones((1, 4), np.float32)
    with pytest.raises(ArgumentError) as err:
        penalize_repetitions(logits, [[1]], penalty)
    expected = "repetition_penalty: expected a finite number in [0.001, 1000.0], got "
    assert str(err.value) == expected + str(penalty)


def test_penalty_on_the_default_model_gives_hugging_faces_ids(hf_smollm2, capsys):
    import torch

    from tests.support.real_model import PLAIN_PROMPT_IDS

    ask = ["--model", "default", "--prompt-ids", ",".join(map(str, PLAIN_PROMPT_IDS))]
    ask += ["--backend", "reference", "--max-seq-len", "48", "--max-new-tokens", "24"]
    ours = run_json(capsys, *ask, "--ignore-eos", "--repetition-penalty", "1.3")["ids"][0]
    out = hf_smollm2.generate(
        torch.tensor([PLAIN_PROMPT_IDS]),
        attention_mask=torch.ones(1, len(PLAIN_PROMPT_IDS), dtype=torch.long),
        do_sample=False,
        max_new_tokens=24,
        eos_token_id=None,
        pad_token_id=2,
        repetition_penalty=1.3,
    )
    assert ours == out[0, len(PLAIN_PROMPT_IDS) :].tolist()
    assert ours != run_json(capsys, *ask, "--ignore-eos")["ids"][0]  # the penalty changed them


def test_device_top_k_gives_the_ids_of_the_logits_path(tmp_path, capsys):
    """``--device-top-k``: the interpreter runs the network ending in its candidates;
    greedy and seeded ``--top-k`` ids are those of the network without them."""
    model = write_tiny_model(tmp_path / "tiny")
    args = ["--model", str(model), "--prompt-ids", "1,2,3;40,41", "--max-new-tokens", "6"]
    args += ["--backend", "interpreter", "--dtype", "float32"]
    sampled = ["--temperature", "0.7", "--top-k", "5", "--seed", "4"]
    for extra, k in (([], "1"), (sampled, "5")):
        want = run_json(capsys, *args, *extra)["ids"]
        assert run_json(capsys, *args, *extra, "--device-top-k", k)["ids"] == want
    with pytest.raises(SystemExit) as exit_:  # argparse's refusal
        main(["generate", *args, "--device-top-k", "-1"])
    assert exit_.value.code == 2
    capsys.readouterr()
    assert main(["generate", *args, "--device-top-k", "100000"]) == 2  # reaches the builder
    assert capsys.readouterr().err.startswith("trt-kv: error: device_top_k: expected an integer")
