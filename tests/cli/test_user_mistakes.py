"""Mistakes a newcomer made on a fresh clone (issue #23's review): each is one `error:` line, exit 2 (a
user mistake) or 1 (the server), never a traceback, and names what to do."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner

from archiver import mar, properties
from archiver.cli import main
from helpers.hostile import scripted
from helpers.paths import short_tmp


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistakes")
    options = mar.PackageOptions(
        model_name="tensor",
        handler="tensor",
        serialized_file=str(scripted(root / "tensor.pt", torch.nn.Linear(4, 2))),
        export_path=str(root / "model-store"),
    )
    mar.build(options)
    return root


def tsctl(*args, cwd=None):
    previous = os.getcwd()
    os.chdir(cwd or previous)
    try:
        return CliRunner().invoke(main, [str(a) for a in args])
    finally:
        os.chdir(previous)


@pytest.mark.parametrize(
    "args, message",
    [
        (["config", "--output", "afile/c.properties"], "--output afile: afile is a file, not a directory"),
        (["config", "--output", "."], "--output . is a directory"),
        (["serve", "--home", "afile"], "--home"),
        (["export", "kserve", "afile", "--name", "x", "--storage-uri", "pvc://c/p"], "afile exists and is not a dir"),
        (["predict", "tensor", "afile", "--timeout", "-1"], "--timeout"),
        (["verify", "model-store/tensor.mar", "--served", "--timeout", "0"], "--timeout"),
        (["serve", "--timeout", "0"], "--timeout"),
        (["config", "--model-store", "afile"], "model store afile is a file, not a directory"),
        (["serve", "--model-store", "afile"], "afile is a file, not a directory: give the directory of the archives"),
        (
            ["export", "kserve", "o", "--name", "x", "--storage-uri", "pvc://c/p", "--model-store", "afile"],
            "model store afile is a file, not a directory",
        ),
    ],
)
def test_a_path_or_value_in_the_way_is_one_line(store, args, message):
    (store / "afile").write_text("x")
    properties.write_config(store / "model-store", store / "config" / "config.properties")
    done = tsctl(*args, cwd=store)
    assert done.exit_code == 2 and isinstance(done.exception, SystemExit), done.output
    assert message in done.output and "Traceback" not in done.output, done.output


def test_package_into_a_file_says_so(store):
    (store / "afile").write_text("x")
    done = tsctl(
        "package",
        "--model-name",
        "q",
        "--handler",
        "tensor",
        "--serialized-file",
        "tensor.pt",
        "--export-path",
        "afile",
        "--force",
        cwd=store,
    )
    assert done.exit_code == 2 and "--export-path afile: afile is a file, not a directory" in done.output, done.output
    assert (store / "afile").read_text() == "x"


def test_serve_without_java_says_so(store):
    """TorchServe's launcher prints 'java not found' and exits 0: serve said 'no error in the logs'."""
    config = properties.write_config(store / "model-store", store / "config" / "config.properties")
    home = short_tmp("nojava-")
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(bin_dir)  # the venv alone: no java
    done = subprocess.run(
        [
            str(bin_dir / "tsctl"),
            "serve",
            "--config",
            str(config),
            "--model-store",
            str(store / "model-store"),
            "--home",
            str(home),
            "--timeout",
            "60",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    subprocess.run([str(bin_dir / "tsctl"), "stop", "--home", str(home)], capture_output=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "found no Java" in done.stderr and "JAVA_HOME" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "uri, why",
    [
        ("pvc://models/../vision", "a '..' segment"),
        ("pvc://models/vision/..", "a '..' segment"),
        ("pvc://models//etc/vision", "an empty segment (//)"),
        ("pvc://models/a//b", "an empty segment (//)"),
        ("pvc://models/./vision", "a '.' segment"),
        ("pvc://models/a\\..\\b", "the segment 'a\\\\..\\\\b'"),
        ("pvc://models/v;rm", "the segment 'v;rm'"),
    ],
)
def test_a_storage_uri_path_leaving_the_claim_is_refused(store, uri, why):
    """DEPLOY.md copies the tree to /pvc/PATH: '..', '//' or a backslash put it outside the claim."""
    properties.write_config(store / "model-store", store / "config" / "config.properties")
    done = tsctl("export", "kserve", "out", "--name", "x", "--storage-uri", uri, cwd=store)
    assert done.exit_code == 2 and isinstance(done.exception, SystemExit), done.output
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --storage-uri {uri!r} has {why} in its path"), lines
    assert not (store / "out").exists()


@pytest.mark.parametrize("uri, path", [("pvc://models/vision/", "vision"), ("pvc://models/a-1/b_2.v3", "a-1/b_2.v3")])
def test_a_storage_uri_inside_the_claim_is_copied_there(store, tmp_path, uri, path):
    properties.write_config(store / "model-store", store / "config" / "config.properties")
    done = tsctl("export", "kserve", tmp_path / "out", "--name", "x", "--storage-uri", uri, cwd=store)
    assert done.exit_code == 0, done.output
    assert f"models/{path}" in (tmp_path / "out" / "DEPLOY.md").read_text()


BAD_SETTINGS = {
    "batchSize: 0\n": "batchSize is 0, which TorchServe ignores",
    "responseTimeout: 0\n": "responseTimeout is 0, which TorchServe ignores",
    "minWorkers: 0\n": "minWorkers is 0: a model with no worker answers every request 503",
    "maxWorkers: 0\n": "maxWorkers is 0: a model with no worker",
    "minWorkers: 3\nmaxWorkers: 1\n": "minWorkers 3 is above maxWorkers 1",
    "maxBatchDelay: -1\n": "'maxBatchDelay' must not be negative",
}


@pytest.mark.parametrize("text", list(BAD_SETTINGS))
def test_package_refuses_worker_settings_torchserve_would_ignore(store, tmp_path, text):
    """batchSize 0 passed package and config, then the engine refused tsctl's own snapshot; minWorkers 3 with
    maxWorkers 1 became workers 3-3 without a word."""
    (tmp_path / "model-config.yaml").write_text(text)
    done = tsctl(
        "package",
        "--model-name",
        "q",
        "--handler",
        "tensor",
        "--serialized-file",
        store / "tensor.pt",
        "--config-file",
        tmp_path / "model-config.yaml",
        "--export-path",
        tmp_path / "out",
    )
    lines = done.output.strip().splitlines()
    assert done.exit_code == 2 and len(lines) == 1, done.output
    assert lines[0].startswith(f"error: {tmp_path / 'model-config.yaml'}: ") and BAD_SETTINGS[text] in lines[0], lines
    assert not (tmp_path / "out" / "q.mar").exists()


def built_elsewhere(store: Path, tmp: Path, text: str) -> Path:
    """A store whose one archive carries model-config.yaml ``text`` unchecked (torch-model-archiver checks
    nothing): tensor.mar with the file put in."""
    root = tmp / "elsewhere"
    (root / "model-store").mkdir(parents=True)
    with zipfile.ZipFile(store / "model-store" / "tensor.mar") as source:
        with zipfile.ZipFile(root / "model-store" / "tensor.mar", "w") as target:
            for item in source.infolist():
                data = source.read(item)
                if item.filename == "MAR-INF/MANIFEST.json":
                    manifest = json.loads(data)
                    manifest["model"]["configFile"] = "model-config.yaml"
                    data = json.dumps(manifest).encode()
                target.writestr(item, data)
            target.writestr("model-config.yaml", text)
    return root


@pytest.mark.parametrize("text", [t for t in BAD_SETTINGS if "must not be negative" not in BAD_SETTINGS[t]])
def test_config_refuses_an_archive_s_worker_settings_torchserve_would_ignore(store, tmp_path, text):
    root = built_elsewhere(store, tmp_path, text)
    done = tsctl("config", cwd=root)
    lines = done.output.strip().splitlines()
    assert done.exit_code == 2 and len(lines) == 1, done.output
    assert lines[0].startswith("error: model-store/tensor.mar's model-config.yaml: "), lines
    assert BAD_SETTINGS[text] in lines[0] and "package the archive again" in lines[0], lines
    assert not (root / "config").exists()


def test_config_refuses_a_flag_against_an_archive_s_setting_naming_both(store, tmp_path):
    root = built_elsewhere(store, tmp_path, "maxWorkers: 2\n")
    done = tsctl("config", "--min-workers", "3", cwd=root)
    assert done.exit_code == 2, done.output
    assert "minWorkers 3 is above maxWorkers 2" in done.output, done.output
    assert "(minWorkers from --min-workers, maxWorkers from its model-config.yaml)" in done.output, done.output
    done = tsctl("config", "--min-workers", "3", "--max-workers", "4", cwd=root)
    assert done.exit_code == 0, done.output
    snapshot = properties.snapshot_of(properties.read_properties(root / "config" / "config.properties"))
    assert (
        snapshot["models"]["tensor"]["1.0"]["minWorkers"] == 3
        and snapshot["models"]["tensor"]["1.0"]["maxWorkers"] == 4
    )
    assert tsctl("config", "--min-workers", "0", cwd=root).exit_code == 2


def test_serve_names_an_archive_the_config_leaves_out(store, tmp_path):
    """A model packaged after 'tsctl config' ran was silently not served: serve says so (stderr, and the
    --json document's notes), and serves the snapshot."""
    root = tmp_path / "project"
    shutil.copytree(store / "model-store", root / "model-store")
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    shutil.copy(root / "model-store" / "tensor.mar", root / "model-store" / "new.mar")  # packaged since
    home = short_tmp("unlisted-")
    command = [sys.executable, "-m", "archiver.cli", "serve", "--engine", "kserve", "--home", str(home), "--json"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    try:
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=180)
    finally:
        subprocess.run([*command[:3], "stop", "--home", str(home)], cwd=root, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    note = "model-store/new.mar is not in the model_snapshot of config/config.properties, so it is not served: "
    assert f"note: {note}run 'tsctl config' to add it" in done.stderr.splitlines(), done.stderr
    document = json.loads(done.stdout)
    assert document["models"] == ["tensor"] and len(document["notes"]) == 1 and note in document["notes"][0]


def test_serve_refuses_a_config_naming_an_archive_the_store_lacks(store, tmp_path):
    root = tmp_path / "project"
    shutil.copytree(store / "model-store", root / "model-store")
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    (root / "model-store" / "tensor.mar").rename(root / "elsewhere.mar")
    for engine in ("torchserve", "tsctl", "mlserver"):
        try:
            done = tsctl("serve", "--engine", engine, "--home", tmp_path / "home", cwd=root)
        finally:
            tsctl("stop", "--home", tmp_path / "home")  # had it started, it is stopped
        lines = done.output.strip().splitlines()
        assert done.exit_code == 2 and len(lines) == 1, (engine, done.output)
        assert "model_snapshot names 'tensor.mar' for model 'tensor', which is not in" in lines[0], lines
        assert not (tmp_path / "home" / "server.json").exists()


FAILING = """from handlers.tensor import TensorPredictor


class Failing(TensorPredictor):
    def inference(self, data, *args, **kwargs):
        raise RuntimeError("the model is broken")
"""


def test_package_golden_refuses_the_handler_failing_unless_allowed(store, tmp_path):
    """A handler failing on every golden input was recorded as golden 500s, exit 0."""
    (tmp_path / "failing.py").write_text(FAILING)
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "row.json").write_text("[[1, 2, 3, 4]]")
    args = [
        "package",
        "--model-name",
        "f",
        "--handler",
        tmp_path / "failing.py",
        "--serialized-file",
        store / "tensor.pt",
        "--golden",
        tmp_path / "inputs",
        "--export-path",
        tmp_path / "out",
    ]
    done = tsctl(*args)
    lines = done.output.strip().splitlines()
    assert done.exit_code == 1 and len(lines) == 1, done.output
    assert lines[0].startswith("error: --golden row.json: the handler failed (") and "the model is broken" in lines[0]
    assert "--golden-allow-errors" in lines[0] and not (tmp_path / "out" / "f.mar").exists()
    allowed = tsctl(*args, "--golden-allow-errors")
    assert allowed.exit_code == 0, allowed.output
    assert "note: golden: 1 recorded answer(s) of the handler failing (row.json" in allowed.output
    assert (tmp_path / "out" / "f.mar").exists()
    alone = tsctl(*args[:-4], "--export-path", tmp_path / "other", "--golden-allow-errors")
    assert alone.exit_code == 2 and "--golden-allow-errors goes with --golden" in alone.output, alone.output


def json_commands(group=main, prefix=()) -> list:
    """Every tsctl command that takes --json, as its words (("export", "kserve"), ...)."""
    found = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += json_commands(command, prefix + (name,))
        elif any(param.name == "as_json" for param in command.params):
            found.append(prefix + (name,))
    return found


MISTAKES = {  # each command's arguments for one of our errors, before anything runs
    ("init",): ["afile", "--from", "blank"],
    ("package",): ["--model-name", "q", "--handler", "tensor", "--serialized-file", "missing.pt"],
    ("inspect",): ["missing.mar"],
    ("config",): ["--model-store", "afile"],
    ("serve",): ["--model-store", "afile"],
    ("stop",): ["--home", "badhome"],
    ("predict",): ["tensor", "afile", "--home", "nohome"],
    ("run",): ["missing.mar", "afile"],
    ("verify",): ["missing.mar"],
    ("bench",): ["tensor", "--input", "afile", "--requests", "1", "--home", "nohome"],
    ("export", "kserve"): ["out", "--name", "x", "--storage-uri", "s3://x"],
    ("export", "seldon"): ["out", "--image", "a b"],
    ("export", "check"): ["afile"],
    ("shadow",): ["missing.mar", "--current", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:10"],
    ("simulate",): ["missing.json"],
}
NO_ERRORS = {("doctor",)}  # every problem it finds is a check line of its answer, exit 1: never an error


def runner_invoke(args, cwd):
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, [str(a) for a in args])
    finally:
        os.chdir(previous)


def test_every_json_command_is_covered():
    assert set(json_commands()) == set(MISTAKES) | NO_ERRORS


@pytest.mark.parametrize("words", list(MISTAKES), ids=" ".join)
def test_under_json_an_error_is_a_json_document_too(store, words):
    """Under --json, errors were plain text on stderr alone: a script reading stdout got nothing to parse."""
    (store / "afile").write_text("x")
    (store / "badhome").mkdir(exist_ok=True)
    (store / "badhome" / "server.json").write_text("not json")
    done = runner_invoke([*words, *MISTAKES[words], "--json"], store)
    assert done.exit_code in (1, 2) and isinstance(done.exception, SystemExit), done.output
    error = json.loads(done.stdout)["error"]
    assert set(json.loads(done.stdout)) == {"error"} and error["exit_code"] == done.exit_code, done.stdout
    stderr = done.stderr.strip().splitlines()
    assert stderr == [f"error: {error['message']}"] and "\n" not in error["message"], done.stderr


@pytest.mark.parametrize("words", json_commands(), ids=" ".join)
def test_under_json_a_usage_error_is_a_json_document_too(store, words):
    done = runner_invoke([*words, "--no-such-flag", "--json"], store)
    assert done.exit_code == 2, done.output
    error = json.loads(done.stdout)["error"]
    assert error["exit_code"] == 2 and "--no-such-flag" in error["message"], done.stdout
    assert f"Error: {error['message']}" in done.stderr, done.stderr  # click's own lines stay on stderr


def test_without_json_an_error_prints_nothing_on_stdout(store):
    done = runner_invoke(["inspect", "missing.mar"], store)
    assert done.exit_code == 2 and done.stdout == "" and done.stderr.startswith("error: "), done.output


@pytest.mark.parametrize("text", [t for t in BAD_SETTINGS if "must not be negative" not in BAD_SETTINGS[t]])
def test_without_a_config_the_engine_and_export_seldon_refuse_them_too(store, tmp_path, text):
    """Without config.properties the engine and export seldon read each archive's model-config.yaml, where
    TorchServe's --models all ignores such a value silently: refused in the same words."""
    root = built_elsewhere(store, tmp_path, text)
    home = short_tmp("settings-")
    for args in (["serve", "--engine", "tsctl", "--home", home], ["export", "seldon", "out", "--image", "i:1"]):
        try:
            done = tsctl(*args, cwd=root)
        finally:
            tsctl("stop", "--home", home)  # had it started (as it did before the check), it is stopped
        lines = done.output.strip().splitlines()
        assert done.exit_code == 2 and len(lines) == 1, (args, done.output)
        assert "tensor.mar's model-config.yaml: " in lines[0] and BAD_SETTINGS[text] in lines[0], lines
    assert not (root / "out").exists()


def test_a_bad_log_limit_is_refused_before_the_last_runs_logs_are_cleared(tmp_path):
    """TSCTL_LOG_MAX_BYTES below 4096: one line naming the variable, and the previous run's logs kept."""
    home = tmp_path / ".tsctl"
    (home / "logs").mkdir(parents=True)
    (home / "logs" / "engine.out").write_text("what the last run said\n")
    command = [sys.executable, "-m", "archiver.cli", "serve", "--engine", "kserve", "--home", str(home)]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TSCTL_LOG_MAX_BYTES="4000"),
    )
    assert done.returncode == 2 and "TSCTL_LOG_MAX_BYTES='4000' must be a whole number of at least 4096" in done.stderr
    assert (home / "logs" / "engine.out").read_text() == "what the last run said\n"
