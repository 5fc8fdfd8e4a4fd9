"""Waiting for a server a test started: as long as it makes progress, and not a moment once it died.

A wall-clock deadline fails a slow start on a busy machine (a second copy of the suite running, workers
importing torch at a tenth of their speed). ``until`` gives up only when the server has shown nothing new
for ``timeout`` seconds (the product's ``archiver.patience.Patience``: neither what ``poll`` reads nor the
size of its output changed), and fails at once, with the end of its output, when the process has exited."""

import time
from pathlib import Path
from typing import Callable, Hashable, Optional

from archiver.patience import Patience


def until(
    poll: Callable[[], Hashable],
    ready: Callable[[Hashable], bool],
    what: str,
    output: Optional[Path] = None,
    alive: Callable[[], bool] = lambda: True,
    timeout: float = 120,
    every: float = 0.3,
):
    """Call ``poll()`` (what the server shows: its workers' states; an OSError counts as None) every
    ``every`` seconds until ``ready(shown)``, and return that. ``what`` names the wait in the failure."""
    patience = Patience(timeout, [output] if output else [])
    while True:
        if not alive():
            raise AssertionError(f"{what}: the server exited: {tail(output)}")
        try:
            shown = poll()
        except OSError:
            shown = None
        if ready(shown):
            return shown
        patience.note(repr(shown))
        if patience.expired():
            raise AssertionError(f"{what}: {patience.said()}, last seen {shown!r}: {tail(output)}")
        time.sleep(every)


def tail(output: Optional[Path], size: int = 3000) -> str:
    if output is None:
        return "(no output)"
    try:
        return output.read_text(errors="replace")[-size:]
    except OSError as exc:
        return f"(its output {output}: {exc.strerror})"
