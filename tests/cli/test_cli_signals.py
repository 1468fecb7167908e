"""Ending ``trt-kv`` early: Ctrl-C (one line, then the process ends by SIGINT, which a shell
shows as status 130) and host memory running out (one line, exit 1), never a traceback. Real
child processes: a real SIGINT, a real address-space limit (``RLIMIT_AS``)."""

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli_user import run_json, user_env, write_tiny_model, write_tiny_tokenizer
from tests.support.cli_user import tiny_model as tiny_model  # the fixture

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")


def _trt_kv(*argv: object, **popen: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trt_kv", *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # one BLAS thread and few malloc arenas: the address space the limit below counts
        env=user_env(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="2"),
        **popen,
    )


# ``trt-kv`` as ``python -m trt_kv`` runs it, but the first decode step also writes one line
# to the pipe whose fd is argv[1]: the test sends Ctrl-C on that line, not after a guess.
_SAYS_WHEN_DECODING = """
import os, sys
from trt_kv.runtime.session import Session

fd = int(sys.argv.pop(1))

def saying(step):
    def said(self, *args, **kwargs):
        global fd
        if fd >= 0:
            os.write(fd, b"decoding\\n")
            os.close(fd)
            fd = -1
        return step(self, *args, **kwargs)
    return said

Session.decode = saying(Session.decode)
Session.decode_top_k = saying(Session.decode_top_k)
from trt_kv.cli import program
sys.argv[0] = "trt-kv"
program()
"""


def _as_at_a_terminal() -> None:
    """SIGINT as a terminal's user has it: a job started with ``&`` by a script (a CI
    runner, say) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _long_run(model: Path) -> list[str]:
    """A ``generate`` of ~60 s on the tiny model: 99,990 decode steps."""
    return [
        "generate", "--model", str(model), "--backend", "interpreter", "--dtype", "float32",
        "--max-batch", "1", "--max-seq-len", "100000", "--max-new-tokens", "99990",
        "--ignore-eos", "--prompt-ids", "1,2,3",
    ]  # fmt: skip


def test_ctrl_c_is_one_line_then_the_process_ends_by_sigint(tiny_model):
    said, says = os.pipe()
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _SAYS_WHEN_DECODING, str(says), *_long_run(tiny_model)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=user_env(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="2"),
            preexec_fn=_as_at_a_terminal,
            pass_fds=(says,),
        )
    finally:
        os.close(says)
    try:
        with os.fdopen(said) as decoding:  # in the decode loop (~60 s of steps ahead)
            assert decoding.readline() == "decoding\n", child.communicate()
        for _ in range(120):
            child.send_signal(signal.SIGINT)  # again if one landed where Python drops it
            try:
                child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()  # a no-op once it has exited
    # ended by SIGINT itself, as Python on an uncaught KeyboardInterrupt: a shell loop stops
    assert child.returncode == -signal.SIGINT, err
    assert err == "trt-kv: interrupted\n"  # stderr is a pipe: no newline before it
    assert out == ""  # generated ids are printed at the end, which never came


@pytest.fixture(scope="module")
def talking_model(tmp_path_factory):
    return write_tiny_tokenizer(write_tiny_model(tmp_path_factory.mktemp("talking")))


# Answers of ~60 s (99,990 tokens) on the reference backend: only Ctrl-C ends them.
LONG_ANSWERS = ["--backend", "reference", "--max-seq-len", "100000", "--max-new-tokens",
                "99990", "--ignore-eos", "-q"]  # fmt: skip


class _User:
    """A ``trt-kv`` child on pipes (stderr apart, or merged into stdout as ``2>&1``), read
    as its user reads it: stdout as it streams, stderr a line at a time."""

    def __init__(self, *argv: object, merged: bool = False) -> None:
        self.child = subprocess.Popen(
            [sys.executable, "-m", "trt_kv", *map(str, argv)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
            env=user_env(),
            preexec_fn=_as_at_a_terminal,
        )
        self.out = b""  # stdout read so far and not yet taken by line()

    def say(self, text: str) -> None:
        self.child.stdin.write(f"{text}\n".encode())
        self.child.stdin.flush()

    def err_line(self) -> str:
        return self.child.stderr.readline().decode()

    def read_until(self, done) -> str:
        """Stdout until ``done(text read so far)``; the text."""
        while not done(self.out.decode()):
            data = os.read(self.child.stdout.fileno(), 4096)
            assert data, (self.out, self.child.wait(), self.child.stderr.read())
            self.out += data
        return self.out.decode()

    def line(self) -> str:
        """The next whole stdout line (without its newline), once it has ended."""
        self.read_until(lambda text: "\n" in text)
        line, _, self.out = self.out.partition(b"\n")
        return line.decode()

    def words(self, n: int) -> None:
        """Wait until the streamed line holds more than ``n`` words (``n`` of them whole)."""
        self.read_until(lambda text: len(text.partition("\n")[0].split()) > n)

    def __enter__(self) -> "_User":
        return self

    def __exit__(self, *exc: object) -> None:
        self.child.kill()  # a no-op once it has exited


def test_ctrl_c_in_a_chat_answer_stops_it_and_keeps_it_in_the_conversation(talking_model, capsys):
    with _User("chat", "--model", talking_model, *LONG_ANSWERS) as user:
        assert user.err_line().startswith("chat on reference: ")
        user.say("w5 w17")
        user.words(2)
        user.child.send_signal(signal.SIGINT)
        stopped = user.err_line()
        first = user.line()
        said = [int(w[1:]) for w in first.split()]
        assert stopped == f"(answer stopped: {len(said)} tokens kept in the conversation)\n"
        user.say("w9")  # answered after the kept history
        user.words(3)
        user.child.send_signal(signal.SIGINT)
        assert user.err_line().startswith("(answer stopped: ")
        second = user.line()
        user.child.stdin.close()  # Ctrl-D: the end of the conversation
        assert user.child.wait(timeout=60) == 0
    history = [1, 3, 5, 17, 1, 1, 4, *said, 1, 1, 3, 9, 1, 1, 4]  # the template's ids
    ask = ["--model", str(talking_model), "--prompt-ids", ",".join(map(str, history))]
    ask += ["--backend", "reference", "--max-seq-len", "100000", "--max-new-tokens", "3"]
    expected = run_json(capsys, *ask, "--ignore-eos")["ids"][0]
    assert second.split()[:3] == [f"w{i}" for i in expected]


def test_ctrl_c_at_the_chat_prompt_quits_with_status_0(talking_model):
    with _User("chat", "--model", talking_model, *LONG_ANSWERS) as user:
        assert user.err_line().startswith("chat on reference: ")  # then it waits on stdin
        user.child.send_signal(signal.SIGINT)
        out, err = user.child.communicate(timeout=60)
    assert (user.child.returncode, out, err) == (0, b"", b"")


def test_ctrl_c_during_a_streamed_answer_ends_its_line_before_the_message(talking_model):
    argv = ["generate", "--model", talking_model, "--prompt", "w5 w17", *LONG_ANSWERS]
    with _User(*argv, merged=True) as user:  # 2>&1: one pipe, as a terminal shows both
        user.words(2)
        user.child.send_signal(signal.SIGINT)
        out, _ = user.child.communicate(timeout=60)
    lines = (user.out + out).decode().split("\n")
    assert user.child.returncode == -signal.SIGINT
    assert lines[1:] == ["trt-kv: interrupted", ""]
    assert all(w.startswith("w") for w in lines[0].split())  # the answer, and only it


# A real SIGINT at a chosen point: the moment the parser imports the subcommand's module.
_INTERRUPT_WHILE_PARSING = """
import signal, sys

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "trt_kv.cli.generate":
            signal.raise_signal(signal.SIGINT)
        return None

