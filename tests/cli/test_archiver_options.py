"""Issue #44: ``tsctl package`` takes torch-model-archiver 0.12's options, short and long, with their
meanings (pytorch/serve's READMEs write ``-r``, ``-f``, ``-v`` and ``-c``)."""

import argparse
import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from model_archiver.arg_parser import ArgParser

from archiver.cli import main
from archiver.commands.build import package
from helpers.engine import BIN

HANDLER = """\
from ts.torch_handler.base_handler import BaseHandler


class Echo(BaseHandler):
    def initialize(self, context):
        self.initialized = True

    def handle(self, data, context):
        return [row.get("body") or row.get("data") for row in data]
"""


def archiver_options(monkeypatch) -> dict:
    """{option string: whether it is a flag} of torch-model-archiver's own parser, --help aside (the
    parser is built and parses at once: caught as it parses)."""
    built = []

    def caught(parser, *args, **kwargs):
        built.append(parser)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    with pytest.raises(SystemExit):
        ArgParser.export_model_args_parser()
    [parser] = built
    return {
        name: isinstance(action, argparse._StoreTrueAction)
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        for name in action.option_strings
    }


def test_every_option_of_torch_model_archiver_is_one_of_tsctl_package(monkeypatch):
    ours = {name: param.is_flag for param in package.params for name in param.opts}
    theirs = archiver_options(monkeypatch)
    assert {"-r", "-f", "-v", "-c", "--model-name", "--handler"} <= set(theirs)  # the parser read is the real one
    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"torch-model-archiver's options tsctl package does not take: {missing}"
    differ = sorted(name for name in theirs if theirs[name] != ours[name])
    assert not differ, f"flags on one side, values on the other: {differ}"


@pytest.fixture
def inputs(tmp_path) -> Path:
    (tmp_path / "handler.py").write_text(HANDLER)
    (tmp_path / "requirements.txt").write_text("numpy\n")
    (tmp_path / "model-config.yaml").write_text("batchSize: 1\nminWorkers: 1\n")
    (tmp_path / "weights.bin").write_bytes(b"weights")
    return tmp_path


def members(archive: Path) -> dict:
    """{member: bytes} of an archive, the MANIFEST's model entry for its own (its creation time differs)."""
    with zipfile.ZipFile(archive) as opened:
        found = {name: opened.read(name) for name in opened.namelist() if not name.endswith("/")}
    found["MAR-INF/MANIFEST.json"] = json.loads(found["MAR-INF/MANIFEST.json"])["model"]
    return found


def test_short_options_make_the_archive_torch_model_archiver_makes(inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    args = [
        "--model-name",
        "echo",
        "-v",
        "2.0",
        "--handler",
        "handler.py",
        "--serialized-file",
        "weights.bin",
        "-r",
        "requirements.txt",
        "-c",
        "model-config.yaml",
        "-f",
    ]
    for store in ("theirs", "ours"):
        (inputs / store).mkdir()
    for _ in range(2):  # the second time over the first archive: -f
        done = subprocess.run(
            [BIN / "torch-model-archiver", *args, "--export-path", "theirs"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        result = CliRunner().invoke(main, ["package", *args, "--export-path", "ours"])
        assert result.exit_code == 0, result.output
    theirs, ours = members(inputs / "theirs" / "echo.mar"), members(inputs / "ours" / "echo.mar")
    assert ours == theirs
    assert theirs["MAR-INF/MANIFEST.json"]["modelVersion"] == "2.0"
    assert theirs["MAR-INF/MANIFEST.json"]["requirementsFile"] == "requirements.txt"
    assert theirs["MAR-INF/MANIFEST.json"]["configFile"] == "model-config.yaml"


def test_the_runtime_is_written_as_torch_model_archiver_writes_it_and_lsp_is_refused(inputs, monkeypatch):
    monkeypatch.chdir(inputs)
    args = ["--model-name", "echo", "--handler", "handler.py", "--serialized-file", "weights.bin"]
    done = subprocess.run(
        [BIN / "torch-model-archiver", *args, "-v", "1.0", "--runtime", "python3", "--export-path", "."],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (inputs / "ours").mkdir()
    result = CliRunner().invoke(main, ["package", *args, "--runtime", "python3", "--export-path", "ours"])
    assert result.exit_code == 0, result.output
    runtimes = []
    for archive in (inputs / "echo.mar", inputs / "ours" / "echo.mar"):
        with zipfile.ZipFile(archive) as opened:
            runtimes.append(json.loads(opened.read("MAR-INF/MANIFEST.json"))["runtime"])
    assert runtimes == ["python3", "python3"]
    result = CliRunner().invoke(main, ["package", *args, "--runtime", "LSP", "--export-path", "lsp"])
    assert result.exit_code == 2 and "--runtime LSP" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (inputs / "lsp").exists(), result.output
