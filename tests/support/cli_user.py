"""Run ``python -m trt_kv`` as a user would: a fresh interpreter on this checkout (or, with
:func:`run_json`, ``trt-kv generate --json`` in this process)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trt_kv.cli import main

ROOT = Path(__file__).resolve().parents[2]


def user_env(**extra: str) -> dict:
    """This process's environment with the checkout first on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def run_cli(
    *argv: str, check: bool = True, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess:
    """``python -m trt_kv ARGV...``; stdout and stderr captured as text (not a terminal),
    ``stdin`` piped in when given."""
    out = subprocess.run(
        [sys.executable, "-m", "trt_kv", *map(str, argv)],
        input=stdin,
        capture_output=True,
        text=True,
        env=user_env(**env),
        check=False,
    )
    if check:
        assert out.returncode == 0, out.stderr
    return out


def run_in_terminal(*argv: str) -> tuple[int, str]:
    """``python -m trt_kv ARGV...`` on a pseudo-terminal (stdout and stderr both on it, as a
    user sees them; the terminal reports no size, as under ``script`` or CI); returns the
    exit code and everything written, ``\\r`` included."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once, nothing of pytest's runs here
        os.execve(sys.executable, [sys.executable, "-m", "trt_kv", *argv], user_env())
    return finish_terminal(pid, fd, b"")


def finish_terminal(pid: int, fd: int, seen: bytes) -> tuple[int, str]:
    """Read the terminal ``fd`` of child ``pid`` to its end, close it and wait for the
    child: its exit code (negative: the signal that ended it) and ``seen`` plus the rest."""
    chunks = [seen]
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A module's tiny Llama checkpoint folder (:func:`write_tiny_model`); a test module
    takes it with ``from tests.support.cli_user import tiny_model as tiny_model``."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny"))


def write_tiny_model(folder: Path) -> Path:
    """A two-layer Llama checkpoint folder (config.json + model.safetensors), seeded."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    from tests.support.tiny_models import TINY_HF_CONFIG
    from trt_kv.models.llama import LlamaConfig, random_weights, to_hf_tensors

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_HF_CONFIG))
    weights = random_weights(LlamaConfig.from_hf(TINY_HF_CONFIG), seed=2, std=0.3)
    save_file(
        {k: np.ascontiguousarray(v) for k, v in to_hf_tensors(weights).items()},
        str(folder / "model.safetensors"),
    )
    return folder


# A chat template in the shape of SmolLM2's (ChatML), over the tiny word-level vocabulary.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}w1 w{{ {'system': 2, 'user': 3, 'assistant': 4}[m['role']] }} "
    "{{ m['content'] }} w1 {% endfor %}{% if add_generation_prompt %}w1 w4 {% endif %}"
)


def write_tiny_tokenizer(folder: Path) -> Path:
    """A word-level ``tokenizer.json`` (``w0`` .. ``w96``, one id each) and a
    ``tokenizer_config.json`` with :data:`TINY_CHAT_TEMPLATE`, in ``folder``."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(97)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TINY_CHAT_TEMPLATE}))
    return folder


def run_json(capsys: object, *argv: str) -> dict:
    """``trt-kv generate --json ARGV...`` in this process (its exit status checked): the JSON
    line it printed last, from pytest's ``capsys``."""
    assert main(["generate", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])
