"""The TensorRT build bar (``trt_kv.progress.build_monitor``) on a real TensorRT-RTX build of
the documentation example, its output captured: it ends at N/N with the last phase named,
and draws on a clock, not per callback (the build sends ~90 of them). The tests of a bar alone
drive its clock and its ticks by hand (``clock=``, ``tick_seconds=None``): no test sleeps."""

import re
import threading

import pytest

from trt_kv import progress
from trt_kv.builder import build_engine
from trt_kv.builder.doc_example import doc_example_network


@pytest.fixture
def bars_on():
    progress.set_enabled(True)
    yield
    progress.set_enabled(None)


def draws(text):
    """Every state the bar was drawn in: ``(n, total, elapsed, phase)``."""
    found = re.findall(r"(\d+)/(\d+) phases \[(\d\d:\d\d)(?:, ([^\]]*))?\]", text)
    return [(int(n), int(total), elapsed, phase) for n, total, elapsed, phase in found]


def test_a_real_build_ends_at_n_of_n_naming_its_phase_without_a_redraw_storm(bars_on, capsys):
    builder, network, profiles = doc_example_network()
    built = build_engine(builder, network, profiles)
    shown = draws(capsys.readouterr().err)
    n, total, _, phase = shown[-1]
    assert total >= 2 and n == total and phase == "Building engine"
    # one draw when the bar is made, one per tick, one at the end
    assert len(shown) <= 3 + built.build_seconds / progress.TICK_SECONDS


class Clock:
    """A clock that moves only when a test moves it (seconds)."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_elapsed_time_moves_and_the_current_phase_shows_while_tensorrt_is_silent(bars_on, capsys):
    clock = Clock()
    shown = progress.BuildBar("TensorRT build", clock=clock, tick_seconds=None)
    shown.phase_start("Building engine", None, 6)
    shown.phase_start("Computing profile costs", "Building engine", 5)
    shown.phase_start("Determining refit engines", "Computing profile costs", 1)
    shown.step_complete("Building engine", 3)
    capsys.readouterr()
    for _ in range(4):  # 2 s without a callback, as TensorRT-RTX for ~9 s twice in a build
        clock.now += progress.TICK_SECONDS
        shown.tick()
    silent = draws(capsys.readouterr().err)
    shown.phase_finish("Determining refit engines")
    clock.now += progress.TICK_SECONDS
    shown.tick()
    shown.close()
    after = draws(capsys.readouterr().err)
    assert silent == [
        (4, 6, "00:00", "Determining refit engines"),
        (4, 6, "00:01", "Determining refit engines"),
        (4, 6, "00:01", "Determining refit engines"),
        (4, 6, "00:02", "Determining refit engines"),
    ]  # one draw per tick
    assert after[-1][1:2] == (6,) and after[-1][3] == "Computing profile costs"


def test_the_ticker_thread_draws_without_callbacks_until_the_bar_closes(bars_on):
    ticked = threading.Event()

    class Watched(progress.BuildBar):
        def tick(self):
            super().tick()
            ticked.set()

    shown = Watched("TensorRT build", tick_seconds=0.01)
    assert ticked.wait(timeout=10)  # a draw came with no callback at all
    shown.close()
    assert not shown._ticker.is_alive()


def test_a_cancelled_build_shows_the_count_and_phase_it_stopped_at(bars_on, capsys):
    """Before: the top phase's end drew 6/6 and "Building engine", as if it had finished."""
    shown = progress.BuildBar("TensorRT build")
    shown.phase_start("Building engine", None, 6)
    shown.step_complete("Building engine", 2)  # 3/6
    shown.phase_start("Computing profile costs", "Building engine", 5)
    shown.cancel()  # Ctrl-C
    assert shown.step_complete("Computing profile costs", 0) is False  # TensorRT stops here
    shown.phase_finish("Computing profile costs")
    shown.phase_finish("Building engine")
    shown.close()
    n, total, _, phase = draws(capsys.readouterr().err)[-1]
    assert (n, total, phase) == (3, 6, "stopped in Computing profile costs")
