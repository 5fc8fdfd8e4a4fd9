"""serve, stop, predict, run, verify and bench as a newcomer meets them (issue #23): every mistake is
one line naming the fix, a handler's failure is one line naming the archive, ``run`` answers as
``predict`` does, and long waits show progress on a terminal only.

One TorchServe for the module, started by ``tsctl serve`` as a user starts it (its stdout a terminal),
on small stand-in models: an image classifier and a tensor model (with golden answers) of a few weights.
Commands that load torch run as whole processes where what a user sees on the terminal (a traceback,
progress lines) is the point; the others through click's runner."""

import os
import pty
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from archiver import golden, mar, properties, server
from archiver.cli import main
from conftest import short_tmp
from test_hostile import Linear, build, scripted

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "batchSize: 4\nmaxBatchDelay: 20\n"
PROGRESS = re.compile(r"^\[\s*\d+\.\d s\] ", re.MULTILINE)  # archiver/output.Progress's lines


def tsctl(*args, tty: bool = False, cwd=None, env=None, timeout: float = 300):
    """``tsctl ARGS`` as its own process, stdout a terminal (a pty) or a pipe: (exit code, stdout, stderr)."""
    command = [sys.executable, "-m", "archiver.cli", *map(str, args)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if not tty:
        done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
        return done.returncode, done.stdout, done.stderr
    master, slave = pty.openpty()
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE, cwd=cwd, env=env
    )
    os.close(slave)
    errors = []
    reader = threading.Thread(target=lambda: errors.append(process.stderr.read()), daemon=True)
    reader.start()
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: every writer of the terminal is gone
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    code = process.wait(timeout=timeout)
    reader.join(timeout)
    return code, out.decode(errors="replace").replace("\r\n", "\n"), errors[0].decode(errors="replace")


def cli(*args):
    """``tsctl ARGS`` through click's runner (stdout and stderr apart)."""
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """model-store/ with image (the image classifier on a few weights) and tensor (4 numbers in, 2 out,
    two golden answers), config/config.properties from tsctl config, and inputs."""
    root = tmp_path_factory.mktemp("serving-cli")
    build(root, "image", "image_classifier", scripted(root / "image.pt", Linear()), CONFIG)
    (root / "store").rename(root / "model-store")
    golden_inputs = root / "golden"
    golden_inputs.mkdir()
    (golden_inputs / "a.json").write_text('{"instances": [[1, 2, 3, 4]]}')
    (golden_inputs / "b.json").write_text("[[0, 0, 1, 1]]")
    (root / "tensor.yaml").write_text(CONFIG)
    options = mar.PackageOptions(
        model_name="tensor",
        handler="tensor",
        serialized_file=str(scripted(root / "tensor.pt", torch.nn.Linear(4, 2))),
        config_file=str(root / "tensor.yaml"),
        export_path=str(root / "model-store"),
        force=True,
    )
    golden.package(options, str(golden_inputs))
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    return root


@pytest.fixture(scope="module")
def served(root):
    """``tsctl serve`` run in ``root`` with its stdout a terminal; its (stdout, stderr) and Server."""
    home = short_tmp("cli-")
    code, out, err = tsctl("serve", "--home", home, tty=True, cwd=root)
    srv = server.read_state(home)
    try:
        assert code == 0, out + err
        yield out, err, srv
    finally:
        if srv is not None:
            server.stop(srv)
        shutil.rmtree(home, ignore_errors=True)


# ---- verify --url and --protocol -----------------------------------------------------------------------
def test_verify_takes_host_and_port_without_a_scheme(root, served):
    _, _, srv = served
    address = srv.inference.split("://", 1)[1]
    result = cli("verify", root / "model-store" / "tensor.mar", "--url", address)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"2 of 2 golden answers match ({srv.inference} (ts))"


def test_a_malformed_url_is_one_line(root):
    archive = root / "model-store" / "tensor.mar"
    for url, said in (
        ("https://127.0.0.1:1", "only plain http://"),
        ("127.0.0.1:port", "has no valid port"),
        ("http://:8080", "names no host"),
        ("http://127.0.0.1:8080/?q=1", "a host, a port and a path only"),
    ):
        result = cli("verify", archive, "--url", url)
        assert result.exit_code == 2, (url, result.output)
        assert result.stdout == "" and said in one_error_line(result.stderr), (url, result.stderr)


def test_a_server_without_the_protocols_endpoint_is_said_so_not_reported_as_drift(root, served):
    """TorchServe's management address has no /predictions/MODEL: every answer a 404 is the server
    speaking another protocol (a KServe server), not '0 of 2 golden answers match'."""
    _, _, srv = served
    result = cli("verify", root / "model-store" / "tensor.mar", "--url", srv.management)
    assert result.exit_code == 1, result.output
    line = one_error_line(result.stderr)
    assert f"{srv.management} has no /predictions/tensor" in line
    assert "is it a KServe server? try --protocol v1 or v2" in line
    assert "golden answers match" not in result.output
    result = cli("verify", root / "model-store" / "tensor.mar", "--url", srv.inference, "--model", "nosuch")
    assert result.exit_code == 1 and "serves no model nosuch" in one_error_line(result.stderr), result.output
