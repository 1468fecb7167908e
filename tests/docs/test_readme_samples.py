"""The code samples of the README and docs/*.md run as written.

Every ```python block runs, in a fresh scope, with the current directory a temporary one. An
HTML comment on the line before a block's fence says what the block needs:

- ``<!-- skip: REASON -->``: not run here (a GPU, an engine file, an excerpt); the test is
  skipped with REASON.
- ``<!-- with: NAME, ... -->``: the block continues from earlier text; each NAME is made by
  ``SCOPE`` below before the block runs (``net``: a tiny Llama network; ``model`` and
  ``engine``: a tiny checkpoint folder and an engine file built from it; ``onnx_file``: a
  tiny Llama exported to ONNX).

Beyond running, two samples are checked: the KV-cache update network is built into an engine by
the real TensorRT-RTX builder, and the user backend gives the ids trt_kv's own backend gives.
The README stays a first screen (under 150 lines) and keeps its two set-up commands."""

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.support.tiny_models import TINY_GQA
from trt_kv.models.llama import build_llama_network, random_weights
from trt_kv.runtime import Session, generate
from trt_kv.runtime.interpreter_backend import InterpreterBackend

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!--\s*(skip|with):\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    path: Path
    index: int  # among the file's python blocks
    line: int  # of the fence, 1-based
    code: str
    skip: str | None = None  # the reason
    names: tuple[str, ...] = ()  # from SCOPE

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}#{self.index}"


def _blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    for i, line in enumerate(lines):
        if line.strip() != "```python":
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.fullmatch(before.strip())
        kind, value = marker.groups() if marker else (None, "")
        blocks.append(
            Block(
                path,
                len(blocks),
                i + 1,
                "\n".join(lines[i + 1 : end]) + "\n",
                skip=value if kind == "skip" else None,
                names=tuple(n.strip() for n in value.split(",")) if kind == "with" else (),
            )
        )
    return blocks


BLOCKS = [block for path in DOCS for block in _blocks(path)]


def _run(block: Block, scope: dict) -> dict:
    """Exec the block with its doc's line numbers (a traceback names the doc's line)."""
    exec(compile("\n" * block.line + block.code, str(block.path), "exec"), scope)
    return scope


def _tiny_llama_network() -> object:
    """float32, batch 2, steps of 4 tokens: a 5-token prompt is a prefill in two steps."""
    weights = random_weights(TINY_GQA, seed=3)
    return build_llama_network(
        TINY_GQA, weights, max_seq_len=24, max_batch=2, max_step_tokens=4, dtype="float32"
    )


