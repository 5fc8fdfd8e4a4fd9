"""Progress on long waits: lines on stderr when stdout is a terminal (a pseudo-terminal here), nothing
when it is a pipe. ``package --golden`` reports the load and each golden input; ``export kserve``
each archive whose requirements it resolves for the runtime (uv) and, with --offline, each download.

The archive resolved asks for one small package (six), so resolving and downloading take a second or two;
a package index must be reachable (PyPI, or TSCTL_INDEX_URL), as for every export of an archive with
requirements."""

import os
import pty
import re
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver import mar, properties
from archiver.cli import main
from helpers import archive_reading
from helpers.models import stand_in_torchscript
from helpers.paths import ROOT

PROGRESS = re.compile(r"^\[\s*\d+\.\d s\] (.*)$", re.M)


def run_cli(args, cwd: Path, terminal: bool, timeout: float = 300):
    """``python -m archiver.cli ARGS`` with stdout a pseudo-terminal (``terminal``) or a pipe; stderr to a
    file. (exit code, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "archiver.cli", *[str(arg) for arg in args]]
    with tempfile.TemporaryFile() as err:
        if not terminal:
            done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, timeout=timeout)
            err.seek(0)
            return done.returncode, done.stdout.decode(), err.read().decode()
        master, slave = pty.openpty()
        process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=err)
        os.close(slave)
        chunks, deadline = [], time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([master], [], [], 1)
                if not ready:
                    if process.poll() is not None:
                        break
                    continue
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the process closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            code = process.wait(timeout=max(1, deadline - time.monotonic()))
        finally:
            os.close(master)
            if process.poll() is None:
                process.kill()
        err.seek(0)
        return code, b"".join(chunks).decode(), err.read().decode()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A stand-in image archive asking for six (one small wheel), and its config."""
    root = tmp_path_factory.mktemp("progress")
    stand_in_torchscript(root / "w.pt")
    (root / "requirements.txt").write_text("six>=1.16\n")
    mar.package(
        mar.PackageOptions(
            model_name="img",
            handler="image_classifier",
            serialized_file=str(root / "w.pt"),
            requirements_file=str(root / "requirements.txt"),
            export_path=str(root / "model-store"),
        )
    )
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    return root


def export_args(out: str):
    return ["export", "kserve", out, "--name", "vision", "--storage-uri", "pvc://models/vision", "--offline"]


def test_export_reports_resolving_and_downloading_in_a_terminal_only(store):
    code, out, err = run_cli(export_args("deploy-tty"), store, terminal=True)
    assert code == 0, out + err
    lines = PROGRESS.findall(err)
    assert lines[0] == "resolving and downloading each archive's requirements for torchserve-kfs:0.9.0 ...", err
    assert "img.mar: resolving its requirements for torchserve-kfs:0.9.0 (uv)" in lines, err
    assert "img.mar: downloading 1 wheel for torchserve-kfs:0.9.0 (pip)" in lines, err
    assert err.strip().splitlines() == [line for line in err.strip().splitlines() if PROGRESS.match(line)]
    assert "wrote deploy-tty/DEPLOY.md" in out

    code, out, err = run_cli(export_args("deploy-pipe"), store, terminal=False)
    assert code == 0, out + err
    assert err == "" and "wrote deploy-pipe/DEPLOY.md" in out
    built = store / "deploy-pipe" / "model-store" / "img.mar"
    wheels = [n for n, _ in archive_reading.members(built) if n.startswith("wheels/")]
    assert len(wheels) == 1 and wheels[0].startswith("wheels/six-")


@pytest.fixture(scope="module")
def golden_inputs(jpegs, tmp_path_factory):
    inputs = tmp_path_factory.mktemp("golden")
    (inputs / "a-cat.jpg").write_bytes(jpegs[0])
    (inputs / "b-broken.jpg").write_bytes(b"not a jpeg")
    return inputs


def golden_args(sample: Path, inputs: Path, store: Path):
    return [
        "package",
        "--model-name",
        "resnet18",
        "--serialized-file",
        sample / "resnet18.pt",
        "--model-file",
        sample / "model.py",
        "--handler",
        "image_classifier",
        "--export-path",
        store,
        "--golden",
        inputs,
    ]


def test_package_golden_reports_each_input_in_a_terminal(image_sample, golden_inputs, tmp_path):
    code, out, err = run_cli(golden_args(image_sample, golden_inputs, tmp_path / "store"), tmp_path, terminal=True)
    assert code == 0, out + err
    lines = PROGRESS.findall(err)
    assert lines[0].startswith("golden: loading the archive in-process for 2 inputs"), err
    assert lines[1:] == ["golden: input 1/2 a-cat.jpg", "golden: input 2/2 b-broken.jpg"], err
    assert "golden: 2 answers recorded" in out


def test_package_golden_is_quiet_when_stdout_is_not_a_terminal(image_sample, golden_inputs, tmp_path):
    result = CliRunner().invoke(main, [str(a) for a in golden_args(image_sample, golden_inputs, tmp_path / "store")])
    assert result.exit_code == 0, result.output
    assert result.stderr == "" and "golden: 2 answers recorded" in result.stdout