sys.meta_path.insert(0, Interrupt())
from trt_kv.cli import program
sys.argv = ["trt-kv", "generate", "--help"]
program()
"""


def test_ctrl_c_while_the_arguments_are_parsed_is_one_line_too():
    """Parsing imports the subcommand (``--version`` imports TensorRT, seconds on a cold
    disk): Ctrl-C there is the same one line and SIGINT, not a traceback."""
    child = subprocess.run(
        [sys.executable, "-c", _INTERRUPT_WHILE_PARSING],
        capture_output=True,
        text=True,
        env=user_env(),
        preexec_fn=_as_at_a_terminal,
        timeout=60,
        check=False,
    )
    assert (child.returncode, child.stderr, child.stdout) == (
        -signal.SIGINT,
        "trt-kv: interrupted\n",
        "",
    )


def test_ctrl_c_in_process_returns_130_and_keeps_the_caller_running(tiny_model, capsys):
    """``main`` itself returns the code (a caller such as a test keeps its process);
    ``program`` is what ends by SIGINT. A real KeyboardInterrupt, raised by SIGINT sent to
    this process 1 s into the run."""
    import threading

    from trt_kv.cli import INTERRUPTED, main

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGINT reaches the main thread only")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, signal.raise_signal, (signal.SIGINT,))
    try:
        timer.start()
        code = main(_long_run(tiny_model))
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert code == INTERRUPTED == 130
    assert capsys.readouterr().err == "trt-kv: interrupted\n"


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_host_memory_running_out_is_one_line_and_exit_1(tiny_model):
    """A 20,000-token prompt in one step (``--max-step-tokens 20000``; by default it would be
    prefilled in chunks of 128) on the reference: its attention scores are 6 GB,
    past a 2 GB address space (imports and weights need far less). (The interpreter's fast
    plan no longer runs out here: its attention holds one row's scores at a time.)"""
    ids = ",".join(str(1 + i % 50) for i in range(20_000))
    child = _trt_kv(
        "generate", "--model", tiny_model, "--backend", "reference", "--dtype", "float32",
        "--max-batch", 1, "--max-seq-len", 20_008, "--max-new-tokens", 2, "--prompt-ids", ids,
        "--max-step-tokens", 20_000, preexec_fn=_limit_address_space,
    )  # fmt: skip
    try:
        _, err = child.communicate(timeout=300)
    finally:
        child.kill()  # a no-op once it has exited
    assert child.returncode == 1, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("trt-kv: error: the host ran out of memory (Unable to allocate")
    assert lines[0].endswith("; try a smaller --max-seq-len or --max-batch or --max-step-tokens")
