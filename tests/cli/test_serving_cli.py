"""serve, stop, predict, run, verify and bench as a newcomer meets them (issue #23): every mistake is
one line naming the fix, a handler's failure is one line naming the archive, ``run`` answers as
``predict`` does, and long waits show progress on a terminal only.

One TorchServe for the module, started by ``tsctl serve`` as a user starts it (its stdout a terminal),
on small stand-in models: an image classifier and a tensor model (with golden answers) of a few weights.
Commands that load torch run as whole processes where what a user sees on the terminal (a traceback,
progress lines) is the point; the others through click's runner."""

import base64
import json
import os
import pty
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner

from archiver import mar, properties, server
from archiver.cli import main
from helpers.hostile import Linear, assert_close, build, scripted
from helpers.paths import short_tmp
from samples.image_model import sample_jpeg

ROOT = Path(__file__).resolve().parents[2]
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
    golden_inputs = root / "golden"
    golden_inputs.mkdir()
    (golden_inputs / "a.json").write_text('{"instances": [[1, 2, 3, 4]]}')
    (golden_inputs / "b.json").write_text("[[0, 0, 1, 1]]")
    build(root, "tensor", "tensor", scripted(root / "tensor.pt", torch.nn.Linear(4, 2)), CONFIG, golden_inputs)
    (root / "store").rename(root / "model-store")
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
        ("57397", "names no host"),  # a port alone: was sent to a host named 57397
        ("http://127.0.0.1:8080/predictions/tensor", "give the server's base URL, e.g. http://127.0.0.1:8080"),
        ("127.0.0.1:8080/v2/models/tensor/infer", "names an endpoint (/v2/models/...)"),
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


# ---- run: a handler's failure, and the same answers as predict -------------------------------------------
FAILING = """
def handle(data, context):
    if data is None:
        return None
    raise ValueError("no answer for you")
"""

FAILING_POSTPROCESS = """
from handlers.base import entry_point
from handlers.image import ImageClassifier


class Failing(ImageClassifier):
    def postprocess(self, output, inputs):
        raise KeyError("postprocess exploded")


handle = entry_point(Failing)
"""


@pytest.fixture(scope="module")
def failing(root):
    """Two archives whose handler fails on every request: one of one's own (handle raises: TorchServe
    answers the batch 503 'Prediction failed') and a toolkit subclass (postprocess raises: the toolkit
    answers that request 500 and logs the traceback); and a JPEG to send them."""
    archives = {}
    for name, code in (("failing", FAILING), ("failing_post", FAILING_POSTPROCESS)):
        (root / f"{name}.py").write_text(code)
        options = mar.PackageOptions(
            model_name=name,
            handler=str(root / f"{name}.py"),
            serialized_file=str(root / "image.pt"),
            export_path=str(root / "failing-store"),
        )
        archives[name] = mar.package(options)
    (root / "photo.jpg").write_bytes(sample_jpeg(1, (64, 48)))
    return archives, root / "photo.jpg"


def test_a_handler_failing_during_inference_is_one_line_naming_the_archive(failing, tmp_path):
    """No traceback: the handler's error, where it was raised, the archive and the input, exit 1."""
    archives, image = failing
    code, out, err = tsctl("run", archives["failing"], image, cwd=tmp_path)
    assert code == 1 and out == "", out + err
    assert one_error_line(err) == (
        f"error: {archives['failing']}: the handler failed on {image}: ValueError: no answer for you "
        "(failing.py:5 in handle)"
    )


def answers_of(output: str) -> dict:
    """{path: (status, answer)} from predict's and run's lines, ``PATH: STATUS JSON``."""
    found = {}
    for line in output.splitlines():
        path, status, answer = re.match(r"^(.*?): (\d{3}) (.*)$", line).groups()
        found[Path(path).name] = (int(status), json.loads(answer))
    return found


def test_run_answers_as_predict_does(root, served, tmp_path):
    """A .txt is text/plain for both; a toolkit archive reads it raw on the server tsctl config set up
    (decode_input_request=false), so base64 text of a JPEG is not an image there and must not be one
    in-process either; a real JPEG, a JSON body and a tensor as text answer alike."""
    _, _, srv = served
    jpeg = sample_jpeg(2, (80, 60))
    inputs = {
        "b64.txt": base64.b64encode(jpeg),
        "photo.jpg": jpeg,
        "body.json": b'{"data": "%s"}' % base64.b64encode(jpeg),
    }
    for name, data in inputs.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "row.txt").write_text("[[1, 2, 3, 4]]")
    found = {}
    for model, names in (("image", list(inputs)), ("tensor", ["row.txt"])):
        files = [tmp_path / name for name in names]
        ran = answers_of(cli("run", root / "model-store" / f"{model}.mar", *files).stdout)
        predicted = answers_of(cli("predict", model, *files, "--home", srv.home).stdout)
        assert ran.keys() == predicted.keys() == set(names)
        for name in names:
            (status, answer), (served_status, served_answer) = found[name] = ran[name], predicted[name]
            assert status == served_status, (model, name, ran[name], predicted[name])
            if status == 200:
                assert_close(answer, served_answer)
            else:
                assert answer["message"] == served_answer["message"], (model, name)
    assert [found[name][0][0] for name in ("b64.txt", "photo.jpg", "body.json", "row.txt")] == [400, 200, 200, 200]


