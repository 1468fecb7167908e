"""Checkpoint and tokenizer inputs that were a generic Python exception, misleading or
silent (issue 30): each is a named error naming the key or file, or (ids the tokenizer
lacks) shown in the text."""

import io
import json
import os

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import save_file

from tests.support.gguf_files import write_family_gguf, write_gguf
from trt_kv.checkpoints import read_gguf
from trt_kv.checkpoints.tokenizer import TextTokenizer
from trt_kv.cli import main
from trt_kv.errors import ArgumentError, ConfigError

EMBED = {"token_embd.weight": np.zeros((8, 16), np.float32)}
BYTES = ["<|endoftext|>", *"abcdefgh", "ab"]  # a 10-token byte-level vocabulary


def _gguf(tmp_path, meta, tensors=EMBED):
    return write_gguf(tmp_path / "m.gguf", "llama", meta, tensors)


def test_gguf_eos_token_id_stored_as_text_is_refused_naming_the_key(tmp_path):
    """Was ``ValueError: invalid literal for int()``."""
    path = _gguf(tmp_path, {"tokenizer.ggml.eos_token_id": "2"})
    match = r"tokenizer\.ggml\.eos_token_id: expected a token id \(an integer >= 0\), got '2'"
    with pytest.raises(ConfigError, match=match):
        read_gguf(path)


def test_gguf_head_count_of_zero_is_refused_naming_the_head_count(tmp_path):
    """Was "rope.dimension_count: expected the head size None"."""
    path = _gguf(tmp_path, {"llama.attention.head_count": 0, "llama.embedding_length": 16})
    with pytest.raises(
        ConfigError, match=r"^llama\.attention\.head_count: expected an integer >= 1, got 0$"
    ):
        read_gguf(path)


def test_gguf_architecture_that_is_not_utf8_is_refused_naming_the_key(tmp_path):
    """Was ``UnicodeDecodeError``. The writer stores "llama"; its first byte is made 0xff."""
    path = _gguf(tmp_path, {})
    data = bytearray(path.read_bytes())
    key = data.index(b"general.architecture")
    value = data.index(b"llama", key)
    data[value] = 0xFF
    path.write_bytes(bytes(data))
    match = r"^m\.gguf: general\.architecture: expected UTF-8 text, got b'\\xfflama'$"
    with pytest.raises(ConfigError, match=match):
        read_gguf(path)


def _tokenizer_folder(tmp_path):
    """A folder with a tokenizer.json (a 10-token byte-level BPE) and nothing else."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(BYTES)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def test_tokenizer_config_that_is_a_list_is_refused_naming_the_file(tmp_path):
    """Was ``AttributeError: 'list' object has no attribute 'get'``."""
    folder = _tokenizer_folder(tmp_path)
    (folder / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(
        ConfigError, match=r"tokenizer_config\.json: expected a JSON object, got list"
    ):
        TextTokenizer.from_folder(folder)


def test_chat_template_that_is_not_utf8_is_refused_naming_the_file(tmp_path):
    folder = _tokenizer_folder(tmp_path)
    (folder / "chat_template.jinja").write_bytes(b"{{ messages }}\xff\xfe")
    with pytest.raises(ConfigError, match=r"chat_template\.jinja: expected UTF-8 text, got "):
        TextTokenizer.from_folder(folder)


@pytest.mark.parametrize(
    ("template", "got"),
    [
        ("{{ 1/0 }}", "ZeroDivisionError: division by zero"),
        ("{{ messages[0]['content'] + 1 }}", "TypeError: "),
    ],
)
def test_a_chat_template_that_raises_at_render_is_a_config_error(tmp_path, template, got):
    """Only jinja's own errors were caught: ``{{ 1/0 }}`` was a ZeroDivisionError."""
    tok = TextTokenizer.from_folder(_tokenizer_folder(tmp_path))
    tok.chat_template = template
    with pytest.raises(ConfigError, match=f"^chat template: expected to render, got {got}"):
        tok.apply_chat_template([{"role": "user", "content": "a"}])


def test_text_that_is_not_utf8_is_an_argument_error(tmp_path):
    """``--prompt $'\\xff\\xfe'`` reaches Python as lone surrogates; tokenizers raised
    ``TypeError: TextInputSequence must be str``."""
    tok = TextTokenizer.from_folder(_tokenizer_folder(tmp_path))
    match = r"^text: expected UTF-8 text, got '\\udcff\\udcfe' \(bytes that are not UTF-8\)$"
    with pytest.raises(ArgumentError, match=match):
        tok.encode("\udcff\udcfe")


