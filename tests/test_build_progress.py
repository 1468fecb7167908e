"""The TensorRT build bar (``trt_kv.progress.build_monitor``) on a real TensorRT-RTX build of
the documentation example, its output captured: it ends at N/N with the last phase named,
and draws on a clock, not per callback (the build sends ~90 of them)."""

import re
import time

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


def test_elapsed_time_moves_and_the_current_phase_shows_while_tensorrt_is_silent(bars_on, capsys):
    shown = progress.BuildBar("TensorRT build")
    shown.phase_start("Building engine", None, 6)
    shown.phase_start("Computing profile costs", "Building engine", 5)
    shown.phase_start("Determining refit engines", "Computing profile costs", 1)
    shown.step_complete("Building engine", 3)
    time.sleep(2.2)  # no callback, as TensorRT-RTX for ~9 s twice in a default-model build
    silent = draws(capsys.readouterr().err)
    shown.phase_finish("Determining refit engines")
    time.sleep(0.7)
    shown.close()
    after = draws(capsys.readouterr().err)
    assert (4, 6, "00:02", "Determining refit engines") in silent
    assert 3 <= len(silent) <= 6  # ~ one draw per tick
    assert after[-1][1:2] == (6,) and after[-1][3] == "Computing profile costs"


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
