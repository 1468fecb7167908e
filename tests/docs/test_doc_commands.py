"""The commands README.md and docs/emulator.md show run as written on this checkout (as
``python -m trt_kv``, which is ``trt-kv``): README command 1's ``trt-kv demo`` (the default
model's engines built into ``engines/``, or reused), and the emulated GPU's commands, each
``[--option]`` run without and with it. They share the default model's engine: the first to
run builds it (about a minute on a CPU), the others reuse it. Each answers the demo's or
generate's default question about France's capital."""

import re
import shlex
from pathlib import Path

import pytest

from tests.support.cli_user import ROOT, run_cli


def doc_commands(doc: Path) -> list[list[str]]:
    """The ``trt-kv`` commands of ``doc``'s bash blocks (after ``&&`` too), comments cut,
    each ``[--option]`` expanded into the command without it and with it."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].split("&&")[-1].strip()
            if not line.startswith("trt-kv "):
                continue
            variants = [line]
            for optional in re.findall(r"\[([^\]|]+)\]", line):
                spelled = (f" [{optional}]", ("", f" {optional}"))
                variants = [v.replace(spelled[0], s) for v in variants for s in spelled[1]]
            commands += [shlex.split(v)[1:] for v in variants]
    return commands


COMMANDS = doc_commands(ROOT / "README.md") + doc_commands(ROOT / "docs" / "emulator.md")


def test_the_docs_show_the_commands_run_here():
    assert COMMANDS == [
        ["demo"],
        ["generate", "--backend", "tensorrt", "--emulate-gpu"],
        ["generate", "--backend", "tensorrt", "--emulate-gpu", "--cuda-graph"],
        ["demo", "--emulate-gpu"],
    ]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_documented_command_runs_as_written(argv):
    out = run_cli(*argv, check=False)
    assert out.returncode == 0, out.stderr
    if argv[0] == "demo":
        assert "The capital of France is Paris." in out.stdout, out.stdout
    else:  # "[0] [29, 1141, ...]  'text'", a line per default prompt
        lines = out.stdout.splitlines()
        assert [line[:5] for line in lines] == ["[0] [", "[1] ["], out.stdout
