"""A command run as a user runs it, a whole process, and what it left running when it ended."""

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from helpers.paths import ROOT


def session_members(sid: int) -> List[int]:
    """The live processes (zombies aside) whose session is ``sid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        state, _ppid, _pgrp, session = stat.rpartition(")")[2].split()[:4]
        if int(session) == sid and state != "Z":
            found.append(int(entry.name))
    return found


@dataclass
class Finished:
    code: Optional[int]  # None: still running after the timeout (then killed)
    stdout: str
    stderr: str
    seconds: float
    left: List[int] = field(default_factory=list)  # processes of its session alive once it had ended


def run_alone(command: List[str], cwd=None, timeout: float = 180, grace: float = 5, env=None) -> Finished:
    """``command`` in a session of its own (stdin closed, PYTHONPATH the repository): its exit code,
    stdout, stderr and seconds, and the processes of its session still alive ``grace`` s after it
    ended, each then killed (by its id: they are the command's). After ``timeout`` s the command and
    its whole session are killed and its code is None."""
    started = time.monotonic()
    process = subprocess.Popen(
        [str(part) for part in command],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        kill(session_members(process.pid))
        out, err = process.communicate()
        code = None
    seconds = time.monotonic() - started
    deadline = time.monotonic() + grace
    while session_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = session_members(process.pid)
    kill(left)
    return Finished(code, out, err, seconds, left)


def kill(pids: List[int]):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def tsctl(*args, cwd, timeout: float = 300):
    """``tsctl ARGS`` as its own process, in ``cwd``: (exit code, stdout, stderr)."""
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "archiver.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )
    return done.returncode, done.stdout, done.stderr
