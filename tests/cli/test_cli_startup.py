"""Commands that do not run a model never import torch, and `tsctl --help` loads little beyond click.

Each command runs as its own process (``python -X importtime -m archiver.cli ...``), as a user runs it,
and the modules it imported are read from its import log: what matters is what a fresh process
loads, which an in-process test cannot see once anything has imported torch. The toolkit handlers'
catalogue entries (what packaging reads instead of importing them) are checked against the real classes.
"""

import importlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from handlers import catalogue
from helpers.models import stand_in_torchscript

ROOT = Path(__file__).resolve().parents[2]
MODEL_LIBRARIES = {"torch", "torchvision", "transformers", "sentence_transformers", "onnxruntime", "ts", "numpy"}


def imported_by(*args, cwd=ROOT):
    """The top-level modules ``tsctl ARGS`` imports, its exit code and output."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "archiver.cli", *args],
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    modules = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return modules, done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store with an image archive and a sentence-transformers text archive (stand-in files: packaging
    never reads weights)."""
    root = tmp_path_factory.mktemp("startup")
    stand_in_torchscript(root / "w.pt")
    text = root / "minilm"
    text.mkdir()
    for name in ("config.json", "modules.json"):
        (text / name).write_text("{}")
    (root / "model-config.yaml").write_text("batchSize: 4\nhandler:\n  top_k: 3\n  formats: [PNG, JPEG]\n")
    return root


def test_help_loads_click_and_the_option_values_only():
    modules, code, out = imported_by("--help")
    assert code == 0, out
    assert "package" in out and "serve" in out
    assert not modules & (MODEL_LIBRARIES | {"yaml", "jsonschema", "http", "tarfile", "zipfile", "kserve"}), modules


def test_package_of_toolkit_handlers_imports_no_model_library(store):
    modules, code, out = imported_by(
        "package",
        "--model-name",
        "img",
        "--serialized-file",
        str(store / "w.pt"),
        "--handler",
        "image_classifier",
        "--config-file",
        str(store / "model-config.yaml"),
        "--export-path",
        str(store / "ms"),
    )
    assert code == 0, out
    assert not modules & MODEL_LIBRARIES, modules & MODEL_LIBRARIES
    modules, code, out = imported_by(
        "package",
        "--model-name",
        "emb",
        "--serialized-file",
        str(store / "minilm"),
        "--handler",
        "text_embedder",
        "--export-path",
        str(store / "ms"),
    )
    assert code == 0, out
    assert not modules & MODEL_LIBRARIES, modules & MODEL_LIBRARIES
    with zipfile.ZipFile(store / "ms" / "emb.mar") as archive:
        requirements = archive.read("requirements.txt").decode().split()
        assert requirements == [catalogue.TRANSFORMERS, catalogue.SENTENCE_TRANSFORMERS]
        assert json.loads(archive.read("MAR-INF/tsctl.json"))["class"] == "TextEmbedder"


def test_a_settings_mistake_is_still_caught_without_the_handler(store):
    (store / "bad.yaml").write_text("handler:\n  formats: [PNG, NOPE]\n")
    modules, code, out = imported_by(
        "package",
        "--model-name",
        "bad",
        "--serialized-file",
        str(store / "w.pt"),
        "--handler",
        "image_classifier",
        "--config-file",
        str(store / "bad.yaml"),
        "--export-path",
        str(store / "ms"),
    )
    assert code == 2 and "'handler.formats' names NOPE" in out, out
    assert not modules & MODEL_LIBRARIES


def test_every_command_but_the_model_runners_imports_no_model_library(store):
    packaged = imported_by(
        "package",
        "--model-name",
        "img",
        "--serialized-file",
        str(store / "w.pt"),
        "--handler",
        "image_classifier",
        "--export-path",
        str(store / "one"),
    )
    assert packaged[1] == 0, packaged[2]
    home = store / "home"
    commands = [
        ("inspect", str(store / "one" / "img.mar")),
        ("config", "--model-store", str(store / "one"), "--output", str(store / "config" / "config.properties")),
        (
            "export",
            "kserve",
            str(store / "out"),
            "--name",
            "img",
            "--storage-uri",
            "pvc://claim/img",
            "--model-store",
            str(store / "one"),
            "--config",
            str(store / "config" / "config.properties"),
        ),
        ("init", "mine", "--from", "text_classifier"),
        ("stop", "--home", str(home)),
        ("predict", "img", str(store / "w.pt"), "--home", str(home)),
        ("bench", "img", "--input", str(store / "w.pt"), "--requests", "1", "--home", str(home)),
    ]
    for command in commands:
        modules, code, out = imported_by(*command, cwd=store)
        assert code in (0, 2), (command, out)  # predict/bench: no server running is the user's mistake
        assert not modules & MODEL_LIBRARIES, (command[0], modules & MODEL_LIBRARIES)


@pytest.mark.parametrize("name", sorted(catalogue.HANDLERS))
def test_each_catalogue_entry_is_what_its_class_declares(name):
    entry = catalogue.HANDLERS[name]
    module, _, function = entry.entry_point.partition(":")
    handler_class = getattr(importlib.import_module(module), function).handler_class
    assert catalogue.declared_by(handler_class) == entry.declared()
    assert (entry.name, module, handler_class.__name__) == (name, entry.module, entry.class_name)


def test_a_subclass_loads_its_own_model_only_when_it_overrides_load_model():
    """A user's subclass of a toolkit handler is checked against its weights as its base is, unless it
    defines ``load_model`` itself; the toolkit's own ``load_model`` overrides do not count."""
    from handlers.image import ImageClassifier

    class Tinted(ImageClassifier):
        def postprocess(self, data):
            return data

    class OwnWeights(Tinted):
        def load_model(self):
            return None

    assert not catalogue.declared_by(Tinted).loads_own_model
    assert catalogue.declared_by(OwnWeights).loads_own_model
    assert catalogue.subclassed(catalogue.declared_by(Tinted)).name == "image_classifier"
