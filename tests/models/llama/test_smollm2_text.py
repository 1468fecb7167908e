"""Text in and out on the real default model: trt_kv's tokenizer (built from the GGUF
vocabulary and merges) and chat template against transformers', the text ``trt-kv`` prints
against Hugging Face's decoded text, and the folder transformers saves from the GGUF accepted
by ``trt-kv build`` and ``generate`` unchanged."""

import json

import pytest

from tests.support.real_model import (
    CHAT_ANSWER,
    CHAT_IDS,
    CHAT_PROMPT_IDS,
    CHAT_QUESTION,
    PLAIN_IDS,
    PLAIN_PROMPT,
    PLAIN_PROMPT_IDS,
)
from trt_kv.checkpoints import TextTokenizer
from trt_kv.cli import main
from trt_kv.models.llama import LlamaConfig

TEXTS = {
    "ascii": "Hello, world! How are you today?",
    "accents": "Café, naïve résumé; à l'été, Ærøskøbing",
    "emoji": "emoji 🎉🚀 and 🤖👍🏽!",
    "digits": "In 2024, 12345 + 678 = 13023",
    "whitespace": "  two spaces\n\ttab and\r\nnewlines   ",
    "special": "<|im_start|>user\nhi<|im_end|>\n",
}
CONVERSATIONS = {
    "user": [{"role": "user", "content": CHAT_QUESTION}],
    "system_and_turns": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Bonjour !"},
        {"role": "assistant", "content": "Bonjour, ça va ?"},
        {"role": "user", "content": "Très bien 🎉"},
    ],
}


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return smollm2.checkpoint.tokenizer()


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_encoding_equals_hugging_face(tokenizer, hf_tokenizer, text):
    assert tokenizer.encode(text) == hf_tokenizer(text).input_ids


@pytest.mark.parametrize("messages", CONVERSATIONS.values(), ids=CONVERSATIONS.keys())
def test_chat_template_renders_as_transformers(tokenizer, hf_tokenizer, messages):
    theirs = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages) == theirs
    assert (
        tokenizer.encode_chat(messages) == hf_tokenizer(theirs, add_special_tokens=False).input_ids
    )


def test_chat_prompt_ids_are_the_goldens(tokenizer):
    assert tokenizer.encode_chat(CONVERSATIONS["user"]) == CHAT_PROMPT_IDS
    assert tokenizer.encode(PLAIN_PROMPT) == PLAIN_PROMPT_IDS


def test_decode_equals_hugging_face_without_special_tokens(tokenizer, hf_tokenizer):
    for ids in (CHAT_IDS, PLAIN_IDS, tokenizer.encode(TEXTS["emoji"])):
        assert tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert tokenizer.decode(CHAT_IDS[:8]) == CHAT_ANSWER


def test_streamed_pieces_join_to_the_decoded_text(tokenizer):
    ids = tokenizer.encode(TEXTS["emoji"] + TEXTS["accents"])
    stream = tokenizer.stream()
    pieces = [stream.step(i) for i in ids]
    assert "".join(p for p in pieces if p) == tokenizer.decode(ids)
    assert all("\ufffd" not in p for p in pieces if p)  # no half characters printed


def test_saved_folder_tokenizer_encodes_the_same(tokenizer, hf_saved_folder):
    saved = TextTokenizer.from_folder(hf_saved_folder)
    for text in TEXTS.values():
        assert saved.encode(text) == tokenizer.encode(text)
    assert saved.encode_chat(CONVERSATIONS["user"]) == CHAT_PROMPT_IDS


# -- trt-kv on the real model -------------------------------------------------------------


def test_generate_prompt_on_the_default_model_json_gives_ids_and_text(
    smollm2_gguf, hf_tokenizer, capsys
):
    argv = ["generate", "--prompt", PLAIN_PROMPT, "--no-chat", "--max-new-tokens", "6"]
    argv += ["--ignore-eos"]
    argv += ["--backend", "reference", "--max-seq-len", "32", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ids"] == [PLAIN_IDS[:6]]
    assert out["text"] == [hf_tokenizer.decode(PLAIN_IDS[:6], skip_special_tokens=True)]


def test_saved_folder_config_is_the_one_of_issue_11(hf_saved_folder):
    """What trt_kv reads of the saved config.json is issue 11's config; the writer's version
    stamp (``transformers_version``, whatever release pip installed) is not compared."""
    from tests.models.llama.test_llama_config_keys import SAVED_FROM_GGUF

    saved = json.loads((hf_saved_folder / "config.json").read_text())
    assert isinstance(saved.pop("transformers_version"), str)
    expected = {k: v for k, v in SAVED_FROM_GGUF.items() if k != "transformers_version"}
    assert {k: saved.get(k) for k in expected} == expected
    assert LlamaConfig.from_hf(saved) == LlamaConfig(rms_norm_eps=9.999999747378752e-06)


def test_saved_folder_builds_unchanged(hf_saved_folder, tmp_path, capsys):
    argv = ["build", "--model", str(hf_saved_folder), "--out", str(tmp_path)]
    argv += ["--max-seq-len", "64", "--max-batch", "1", "--max-step-tokens", "40"]
    assert main(argv) == 0
    [engine] = tmp_path.glob(f"{hf_saved_folder.name}-*-float16*.engine")
    assert engine.name in capsys.readouterr().out


def test_a_question_to_the_default_model_is_answered_in_its_chat_template(smollm2_gguf, capsys):
    """No --chat needed (it printed nothing: the raw question's first token was <|im_end|>)."""
    argv = ["generate", "--prompt", CHAT_QUESTION, "--backend", "reference"]
    assert main([*argv, "--max-seq-len", "64", "--max-new-tokens", "16"]) == 0
    assert capsys.readouterr().out == CHAT_ANSWER + "\n"


def test_saved_folder_chat_streams_the_hugging_face_answer_and_stops_at_eos(
    hf_saved_folder, hf_tokenizer, capsys
):
    argv = ["generate", "--model", str(hf_saved_folder), "--prompt", CHAT_QUESTION, "--chat"]
    argv += ["--backend", "reference", "--max-seq-len", "64", "--max-new-tokens", "16"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out == hf_tokenizer.decode(CHAT_IDS[:8], skip_special_tokens=True) + "\n"
    assert captured.out == CHAT_ANSWER + "\n"
    # stopped at <|im_end|> (generation_config): 8 new tokens, the first from the prefill
    assert "; decode 7 tokens in 7 steps, " in captured.err
