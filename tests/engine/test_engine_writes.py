"""Engine files are written whole or not at all: a full disk, an unwritable folder, Ctrl-C
at any line of the write, Ctrl-C during the TensorRT build. Real failures: a file-size
limit (``RLIMIT_FSIZE``) in a child process, a real SIGINT, a real interrupt raised at each
line of ``save_engine`` by a trace function."""

import dataclasses
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli_user import ROOT, finish_terminal, user_env
from tests.support.tiny_models import slow_to_build
from trt_kv.builder import BuiltEngine
from trt_kv.engine.file import load_engine_file, save_engine, sidecar_path
from trt_kv.engine.store import build_doc_example
from trt_kv.errors import EngineFileError


@pytest.fixture(scope="module")
def doc_engine(tmp_path_factory):
    return build_doc_example(tmp_path_factory.mktemp("engines"))


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


_FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from trt_kv.errors import EngineFileError
from trt_kv.engine.store import build_doc_example

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))  # the engine is ~140 KB
try:
    build_doc_example(Path(sys.argv[1]))
except EngineFileError as err:
    print(err)
"""


def test_a_full_disk_leaves_no_new_file_and_the_old_pair_intact(doc_engine, tmp_path):
    """Before: a truncated engine with no sidecar was left behind."""
    old = tmp_path / doc_engine.path.name
    old.write_bytes(doc_engine.path.read_bytes())
    sidecar_path(old).write_bytes(sidecar_path(doc_engine.path).read_bytes())
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    child = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path)],
        capture_output=True,
        text=True,
        env=user_env(),
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert "expected a writable location, got OSError: [Errno 27] File too large" in child.stdout
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporary left
    load_engine_file(old)  # the old pair still loads


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_an_engine_file_error_and_leaves_nothing(doc_engine, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        built = BuiltEngine(doc_engine.path.read_bytes(), 0.0)
        with pytest.raises(EngineFileError, match="expected a writable location"):
            save_engine(folder / "e.engine", built, doc_engine.meta)
        assert _files(folder) == []
    finally:
        folder.chmod(0o700)


def _interrupt_at_line(k: int) -> object:
    """A trace function that raises KeyboardInterrupt at the ``k``-th line ``save_engine``
    runs (as Ctrl-C there would); the counter says how many lines it ran."""
    count = {"lines": 0}

    def local(frame, event, arg):
        if event == "line":
            count["lines"] += 1
            if count["lines"] == k:
                raise KeyboardInterrupt
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is save_engine.__code__ else None

    tracer.count = count
    return tracer


def test_ctrl_c_at_any_line_of_the_write_leaves_the_old_pair_or_the_new_one(doc_engine, tmp_path):
    """After an interrupt at any line, the folder holds no temporary file, and the engine
    either loads (with the new or the old sidecar) or has no sidecar (then treated as
    absent): never a new engine vouched for by the old sidecar, never half a file."""
    new = BuiltEngine(doc_engine.path.read_bytes()[::-1], 1.0)  # other bytes, other sha256
    new_meta = dataclasses.replace(doc_engine.meta, sha256=hashlib.sha256(new.data).hexdigest())
    outcomes = set()
    for k in range(1, 200):
        folder = tmp_path / str(k)
        folder.mkdir()
        path = folder / "e.engine"
        save_engine(path, BuiltEngine(doc_engine.path.read_bytes(), 0.0), doc_engine.meta)
        tracer = _interrupt_at_line(k)
        sys.settrace(tracer)
        try:
            save_engine(path, new, new_meta)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sys.settrace(None)
        assert not [n for n in _files(folder) if n.endswith(".tmp")], (k, _files(folder))
        try:
            _, meta = load_engine_file(path)
            outcomes.add("new" if meta.sha256 == new_meta.sha256 else "old")
        except EngineFileError as err:
            assert "expected an engine built by trt_kv, with its JSON sidecar" in str(err)
            outcomes.add("no sidecar")
        if not interrupted:  # k is past the last line: every line was interrupted once
            break
    assert k > 5 and outcomes == {"old", "new", "no sidecar"}


_LONG_BUILD = """
import os, sys
from pathlib import Path
from trt_kv import progress
from trt_kv.engine.store import build_model_engine
from trt_kv.models.llama import random_weights
from tests.support.tiny_models import slow_to_build

progress.set_enabled(True)  # the bar on stderr tells the test the build has started
cfg = slow_to_build(16)
out = Path(sys.argv[1])
try:
    build_model_engine("long", cfg, random_weights(cfg), out_dir=out, max_seq_len=256,
                       max_batch=4, max_step_tokens=64)
    print("BUILT")
except KeyboardInterrupt:
    print("INTERRUPTED", sorted(os.listdir(out)) if out.exists() else [])
"""


def _trt_cancelled(stderr: str) -> bool:
    """Whether TensorRT logged that the build was cancelled (TensorRT-RTX 1.7.1: ``[TRT] [E]
    IBuilder::buildSerializedNetwork: Error Code 7: BuildCanceled (...)``), which it does only
    when the progress monitor's ``step_complete`` returned False."""
    return any("[TRT]" in line and "cancel" in line.lower() for line in stderr.splitlines())


