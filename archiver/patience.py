"""How long tsctl waits for a server it started to become ready: until nothing has moved for the timeout.

A server on a busy machine, or loading a large model, can take long to be ready while it works: its models
change state (unpacking, loading, READY) and its logs grow as workers start. A wall-clock deadline fails
such a start for being slow. ``Patience`` ends a wait only when the server has shown no sign of progress
for ``timeout`` seconds: a hang, not slowness. A server that exits is not this module's business: every
wait checks that first and fails at once with the log's cause.

What counts as progress is what the server's models and workers do, never what the wait itself causes: the
logs watched are the workers' output (TorchServe's ``model_log.log``), not a log that records each request
(TorchServe's ``ts_log.log`` logs every poll of its management API, and a failing ``nvidia-smi`` with it).
Hangs stay bounded: a worker that never finishes loading prints nothing and changes no state; one that
prints without end is given at most ``CAP`` times the timeout in all.
"""

import os
import time
from pathlib import Path
from typing import Hashable, Iterable, Optional, Tuple


def size_of(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


CAP = 10  # a wait ends after this many timeouts in all, whatever moved


class Patience:
    """``note(signs)`` at each poll with what the server shows (its models' states); the watched logs'
    sizes are read there too. ``expired()`` once nothing of that changed for ``timeout`` seconds, or
    ``CAP`` timeouts after the start."""

    def __init__(self, timeout: float, watched: Iterable[Path] = ()):
        self.timeout = timeout
        self.watched = list(watched)
        self.started = self.last = time.monotonic()
        self.seen: Optional[Tuple[Hashable, Tuple[int, ...]]] = None

    def note(self, signs: Hashable = None):
        now = (signs, tuple(size_of(path) for path in self.watched))
        if now != self.seen:
            self.seen, self.last = now, time.monotonic()

    def expired(self) -> bool:
        now = time.monotonic()
        return now - self.last > self.timeout or now - self.started > CAP * self.timeout

    def said(self) -> str:
        """How the wait ended, for the message: "no progress for 180s" (or "not ready in 1800s")."""
        now = time.monotonic()
        if now - self.last > self.timeout:
            return f"no progress for {self.timeout:.0f}s"
        return f"not ready in {now - self.started:.0f}s ({CAP} x the {self.timeout:.0f}s timeout)"
