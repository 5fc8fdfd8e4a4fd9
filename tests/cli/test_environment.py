"""The environment is reproducible: ``make`` installs exactly uv.lock (``uv sync --locked``), so the lock
must be what pyproject.toml asks for, and this environment must be the lock's."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UV = [sys.executable, "-m", "uv"]


def uv(*args):
    return subprocess.run([*UV, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_lock_is_what_pyproject_asks_for():
    done = uv("lock", "--check")
    assert done.returncode == 0, "pyproject.toml and uv.lock disagree; run `uv lock` and commit both:\n" + done.stderr


def test_this_environment_is_the_locks():
    """What `uv sync --locked` would change here: nothing (a test run on other versions than BENCHMARKS'
    and CI's proves little). Packages beside it (the bench extra) may stay."""
    done = uv("sync", "--locked", "--dry-run", "--inexact", "--extra", "test")
    assert done.returncode == 0, done.stderr
    changes = [line for line in done.stderr.splitlines() if line.lstrip().startswith(("+ ", "- "))]
    assert not [line for line in changes if "tsctl" not in line], done.stderr