# The build bar drawn with its phase count (``0/16 phases``): TensorRT has opened its top
# phase, so the process is inside ``build_serialized_network`` with seconds of work ahead
# (the bar's first draw, ``0/None phases``, comes before the build starts).
BUILDING = re.compile(r"/\d+ phases")


def _wait_for(stream, pattern: re.Pattern, deadline: float) -> str:
    seen = ""
    while not pattern.search(seen):
        assert time.monotonic() < deadline, seen
        chunk = os.read(stream.fileno(), 4096).decode(errors="replace")
        assert chunk, seen
        seen += chunk
    return seen


def test_ctrl_c_during_the_tensorrt_build_cancels_it_and_writes_nothing(tmp_path):
    """Before: TensorRT caught the KeyboardInterrupt raised in its progress callback
    (``[ERROR] Exception caught in log(): KeyboardInterrupt``), built on, and the engine
    was written."""
    child = subprocess.Popen(
        [sys.executable, "-c", _LONG_BUILD, str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=user_env(OPENBLAS_NUM_THREADS="1"),
        cwd=ROOT,
    )
    try:
        seen = _wait_for(child.stderr, BUILDING, time.monotonic() + 120)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    err = seen + err.decode(errors="replace")
    assert "interrupting..." in err
    assert _trt_cancelled(err), err  # stopped by the monitor, not built to the end
    assert out.decode().strip() == "INTERRUPTED []", (out, err)
    assert "Exception caught in log()" not in err


def _write_model(folder: Path, layers: int) -> Path:
    """A Llama checkpoint folder of ``layers`` layers (random weights, seeded)."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    from trt_kv.models.llama import random_weights, to_hf_tensors

    cfg = slow_to_build(layers)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg.to_hf()))
    tensors = to_hf_tensors(random_weights(cfg, seed=3))
    save_file(
        {k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "model.safetensors")
    )
    return folder


def test_ctrl_c_during_trt_kv_build_says_interrupted_and_ends_by_sigint(tmp_path):
    """On a terminal (bars shown, so the test sees the build start): one ``interrupting...``
    at once, then ``trt-kv: interrupted``, the process ends by SIGINT (a shell's 130) and
    ``--out`` holds no model engine. Before: exit 0 and the engine written."""
    import pty

    model = _write_model(tmp_path / "m", layers=16)
    out = tmp_path / "out"
    argv = ["build", "--model", str(model), "--out", str(out), "--max-seq-len", "256"]
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "trt_kv", *argv], user_env())
    screen = b""
    deadline = time.monotonic() + 120
    while not BUILDING.search(screen.decode(errors="replace")):
        try:
            assert time.monotonic() < deadline, screen
            screen += os.read(fd, 4096)
        except (OSError, AssertionError):  # EIO: the child ended before its build started
            finish_terminal(pid, fd, b"")
            raise AssertionError(screen.decode(errors="replace")) from None
    os.kill(pid, signal.SIGINT)
    code, text = finish_terminal(pid, fd, screen)
    assert code == -signal.SIGINT, text
    assert "interrupting..." in text and text.rstrip().endswith("trt-kv: interrupted"), text
    assert _trt_cancelled(text), text
    assert not list(out.glob("m-*.engine*")), _files(out)


# Where a build job's Ctrl-C lands (trt_kv.interrupts.step) -> the model engine's files after:
# before the renames neither, from the old sidecar's removal on both (the renames finish).
CTRL_C_AT = {
    "network built": "neither",
    "engine built": "neither",
    "temporaries written": "neither",
    "old sidecar removed": "both",
    "engine renamed": "both",
    "sidecar renamed": "both",
}


@pytest.mark.parametrize("at", list(CTRL_C_AT))
def test_ctrl_c_at_each_step_of_a_build_job_exits_130_with_both_files_or_neither(
    tmp_path, capsys, at
):
    """A real SIGINT, sent the moment the job reaches ``at``. Before: just after the engine's
    rename, a KeyboardInterrupt traceback and exit 0 (or 130 with an engine and no
    sidecar)."""
    from tests.support.cli_user import write_tiny_model
    from trt_kv import interrupts
    from trt_kv.cli import INTERRUPTED, main

    model = write_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    sent = []

    def ctrl_c(step: str) -> None:
        if step == at and not sent:
            sent.append(step)
            signal.raise_signal(signal.SIGINT)

    interrupts.STEP_OBSERVERS.append(ctrl_c)
    try:
        code = main(["build", "--model", str(model), "--out", str(out), "--max-seq-len", "16"])
    finally:
        interrupts.STEP_OBSERVERS.remove(ctrl_c)
    err = capsys.readouterr().err
    assert (sent, code) == ([at], INTERRUPTED), err
    assert err.endswith("interrupting...\ntrt-kv: interrupted\n"), err
    files = _files(out) if out.exists() else []
    engines = [f for f in files if f.endswith(".engine")]
    both = [f for e in engines for f in (e, e + ".json")]
    assert (files, len(engines)) == ((both, 1) if CTRL_C_AT[at] == "both" else ([], 0))
