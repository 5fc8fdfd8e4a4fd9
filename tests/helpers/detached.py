"""A program of someone else's (nginx, Prometheus) run for a test: started in a session of its own with its
output in a log under its directory, waited for until a URL answers 200, stopped by its own process group
(SIGTERM, then SIGKILL), its directory removed."""

import os
import shutil
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from archiver.server import request
from helpers import waiting


@contextmanager
def detached(argv: Sequence[str], root: Path, ready_url: str, what: str, log_name: str, timeout: float):
    """Run ``argv``; yields once ``ready_url`` answers 200. ``log_name`` (under ``root``) is shown when it
    does not start within ``timeout`` seconds."""
    log = (root / "output.log").open("wb")
    process = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:  # as long as it makes progress (helpers/waiting.py)
        waiting.until(
            lambda: request(ready_url, timeout=2)[0],
            lambda status: status == 200,
            f"{what} did not start",
            root / log_name,
            lambda: process.poll() is None,
            timeout,
            every=0.1,
        )
        yield
    finally:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        log.close()
        shutil.rmtree(root, ignore_errors=True)
