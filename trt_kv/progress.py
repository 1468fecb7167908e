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
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
BUILD_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n}/{total} phases [{elapsed}{postfix}]"
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


def build_monitor(desc: str = "TensorRT build") -> object | None:
    """An ``IProgressMonitor`` that drives a bar over the builder's top-level phase and names
    the phase it is in; None when bars are off (the builder then reports nothing)."""
    if not enabled():
        return None
    from trt_kv._trt import trt

    class _Monitor(trt.IProgressMonitor):
        """Thread-safe: TensorRT may call it from its own threads."""

        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._lock = threading.Lock()
            self._top: str | None = None
            self.bar = bar(None, desc, bar_format=BUILD_FORMAT)

        def phase_start(self, phase: str, parent: str | None, steps: int) -> None:
            with self._lock:
                if parent is None and self._top is None:
                    self._top = phase
                    self.bar.reset(total=steps)
                self.bar.set_postfix_str(phase[:32], refresh=True)

        def step_complete(self, phase: str, step: int) -> bool:
            with self._lock:
                if phase == self._top:
                    self.bar.update(1)
            return True  # False would cancel the build

        def phase_finish(self, phase: str) -> None:
            with self._lock:
                if phase == self._top:
                    self.bar.close()

    return _Monitor()
