"""``--json`` of init, package, inspect, config, export kserve and export seldon: stdout is one JSON document
whose keys are the ones docs/json-output.md documents for the command (its example, key by key, nested
objects and list items included), and the values say what was written.

Packaging uses a stand-in TorchScript file (packaging never loads weights); only the --golden case runs a
model (the sample resnet18, in-process, on two inputs)."""

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver.cli import main
from helpers import archive_reading
from helpers.models import stand_in_torchscript
from helpers.paths import ROOT

DOC = ROOT / "docs" / "json-output.md"
# Objects whose keys are the archive's or the environment's, not the schema's: checked to be objects only.
OPEN_OBJECTS = {"manifest", "versions", "settings"}


def documented(command: str) -> dict:
    """The example JSON of ``## tsctl COMMAND`` in docs/json-output.md."""
    text = DOC.read_text()
    section = text.split(f"\n## tsctl {command}\n", 1)[1].split("\n## ", 1)[0]
    [example] = re.findall(r"```json\n(.*?)```", section, re.S)[:1]
    return json.loads(example)


def assert_shaped_like(actual, example, where="$"):
    """``actual`` has exactly the keys of ``example``, recursively (the first item of lists of objects)."""
    if isinstance(example, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r} is not an object"
        assert set(actual) == set(example), f"{where}: keys {sorted(actual)}, documented {sorted(example)}"
        for key, value in example.items():
            if key in OPEN_OBJECTS:
                assert actual[key] is None or isinstance(actual[key], dict), f"{where}.{key}: {actual[key]!r}"
            elif actual[key] is not None:
                assert_shaped_like(actual[key], value, f"{where}.{key}")
    elif isinstance(example, list):
        assert isinstance(actual, list), f"{where}: {actual!r} is not a list"
        if example and actual and isinstance(example[0], dict):
            for i, item in enumerate(actual):
                assert_shaped_like(item, example[0], f"{where}[{i}]")
    elif isinstance(example, (int, float)) and not isinstance(example, bool):
        assert isinstance(actual, (int, float)) and not isinstance(actual, bool), f"{where}: {actual!r}"
    elif isinstance(example, str):
        assert isinstance(actual, str), f"{where}: {actual!r} is not a string"


