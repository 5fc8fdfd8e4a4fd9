"""An archive whose MAR-INF/golden.json is damaged exports as long as no step uses its golden answers (the
plain export, Seldon's), and is refused in one line, naming it, by the steps that do (``--canary``'s shadow
check): each archive is read once, its golden answers with the rest, but only a step that needs them fails
on them."""

import json
import zipfile
from pathlib import Path

import pytest

from archiver import properties
from archiver.errors import UserError
from archiver.export import options as export_options
from archiver.export.kserve import export as kserve
from archiver.export.seldon import export as seldon
from helpers.models import package_resnet


@pytest.fixture(scope="module")
def store(image_sample, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("damaged-golden")
    store = root / "model-store"
    archive = package_resnet(image_sample, store)
    with zipfile.ZipFile(archive, "a") as z:
        z.writestr("MAR-INF/golden.json", json.dumps({"cases": "not a list"}))
    properties.write_config(store, root / "config" / "config.properties")
    return store


def kserve_options(store: Path, out: Path, **flags) -> export_options.ExportOptions:
    config = store.parent / "config" / "config.properties"
    return export_options.ExportOptions(
        out=str(out), name="vision", config=str(config), model_store=str(store), storage_uri="pvc://m/v", **flags
    )


def test_the_steps_that_do_not_use_golden_answers_export_the_archive(store, tmp_path):
    kserve.export(kserve_options(store, tmp_path / "kserve"))
    assert (tmp_path / "kserve" / "model-store" / "resnet18.mar").is_file()
    config = store.parent / "config" / "config.properties"
    out = tmp_path / "seldon"
    seldon.export(export_options.SeldonOptions(out=str(out), image="r/s:1", config=str(config), model_store=str(store)))
    assert (out / "models" / "resnet18" / "resnet18.mar").is_file()


def test_the_canary_which_uses_them_names_the_archive(store, tmp_path):
    with pytest.raises(UserError, match=r"resnet18\.mar: MAR-INF/golden.json has no list of cases: package it again"):
        kserve.export(kserve_options(store, tmp_path / "canary", canary=10))
    assert not (tmp_path / "canary").exists()