def test_prompt_bytes_that_are_not_utf8_are_one_line_and_exit_2(tmp_path):
    from tests.support.cli_user import run_cli, write_tiny_model

    folder = write_tiny_model(tmp_path / "tiny")
    _tokenizer_folder(folder)
    raw = os.fsdecode(b"\xff\xfe")  # what Python makes of those argv bytes; passed back as is
    out = run_cli("generate", "--model", folder, "--prompt", raw, check=False)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("trt-kv: error: text: expected UTF-8 text, got ")
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_ids_the_tokenizer_lacks_are_shown_not_dropped(tmp_path):
    tok = TextTokenizer.from_folder(_tokenizer_folder(tmp_path))
    assert tok.decode([1, 61, 2, 10, 3]) == "a<|id:61|>b<|id:10|>c"
    assert tok.unknown([1, 61, 2, 61, 10]) == [61, 10]
    stream = tok.stream()
    assert [stream.step(i) for i in (1, 61, 2)] == ["a", "<|id:61|>", "b"]


def padded_gguf(tmp_path, **metadata):
    """A GGUF whose tokenizer has 10 tokens for a vocabulary of 97 (seeded weights)."""
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    path = write_family_gguf(
        tmp_path / "padded.gguf",
        model,
        "llama",
        **{
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "default",
            "tokenizer.ggml.tokens": BYTES,
            "tokenizer.ggml.merges": ["a b"],
            "tokenizer.ggml.token_type": [3] + [1] * 9,
            **metadata,
        },
    )
    return path


def test_a_padded_vocabulary_generates_and_shows_ids_its_tokenizer_lacks(tmp_path, capsys):
    """A GGUF whose tokenizer has 10 tokens for a vocabulary of 97 (padded vocabularies are
    normal: Phi-3's 32064 for 32011 tokens) is accepted; ids past the tokenizer are shown as
    ``<|id:N|>`` in the text (they decoded into nothing) and said once on stderr."""
    path = padded_gguf(tmp_path)
    argv = ["generate", "--model", str(path), "--prompt", "abc", "--backend", "reference"]
    assert main([*argv, "--max-new-tokens", "12", "--ignore-eos", "--json", "-q"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    ids = result["ids"][0]
    lacking = [i for i in ids if i >= len(BYTES)]
    assert lacking, "the seeded model must produce ids past the tokenizer for this test"
    for i in lacking:
        assert f"<|id:{i}|>" in result["text"][0]
    assert err.count("the model produced ids its tokenizer has no token for") == 1
    assert f"({', '.join(map(str, dict.fromkeys(lacking)))})" in err or ", ..." in err


def test_safetensors_folder_still_reads(tmp_path):
    """The tokenizer checks leave a well-formed folder's tokenizer as it was."""
    folder = _tokenizer_folder(tmp_path)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    save_file({"x": np.zeros(2, np.float32)}, str(folder / "model.safetensors"))
    tok = TextTokenizer.from_folder(folder)
    assert tok.special_tokens["eos_token"] == "<|endoftext|>"
    assert tok.decode(tok.encode("abc")) == "abc"


def test_gguf_merge_of_a_pair_not_in_the_vocabulary_is_refused_naming_the_key(tmp_path):
    """Was a bare ``Exception: Error while initializing BPE``."""
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": BYTES,
        "tokenizer.ggml.merges": ["b c"],  # "bc" is no token
    }
    path = _gguf(tmp_path, meta)
    match = r"tokenizer\.ggml\.merges: expected merges of tokens in the vocabulary, got .*bc"
    with pytest.raises(ConfigError, match=match):
        read_gguf(path).tokenizer()


def test_chat_says_once_that_the_model_produced_ids_its_tokenizer_lacks(
    tmp_path, capsys, monkeypatch
):
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = padded_gguf(tmp_path, **{"tokenizer.chat_template": template})
    monkeypatch.setattr("sys.stdin", io.StringIO("abc\nabc\n"))
    argv = ["chat", "--model", str(path), "--backend", "reference", "--ignore-eos", "-q"]
    assert main([*argv, "--max-new-tokens", "12"]) == 0
    out, err = capsys.readouterr()
    assert "<|id:" in out  # both answers show such ids; the note comes once
    assert err.count("the model produced ids its tokenizer has no token for") == 1
