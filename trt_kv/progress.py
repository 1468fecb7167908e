"""Progress bars (tqdm, on stderr) for the long steps: weight loading, network construction,
the TensorRT build (through TensorRT's ``IProgressMonitor``) and decode.

Bars show only when stderr is a terminal; :func:`set_enabled` turns them off (``trt-kv
--quiet``) or forces them on. Disabled bars cost nothing but a no-op call per update, so
library code reports progress unconditionally.
"""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
BUILD_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n}/{total} phases [{elapsed}{postfix}]"
TICK_SECONDS = 0.5  # a build bar's redraw period (its elapsed time moves on its own)
_enabled: bool | None = None  # None: when stderr is a terminal


def set_enabled(on: bool | None) -> None:
    """True: always show bars; False: never; None: when stderr is a terminal."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    """Whether bars show now."""
    if _enabled is None:
        return sys.stderr.isatty()
    return _enabled


def bar(total: int | None, desc: str, unit: str = "it", **tqdm_args: object) -> object:
    """A ``tqdm`` bar on stderr that disappears when done (a no-op bar when disabled)."""
    from tqdm import tqdm

    # The terminal's size, or 80 x 24 where it reports none (tqdm would then draw nothing).
    columns, lines = shutil.get_terminal_size()
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        leave=False,
        disable=not enabled(),
        file=sys.stderr,
        ncols=columns,
        nrows=lines,
        **tqdm_args,
    )


def track(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it") -> Iterator[T]:
    """``items`` unchanged, advancing a bar per item (``total`` defaults to ``len(items)``)."""
    if not enabled():
        yield from items
        return
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    with bar(total, desc, unit) as b:
        for item in items:
            yield item
            b.update(1)


def build_monitor(desc: str = "TensorRT build") -> object:
    """An ``IProgressMonitor`` showing the builder's top-level phase as ``n/N phases``, the
    phase it is in now (the innermost open one) and the time elapsed (a no-op bar when bars
    are off: the monitor is what Ctrl-C cancels the build through, :meth:`BuildBar.cancel`).
    Close it with ``close()`` after the build."""
    from trt_kv._trt import trt

    class _Monitor(BuildBar, trt.IProgressMonitor):  # BuildBar first: its callbacks win
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            BuildBar.__init__(self, desc)

    return _Monitor()


class BuildBar:
    """The bar of a TensorRT build, driven by ``IProgressMonitor``'s three callbacks
    (thread-safe: TensorRT may call them from its own threads).

    Callbacks only record; a ticker thread draws every :data:`TICK_SECONDS` (so the elapsed
    time moves while TensorRT sends nothing, ~9 s twice in a default-model build, and a build
    that opens hundreds of sub-phases draws at most ``1 / TICK_SECONDS`` times a second). The
    top-level phase's end shows ``N/N`` (TensorRT-RTX 1.7.1 completes only ``N - 1`` of its
    steps), drawn before the bar goes; a cancelled build's shows where it stopped instead:
    the count it reached and ``stopped in PHASE``, the phase open when TensorRT asked.

    Two hooks, for tests that drive the bar without waiting: ``clock`` (seconds, any origin)
    is what the elapsed time is read from (``None``: tqdm's own, ``time.time``), and
    ``tick_seconds=None`` starts no ticker thread, so the caller draws with :meth:`tick`.
    """

    def __init__(
        self,
        desc: str,
        *,
        clock: Callable[[], float] | None = None,
        tick_seconds: float | None = TICK_SECONDS,
    ) -> None:
        self._lock = threading.Lock()
        self._top: str | None = None
        self._open: list[str] = []  # phases started and not finished, oldest first
        self._shown: str | None = None
        self._stopped_in: str | None = None  # the phase open when the cancel was seen
        self.cancelled = False
        self.bar = bar(None, desc, bar_format=BUILD_FORMAT)
        if clock is not None:  # tqdm reads its time from the bar's ``_time`` (tqdm 4.x)
            self.bar._time = clock
            self.bar.start_t = self.bar.last_print_t = clock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if tick_seconds is not None:
            self._ticker = threading.Thread(
                target=self._tick_every, args=(tick_seconds,), name="build-progress", daemon=True
            )
            self._ticker.start()

    def _tick_every(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            self.tick()

    def tick(self) -> None:
        """Draw once, as the ticker thread does every ``tick_seconds``."""
        with self._lock:
            self._draw()

    def _draw(self) -> None:
        """Redraw (the lock held): counts, the current phase, the elapsed time."""
        phase = self._open[-1][:40] if self._open else ""
        if self._stopped_in is not None:
            phase = f"stopped in {self._stopped_in[:40]}"
        if phase != self._shown:
            self.bar.set_postfix_str(phase, refresh=False)
            self._shown = phase
        self.bar.refresh()

    def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
        with self._lock:
            if parent is None and self._top is None:
                self._top = phase
                self.bar.reset(total=steps)
            self._open.append(phase)

    def step_complete(self, phase: str, step: int) -> bool:
        with self._lock:
            if self.cancelled:  # False cancels the build: it stops here
                if self._stopped_in is None:
                    self._stopped_in = self._open[-1] if self._open else phase
                return False
            if phase == self._top and self.bar.total:
                self.bar.n = min(step + 1, self.bar.total)
        return True

    def cancel(self) -> None:
        """Stop the build at TensorRT's next step (it may take seconds to come)."""
        self.cancelled = True

    def phase_finish(self, phase: str) -> None:
        with self._lock:
            if phase in self._open:
                del self._open[len(self._open) - 1 - self._open[::-1].index(phase)]
            if phase == self._top:  # done: N/N and the phase that ended, or where it stopped
                if self._stopped_in is None:
                    self.bar.n = self.bar.total or self.bar.n
                self._open = [phase]
                self._draw()

    def close(self) -> None:
        """Stop the ticker and remove the bar (after the build, however it ended)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            self.bar.close()
