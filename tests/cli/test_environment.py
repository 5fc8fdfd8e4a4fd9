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


def test_the_wheel_holds_every_package_and_data_file(tmp_path):
    """``pip install tsctl`` (a wheel, not this editable checkout) gets every product package and data
    file: pyproject.toml lists the packages by hand, and a package added by a split (archiver/commands/,
    issue #30) but not listed leaves ``tsctl`` failing on import."""
    import zipfile

    source = tmp_path / "source"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    code = f"from setuptools import build_meta; print(build_meta.build_wheel({str(tmp_path / 'wheel')!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = tmp_path / "wheel" / done.stdout.split()[-1]
    held = set(zipfile.ZipFile(wheel).namelist())
    product = [
        path.relative_to(source).as_posix()
        for wing in ("handlers", "serving", "archiver")
        for path in sorted((source / wing).rglob("*"))
        if path.is_file() and path.name != "README.md" and "__pycache__" not in path.parts
    ]
    assert [name for name in product if name not in held] == []
