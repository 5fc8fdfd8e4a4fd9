"""README's shell blocks run as written. A block marked ``<!-- readme-test: NAME -->`` is run by bash
(``set -e``), the blocks of one test in order, in a fresh directory standing in for the repository's
root: ``.venv`` links to this one and ``samples`` is importable from it (``python -m samples...``).
So a command that names a missing file, a flag that changed or an output the next line needs fails
here, not on a newcomer's first try. What needs a cluster (KServe, Seldon) is not marked."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKED = re.compile(r"<!-- readme-test: ([\w-]+) -->\n```sh\n(.*?)```", re.S)


def blocks() -> dict:
    return {name: text for name, text in MARKED.findall((ROOT / "README.md").read_text())}


def run_blocks(tmp_path: Path, *names: str, timeout: int = 600) -> str:
    """Run README's blocks NAMES in order in ``tmp_path`` (a stand-in repository root); stop every
    server they started, whatever happened."""
    found = blocks()
    script = "set -euo pipefail\n" + "".join(found[name] for name in names)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    # as a reader who ran `source .venv/bin/activate` once, as The flow's first block says
    path = os.pathsep.join([str(tmp_path / ".venv" / "bin"), os.environ["PATH"]])
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        for home in tmp_path.rglob(".tsctl"):  # stopped by the test that started it, by its own state
            subprocess.run(
                [sys.executable, "-m", "archiver.cli", "stop", "--home", str(home)],
                cwd=ROOT,
                capture_output=True,
                timeout=120,
            )
    assert done.returncode == 0, f"README blocks {names} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_marked_block_is_run_by_a_test():
    assert set(blocks()) == {"flow", "golden", "own-handler"}


def test_the_flow_and_golden_answers_run_as_written(tmp_path):
    out = run_blocks(tmp_path, "flow", "golden")
    assert re.search(r"kitten\.jpg: 200 ", out), out
    assert "2 of 2 golden answers match (in-process" in out, out
    assert re.search(r"2 of 2 golden answers match \(http://127\.0\.0\.1:\d+", out), out


@pytest.mark.timeout(900)
def test_writing_your_own_handler_runs_as_written(tmp_path):
    out = run_blocks(tmp_path, "own-handler")
    assert re.search(r"passed", out), out
    assert re.search(r"text\.txt: 200 .*(negative|neutral|positive)", out), out
