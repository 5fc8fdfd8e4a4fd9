"""An outsider's attacks on what the CLI takes from its user and from an archive: ``--content-type``
(predict, run, package --golden-content-type) and a golden file's recorded content types, and the
``metrics_config`` path. Nothing served: each attack is refused at the option, or at reading, as a
UserError or click's usage error, never a traceback nor a hang. About 3 s."""

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver.cli import main
from handlers import golden as golden_format

ROOT = Path(__file__).resolve().parents[2]
HOSTILE_TYPES = {
    "crlf": "text/plain; charset=utf-8\r\nX-Injected: 1",
    "lf": "text/plain;\nX-Injected: 1",
    "nul": "text/plain; charset=\x00",
    "unicode": "text/plain; charset=\u20ac",
    "long": "text/plain; p=" + "a" * 100_000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TYPES))
def test_a_content_type_no_header_can_carry_is_refused(name, tmp_path):
    """Before: only the part before ';' was checked, so predict against TorchServe or the engine ended in
    http.client's ValueError / UnicodeEncodeError (or a broken pipe for a long one) as a traceback, and
    run handed the handler a Content-Type no server could have received (then recorded by --golden)."""
    data = tmp_path / "row.txt"
    data.write_bytes(b"abc")
    for command in (
        ["predict", "m", str(data)],
        ["run", str(tmp_path / "m.mar"), str(data)],
        ["package", "--golden", str(tmp_path)],
    ):
        flag = "--golden-content-type" if command[0] == "package" else "--content-type"
        refused = CliRunner().invoke(main, [*command, flag, HOSTILE_TYPES[name]])
        assert refused.exit_code == 2 and "is not a media type" in refused.output, (command, refused.output[-300:])


@pytest.mark.parametrize("kind", ["text/plain; charset=utf-8", 'application/json; charset="utf-8"', ""])
def test_ordinary_content_types_are_taken(kind):
    from archiver.commands.options import media_type

    assert media_type(None, None, kind) == kind


def test_a_golden_case_whose_type_no_header_can_carry_is_refused(tmp_path):
    """A hostile archive's golden file: its recorded type is sent by verify --served as a header."""
    case = {
        "name": "a.txt",
        "content_type": HOSTILE_TYPES["crlf"],
        "body_b64": base64.b64encode(b"a").decode(),
        "status": 200,
    }
    assert golden_format.case_problem(case) is not None
    assert golden_format.case_problem({**case, "content_type": "text/plain; charset=utf-8"}) is None
    assert golden_format.case_problem({**case, "content_type": ""}) is None


def read_metrics_yaml(path: Path, cwd: Path) -> subprocess.CompletedProcess:
    """properties.metrics_yaml(path) in a process of its own (a hang is its timeout, not this test's)."""
    code = (
        "from archiver.properties import metrics_yaml; from archiver.errors import UserError\n"
        "try:\n    print(metrics_yaml(%r, 'metrics_config'))\n"
        "except UserError as exc:\n    print('refused', exc)"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", code % str(path)], cwd=cwd, env=env, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("what", ["fifo", "device", "huge", "directory"])
def test_a_metrics_config_that_is_no_regular_file_is_refused_at_once(what, tmp_path):
    """Before: a FIFO with no writer hung tsctl serve/run/verify before anything started (read_text blocks),
    /dev/zero was read until memory ran out, an 8 MiB file of comments was read whole and parsed."""
    path = tmp_path / "metrics.yaml"
    if what == "fifo":
        os.mkfifo(path)
    elif what == "device":
        path = Path("/dev/zero")
    elif what == "huge":
        path.write_text("model_metrics: {}\n" + ("#" * 99 + "\n") * ((8 << 20) // 100))
    else:
        path.mkdir()
    try:
        done = read_metrics_yaml(path, tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"metrics_yaml({what}) hung")
    assert done.returncode == 0 and done.stdout.startswith("refused metrics_config"), (done.stdout, done.stderr[-500:])


def test_a_relative_metrics_config_through_a_symlink_and_dotdot(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "m.yaml").write_text("model_metrics: {}\n")
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "link.yaml").symlink_to(tmp_path / "real" / "m.yaml")
    for given in ("../real/m.yaml", "link.yaml"):
        done = read_metrics_yaml(Path(given), tmp_path / "here")
        assert done.stdout.strip() == str(tmp_path / "real" / "m.yaml"), (given, done.stdout, done.stderr[-300:])


ECHO = 'def handle(data, context):\n    return [b"ok" for _ in data] if data else None\n'


@pytest.mark.parametrize("what", ["fifo", "not yaml"])
def test_the_engine_refuses_a_metrics_config_it_cannot_read_at_once(what, tmp_path):
    """``python -m serving.engine`` as a container starts it (no tsctl to check first, or the file swapped
    after tsctl's check): before, a FIFO hung the engine before it listened, and a file that is not YAML
    ended it in a traceback. Under 1 s each (refused before torch is imported)."""
    from helpers.engine import BIN, free_port

    (tmp_path / "echo.py").write_text(ECHO)
    (tmp_path / "store").mkdir()
    subprocess.run(
        [
            str(BIN / "torch-model-archiver"),
            "--model-name",
            "echo",
            "--version",
            "1.0",
            "--handler",
            str(tmp_path / "echo.py"),
            "--export-path",
            str(tmp_path / "store"),
        ],
        check=True,
        capture_output=True,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
    )
    path = tmp_path / "metrics.yaml"
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("ts_metrics: [1\n")
    command = [
        sys.executable,
        "-m",
        "serving.engine",
        "--model_store",
        str(tmp_path / "store"),
        "--metrics_config",
        str(path),
        "--host",
        "127.0.0.1",
        "--http_port",
        str(free_port()),
        "--grpc_port",
        str(free_port()),
    ]
    engine = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = engine.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(engine.pid, 9)
        engine.wait()
        pytest.fail(f"the engine hung on a {what} metrics_config")
    assert engine.returncode == 2 and "Traceback" not in out and f"metrics_config {path}" in out, out[-2000:]