# ---- which server, which model -------------------------------------------------------------------------
def test_a_model_not_served_is_one_line_naming_the_served_ones(root, served):
    _, _, srv = served
    photo = root / "model-store" / "image.mar"  # any file: refused before it is sent
    for args in (
        ("predict", "imagee", photo),
        ("bench", "imagee", "--input", photo, "--requests", "1"),
        ("verify", root / "model-store" / "tensor.mar", "--served", "--model", "imagee"),
    ):
        result = cli(*args, "--home", srv.home)
        assert result.exit_code == 2, (args, result.output)
        line = one_error_line(result.stderr)
        assert line == f"error: TorchServe started from {srv.home} serves no model 'imagee': it serves image, tensor"


def test_commands_run_where_no_server_was_started_mention_home(root, tmp_path):
    photo = root / "model-store" / "image.mar"
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path) as elsewhere:
        said = (
            f"no server is running from .tsctl (in {Path(elsewhere).resolve()}): start one with 'tsctl serve', "
            "or pass --home to where it was started"
        )
        for args in (
            ("predict", "image", photo),
            ("bench", "image", "--input", photo, "--requests", "1"),
            ("verify", root / "model-store" / "tensor.mar", "--served"),
        ):
            result = runner.invoke(main, [str(a) for a in args])
            assert result.exit_code == 2 and one_error_line(result.stderr) == f"error: {said}", (args, result.output)
        result = runner.invoke(main, ["stop"])
        assert result.exit_code == 0, result.output
        assert result.stdout.strip() == (
            f"no server is running from .tsctl (in {Path(elsewhere).resolve()}): nothing to stop "
            "(or pass --home to where it was started)"
        )
        # a server that was killed: its server.json is left, its process gone
        exited = subprocess.Popen(["true"])
        exited.wait()
        Path(".tsctl").mkdir()
        dead = server.Server(exited.pid, str(Path(".tsctl").resolve()), "http://127.0.0.1:1", "", "", ["image"])
        server.write_state(dead)
        result = runner.invoke(main, ["predict", "image", str(photo)])
        assert result.exit_code == 2 and one_error_line(result.stderr) == (
            f"error: the server started from .tsctl (in {Path(elsewhere).resolve()}) (pid {exited.pid}) is no longer "
            "running: start it again with 'tsctl serve'"
        ), result.output
        Path(".tsctl/server.json").write_text("{not json")
        for args in (["stop"], ["predict", "image", str(photo)]):
            result = runner.invoke(main, args)
            assert result.exit_code == 2 and one_error_line(result.stderr) == (
                f"error: {Path('.tsctl/server.json').resolve()} is not a server record tsctl wrote: remove it, or "
                "pass --home to where the server was started"
            ), result.output
        # --home given the project, one level above the state directory that records the server
        server.write_state(dead)
        for args in (["stop"], ["predict", "image", str(photo)]):
            result = runner.invoke(main, [*args, "--home", "."])
            assert ".tsctl records one: pass --home .tsctl" in result.output, result.output


# ---- serve --engine tsctl without the kserve extra -----------------------------------------------------
BLOCKER = """
import sys


class Blocker:  # this Python has no kserve (nor kserve's fastapi), as without 'pip install tsctl[kserve]'
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"fastapi", "kserve"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Blocker())
"""