def _alibi_decoder() -> object:
    """The ALiBi decoder of scripts/bring_your_own_decoder.py (docs/bring-your-own-decoder.md)."""
    path = ROOT / "scripts" / "bring_your_own_decoder.py"
    spec = importlib.util.spec_from_file_location("bring_your_own_decoder", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script.build(script.weights())


def _tiny_model() -> str:
    """A two-layer Llama checkpoint folder in the current directory (written once)."""
    from tests.support.cli_user import write_tiny_model

    folder = Path("tiny-model")
    if not folder.exists():
        write_tiny_model(folder)
    return str(folder)


def _tiny_engine() -> str:
    """The engine file ``trt-kv build --model tiny-model`` writes (with its sidecar) in
    engines/ of the current directory: built by another process, so the emulated TensorRT
    deserializes it only by rebuilding the sidecar's recipe from the model it is given."""
    from tests.support.cli_user import run_cli

    out = Path("engines").resolve()
    run_cli(
        "build", "--model", Path(_tiny_model()).resolve(), "--out", out, "--dtype", "float32",
        "--max-seq-len", "16", "--max-batch", "1", "--max-step-tokens", "4",
    )  # fmt: skip
    (engine,) = out.glob("tiny-model-*.engine")  # build writes the doc example's too
    return str(engine.relative_to(Path.cwd().resolve()))


def _onnx_file() -> Path:
    """A tiny random Llama exported to ONNX with a growing cache (docs/onnx.md's recipe)."""
    from tests.support.onnx_decoders import tiny_model
    from tests.support.onnx_models import export

    return export(tiny_model("llama"), Path("tiny-llama.onnx"))


SCOPE = {
    "onnx_file": _onnx_file,  # an exported decoder with a growing cache
    "net": _tiny_llama_network,
    "decoder": _alibi_decoder,
    "model": _tiny_model,  # a tiny checkpoint folder
    "engine": _tiny_engine,  # trt-kv build's engine file of that folder
}


def test_every_marker_is_read():
    """A marker the pattern misses would silently run (or not skip) its block."""
    for path in DOCS:
        comments = re.findall(r"<!--\s*(?:skip|with)\b.*?-->", path.read_text())
        marked = sum(1 for b in BLOCKS if b.path == path and (b.skip or b.names))
        assert len(comments) == marked, path


EXCERPT = re.compile(r"an excerpt of (\S+\.py)")


def test_an_excerpt_is_its_files_lines_in_order():
    """A block skipped as an excerpt of a file that runs elsewhere: every line but ``...`` is
    one of that file's lines (indentation aside), in the file's order, so it cannot drift."""
    excerpts = [(b, EXCERPT.search(b.skip)) for b in BLOCKS if b.skip]
    excerpts = [(b, ROOT / m.group(1)) for b, m in excerpts if m]
    assert excerpts, "no block is marked as an excerpt"
    for block, path in excerpts:
        lines = [line.strip() for line in path.read_text().splitlines()]
        at = 0
        for line in block.code.splitlines():
            if line.strip() in ("", "..."):
                continue
            wanted = line.strip()
            assert wanted in lines[at:], f"{block}: {wanted!r} not in {path} after line {at}"
            at += lines[at:].index(wanted) + 1


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_the_code_block_runs(block, tmp_path, monkeypatch):
    if block.skip:
        pytest.skip(f"{block} (line {block.line}): {block.skip}")
    monkeypatch.chdir(tmp_path)
    unknown = set(block.names) - set(SCOPE)
    assert not unknown, f"{block}: no SCOPE entry for {sorted(unknown)}"
    _run(block, {name: SCOPE[name]() for name in block.names})


def _sample(*needles: str) -> Block:
    """The one python block of the README or docs/*.md holding every needle."""
    found = [b for b in BLOCKS if all(n in b.code for n in needles)]
    assert len(found) == 1, f"{len(found)} code blocks hold {needles}"
    return found[0]


def test_the_cache_update_sample_builds_an_engine(capsys):
    sample = _sample("add_kv_cache_update", "build_engine", "print(done.alias)")
    scope = _run(sample, {})
    assert capsys.readouterr().out.startswith(
        "CacheAlias(input='past_key', output='present_key', shape=(-1, 8, 1024, 64), "
        "dtype='float16')"
    )
    assert len(scope["engine"].data) > 0


def test_the_user_backend_sample_generates_what_the_interpreter_backend_does():
    """The sample's backend, on a tiny float32 network (batch 2, ragged prompts): the same
    ids as trt_kv's InterpreterBackend on the same network."""
    sample = _sample("class MyBackend")
    assert sample.names == ("net",)
    net = _tiny_llama_network()
    scope = _run(sample, {"net": net})
    prompts = [[3, 5, 7, 9, 11], [2, 4]]  # 5 tokens: a prefill in two steps of 4
    mine = generate(scope["session"], prompts, max_new_tokens=6)
    theirs = generate(Session(InterpreterBackend(net)), prompts, max_new_tokens=6)
    assert mine.ids == theirs.ids
    assert len(mine.ids[0]) == 6 and len(set(np.ravel(mine.ids))) > 1


def test_the_readme_is_a_first_screen_and_a_table_of_docs():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 150
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{doc.name})" in text, f"the README's table lacks docs/{doc.name}"


def test_the_readme_keeps_its_two_set_up_commands_and_ci_runs_the_second():
    setup = re.search(r"## Set up\n.*?```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    commands = [line for line in setup.group(1).splitlines() if line.startswith("pip ")]
    assert commands == [
        "pip install -e . && trt-kv demo",
        'pip install -e ".[test,oracle,serve,ray,onnx]" && python -m pytest -q',
    ]
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_every_relative_link_of_the_docs_leads_to_a_file():
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" not in target:
                assert (path.parent / target).exists(), f"{path.relative_to(ROOT)}: {target}"
