"""Ctrl-C (SIGINT) held back while an engine is built and written: said at once
(``interrupting...`` on stderr), passed on to what can stop early (the TensorRT build's
progress monitor), and raised as KeyboardInterrupt only where nothing is left half done.

Python raises KeyboardInterrupt wherever the main thread is when its handler runs: inside a
TensorRT callback (which TensorRT catches and builds on), inside a destructor (printed as
"Exception ignored", and the command exits 0), or between the engine's rename and its
sidecar's. :func:`held_sigint` replaces that for the block: the signal is recorded,
:meth:`Held.check` raises it at the points the block chooses, and the block's normal end
raises it last. Nested blocks share the outermost one.

:func:`step` names the points of an engine job as they pass (``network built``, ``engine
built``, ``temporaries written``, ``old sidecar removed``, ``engine renamed``, ``sidecar
renamed``); :data:`STEP_OBSERVERS` are called with each name, in the thread of the job (a
test sends SIGINT there, at an exact point, with ``signal.raise_signal``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STEP_OBSERVERS: list[Callable[[str], None]] = []  # called with each step's name
_active: list[Held] = []  # the outermost held_sigint block of the main thread, if any


def step(name: str) -> None:
    """Tell :data:`STEP_OBSERVERS` that the engine job has reached ``name``."""
    for observer in list(STEP_OBSERVERS):
        observer(name)


class Held:
    """The state of a :func:`held_sigint` block: whether Ctrl-C came, and what it cancels."""

    def __init__(self) -> None:
        self.interrupted = False
        self._cancels: list[Callable[[], None]] = []
        self._said = threading.Lock()  # held once "interrupting..." is said: said once

    def cancel_with(self, cancel: Callable[[], None]) -> Callable[[], None]:
        """Call ``cancel`` on Ctrl-C (at once if it came already); returns its removal."""
        self._cancels.append(cancel)
        if self.interrupted:
            cancel()
        return lambda: self._cancels.remove(cancel)

    def interrupt(self) -> None:
        """Record Ctrl-C, say ``interrupting...`` (once) and call the cancels."""
        self.interrupted = True
        for cancel in list(self._cancels):
            cancel()
        if self._said.acquire(blocking=False):
            print("interrupting...", file=sys.stderr, flush=True)

    def check(self) -> None:
        """KeyboardInterrupt if Ctrl-C came: the block's caller chose this point to stop."""
        if self.interrupted:
            raise KeyboardInterrupt("interrupted (Ctrl-C)")


@contextmanager
def held_sigint() -> Iterator[Held]:
    """Hold Ctrl-C during the block (see the module docstring); the block's normal end
    raises KeyboardInterrupt if it came. The handler runs only when the main thread runs
    Python again (TensorRT's next callback may be seconds away), so the signal's wake-up
    byte (``signal.set_wakeup_fd``) is also read by a thread of its own, which says
    ``interrupting...`` and cancels while the build has released the GIL. Elsewhere than
    in the main thread, or inside another block, it only yields (the outer block holds)."""
    if _active or threading.current_thread() is not threading.main_thread():
        yield _active[-1] if _active else Held()
        return
    held = Held()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def watch() -> None:
        while os.read(read_end, 1) == bytes([signal.SIGINT]):
            held.interrupt()

    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.interrupt())
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    watcher = threading.Thread(target=watch, name="trt_kv-interrupt", daemon=True)
    watcher.start()
    _active.append(held)
    try:
        yield held
    finally:
        _active.remove(held)
        os.write(write_end, b"\0")  # ends the watcher (a held signal is recorded already)
        watcher.join()
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, previous)
        os.close(read_end)
        os.close(write_end)
    held.check()