def run_json(*args, cwd: Path = None) -> dict:
    """``tsctl ARGS --json`` in-process: exit 0 and stdout one JSON document, nothing else."""
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, [str(arg) for arg in args] + ["--json"])
    finally:
        os.chdir(old)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A stand-in TorchScript image archive in model-store/ and its config (no model library loaded)."""
    root = tmp_path_factory.mktemp("json")
    stand_in_torchscript(root / "w.pt")
    (root / "labels.json").write_text('{"0": "cat"}')
    (root / "link.json").symlink_to(root / "labels.json")
    return root


def test_init(tmp_path):
    report = run_json("init", "sentiment", "--from", "text_classifier", cwd=tmp_path)
    assert_shaped_like(report, documented("init"))
    assert report["directory"] == "sentiment" and report["class"] == "Sentiment" and report["kind"] == "text_classifier"
    assert report["base"] == "handlers.text_classification.TextClassifier"
    assert report["files"] == ["sentiment/handler.py", "sentiment/model-config.yaml", "sentiment/test_sentiment.py"]
    assert all((tmp_path / path).is_file() for path in report["files"])
    assert report["next_commands"][0] == "python -m pytest sentiment/test_sentiment.py"
    assert report["next_commands"][-1] == "tsctl stop"


def test_package_inspect_and_config(project, tmp_path):
    store = tmp_path / "model-store"
    report = run_json(
        "package",
        "--model-name",
        "img",
        "--serialized-file",
        project / "w.pt",
        "--handler",
        "image_classifier",
        "--extra-files",
        project / "link.json",
        "--follow-symlinks",
        "--export-path",
        store,
    )
    assert_shaped_like(report, documented("package"))
    archive = store / "img.mar"
    assert report["path"] == str(archive) and report["bytes"] == archive.stat().st_size
    assert report["followed"] == [{"link": str(project / "link.json"), "target": str(project / "labels.json")}]
    assert report["golden"] is None
    [note] = report["notes"]  # the labels went in as link.json
    assert "holds no index_to_name.json" in note and "--extra-files index_to_name.json" in note, note

    shown = run_json("inspect", archive)
    assert_shaped_like(shown, documented("inspect"))
    assert shown["manifest"] == archive_reading.manifest(archive)
    assert [(e["name"], e["size"]) for e in shown["entries"]] == sorted(archive_reading.members(archive))
    assert shown["golden"] is None

    output = tmp_path / "config" / "c.properties"
    config = run_json("config", "--model-store", store, "--output", output, "--batch-size", 4)
    assert_shaped_like(config, documented("config"))
    assert config["path"] == str(output) and config["notes"] == []
    [model] = config["models"]
    assert model == {
        "name": "img",
        "version": "1.0",
        "marName": "img.mar",
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": 4,
        "maxBatchDelay": 100,
        "responseTimeout": 120,
    }


def test_package_with_golden_and_inspect_it(image_sample, jpegs, tmp_path):
    """The golden run loads torch and runs the model in-process: stdout is still the JSON alone."""
    inputs = tmp_path / "golden"
    inputs.mkdir()
    (inputs / "cat.jpg").write_bytes(jpegs[0])
    (inputs / "not-an-image.jpg").write_bytes(b"not a jpeg")
    store = tmp_path / "model-store"
    report = run_json(
        "package",
        "--model-name",
        "resnet18",
        "--serialized-file",
        image_sample / "resnet18.pt",
        "--model-file",
        image_sample / "model.py",
        "--handler",
        "image_classifier",
        "--extra-files",
        image_sample / "index_to_name.json",
        "--export-path",
        store,
        "--golden",
        inputs,
    )
    assert_shaped_like(report, documented("package"))
    golden = report["golden"]
    assert golden["answers"] == 2 and golden["names"] == ["cat.jpg", "not-an-image.jpg"]
    assert golden["statuses"] == [200, 400] and golden["handler"] == "handlers.image.ImageClassifier"
    assert "torch" in golden["versions"] and golden["settings"]["top_k"] == 5
    assert report["notes"] == []  # index_to_name.json is in it

    shown = run_json("inspect", store / "resnet18.mar")
    assert_shaped_like(shown, documented("inspect"))
    assert shown["golden"] == golden


@pytest.fixture(scope="module")
def exportable(project, tmp_path_factory):
    """A store of one stand-in image archive (no requirements: nothing to resolve) and its config."""
    root = tmp_path_factory.mktemp("exportable")
    run_json(
        "package",
        "--model-name",
        "img",
        "--serialized-file",
        project / "w.pt",
        "--handler",
        "image_classifier",
        "--export-path",
        root / "model-store",
    )
    run_json("config", "--model-store", root / "model-store", "--output", root / "config" / "config.properties")
    return root


def test_export_kserve(exportable, tmp_path):
    out = tmp_path / "deploy"
    report = run_json(
        "export",
        "kserve",
        out,
        "--name",
        "vision",
        "--storage-uri",
        "pvc://models/vision",
        "--config",
        exportable / "config" / "config.properties",
        "--model-store",
        exportable / "model-store",
    )
    assert_shaped_like(report, documented("export kserve"))
    assert report["out"] == str(out) and report["deploy"] == str(out / "DEPLOY.md")
    assert str(out / "model-store" / "img.mar") in report["files"] and all(Path(f).exists() for f in report["files"])
    [curl] = report["curls"]
    assert curl.startswith("curl ") and "/v1/models/img:predict" in curl and curl in (out / "DEPLOY.md").read_text()


def test_export_check(exportable, tmp_path):
    out = tmp_path / "deploy"
    run_json(
        "export",
        "kserve",
        out,
        "--name",
        "vision",
        "--storage-uri",
        "pvc://models/vision",
        "--config",
        exportable / "config" / "config.properties",
        "--model-store",
        exportable / "model-store",
    )
    report = run_json("export", "check", out)
    assert_shaped_like(report, documented("export check"))
    assert report["problem"] is None and report["files"] == 2  # the config and the one archive


def test_export_seldon(exportable, tmp_path):
    out = tmp_path / "deploy"
    report = run_json(
        "export",
        "seldon",
        out,
        "--image",
        "registry.example.com/tsctl-mlserver:1",
        "--model-store",
        exportable / "model-store",
    )
    assert_shaped_like(report, documented("export seldon"))
    assert report["deploy"] == str(out / "DEPLOY.md") and all(Path(f).exists() for f in report["files"])
    assert str(out / "models" / "img" / "img.mar") in report["files"]
    [curl] = report["curls"]
    assert '-H "seldon-model: img"' in curl and curl in (out / "DEPLOY.md").read_text()


def test_a_mistake_prints_only_the_error_document_on_stdout(project, tmp_path):
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "missing.mar"), "--json"])
    assert result.exit_code == 2 and json.loads(result.stdout) == {
        "error": {"message": f"{tmp_path / 'missing.mar'} does not exist: check the path", "exit_code": 2}
    }, result.stdout
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