def test_serve_engine_tsctl_without_the_kserve_extra_says_what_to_install(root, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    home = short_tmp("nokserve-")
    try:
        code, out, err = tsctl(
            "serve", "--engine", "tsctl", "--home", home, cwd=root, env={"PYTHONPATH": f"{tmp_path}:{ROOT}"}
        )
        assert code == 2, out + err
        assert one_error_line(err) == (
            "error: the tsctl engine needs the kserve extra (its Python has no module 'kserve'): "
            "pip install 'tsctl[kserve]' (or uv sync --extra kserve)"
        )
        assert server.read_state(home) is None  # what it started was stopped
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_engine_kserve_is_an_alias_of_tsctl_said_once_on_stderr(root, tmp_path):
    """``--engine kserve``, the tsctl engine's older name, does what ``--engine tsctl`` does: the same exit
    code and the same one JSON document on stdout (--json stays clean), and on stderr the same lines after
    one note naming the alias."""
    home = short_tmp("alias-")
    answers = {}
    for engine in ("tsctl", "kserve"):
        args = ("serve", "--engine", engine, "--model-store", tmp_path / "nowhere", "--home", home, "--json")
        answers[engine] = tsctl(*args, cwd=root)
    (code, out, err), (alias_code, alias_out, alias_err) = answers["tsctl"], answers["kserve"]
    assert code == alias_code == 2 and out == alias_out, answers
    assert "nowhere does not exist" in json.loads(out)["error"]["message"], out
    assert alias_err.splitlines() == ["note: --engine kserve is an alias of --engine tsctl"] + err.splitlines()
    assert server.read_state(home) is None


# ---- progress: on a terminal, never in a pipe -----------------------------------------------------------
def progress_lines(stderr: str) -> list:
    lines = stderr.splitlines()
    assert all(PROGRESS.match(line) for line in lines), stderr  # nothing but progress (no traceback, no log)
    return [PROGRESS.sub("", line) for line in lines]


def test_serve_shows_each_models_progress_on_a_terminal(served):
    out, err, srv = served
    assert out.startswith(f"TorchServe ready (pid {srv.pid}): image, tensor\n"), out
    shown = progress_lines(err)
    assert shown[-2:] in (["image: READY", "tensor: READY"], ["tensor: READY", "image: READY"]), shown
    for model in ("image", "tensor"):
        states = [line.split(": ", 1)[1] for line in shown if line.startswith(f"{model}: ")]
        assert states[-1] == "READY" and len(states) == len(set(states)), shown  # each change once


def test_serve_in_a_pipe_prints_no_progress(root, tmp_path):
    home = short_tmp("pipe-")
    (tmp_path / "model-store").mkdir()
    shutil.copy(root / "model-store" / "tensor.mar", tmp_path / "model-store")  # one model: one worker
    try:
        code, out, err = tsctl("serve", "--engine", "tsctl", "--home", home, cwd=tmp_path)
        assert code == 0 and err == "", out + err
        assert out.startswith("tsctl engine ready (pid "), out
    finally:
        srv = server.read_state(home)
        if srv is not None:
            server.stop(srv)
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.matrix  # 16 s; make test: test_serve_in_a_pipe_prints_no_progress, bench on a terminal
def test_run_and_verify_show_progress_per_input_on_a_terminal_only(root, served, failing):
    """run of a toolkit handler whose postprocess fails: the request's 500 printed as predict prints it,
    the handler's logged traceback nowhere; progress lines on a terminal, nothing on stderr in a pipe."""
    _, _, srv = served
    archives, image = failing
    code, out, err = tsctl("run", archives["failing_post"], image, tty=True, cwd=root)
    assert code == 1 and out.startswith(f"{image}: 500 ") and "KeyError: 'postprocess exploded'" in out, out + err
    assert progress_lines(err) == ["loading failing_post.mar", f"1/1 {image}: 500"]
    piped = cli("run", archives["failing_post"], image)  # click's runner: stdout is no terminal
    assert (piped.exit_code, piped.stdout, piped.stderr) == (1, out, "")
    archive = root / "model-store" / "tensor.mar"
    code, out, err = tsctl("verify", archive, "--served", "--home", srv.home, tty=True)
    assert code == 0 and progress_lines(err) == ["1/2 a.json: 200", "2/2 b.json: 200"], out + err
    assert tsctl("verify", archive, "--served", "--home", srv.home) == (0, out, "")


def test_every_option_of_these_commands_says_what_it_does():
    for name in ("serve", "stop", "predict", "run", "verify", "bench"):
        command = main.commands[name]
        undocumented = [p.opts[0] for p in command.params if isinstance(p, click.Option) and not (p.help or "").strip()]
        assert not undocumented, (name, undocumented)
        shown = cli(name, "--help").stdout
        for option in command.params:
            if isinstance(option, click.Option):
                assert option.opts[-1] in shown, (name, option.opts)


def test_an_answer_slower_than_timeout_is_said_so_not_unreachable(root, served):
    """--timeout 0.05 on a live server said 'could not reach ...: timed out'."""
    _, _, srv = served
    body = root / "slow.json"
    body.write_text("[" + ",".join(["[1.0, 2.0, 3.0, 4.0]"] * 20000) + "]")
    result = cli("predict", "tensor", body, "--home", srv.home, "--timeout", "0.001")
    assert result.exit_code == 1, result.output
    assert "no answer from tensor within 0.001 s: raise --timeout" in one_error_line(result.stderr)


def test_bench_says_what_it_sends_on_a_terminal_only(root, served, tmp_path):
    """bench was silent until its table (17 s for a sweep of two settings)."""
    _, _, srv = served
    body = tmp_path / "row.json"
    body.write_text("[[1.0, 2.0, 3.0, 4.0]]")
    args = ("bench", "tensor", "--input", body, "--requests", "3", "--concurrency", "2", "--home", srv.home)
    code, out, err = tsctl(*args, tty=True)
    assert code == 0 and progress_lines(err) == ["tensor: 2 clients, 3 requests"], err
    code, out, err = tsctl(*args)
    assert code == 0 and err == "" and out.startswith("3 requests in "), out + err
