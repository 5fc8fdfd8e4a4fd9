"""``tsctl export check TREE``: an exported tree against the digest its InferenceService pins, as the pod checks
it (serving/tree_digests.py). An untouched export and its copy pass; a changed byte, an added archive, a
removed config and another digest fail with exit 1 naming the file; a tree with no InferenceService and no
--digest is one line, exit 2."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver import properties
from archiver.cli import main
from archiver.export import options as export_options
from archiver.export.kserve import export as kserve
from helpers.models import package_resnet


@pytest.fixture(scope="module")
def exported(image_sample, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tree-check")
    store = root / "model-store"
    package_resnet(image_sample, store)
    properties.write_config(store, root / "config" / "config.properties")
    out = root / "deploy"
    config = root / "config" / "config.properties"
    kserve.export(
        export_options.ExportOptions(
            out=str(out), name="vision", config=str(config), model_store=str(store), storage_uri="pvc://m/v"
        )
    )
    return out


def check(*args):
    return CliRunner().invoke(main, ["export", "check", *map(str, args)])


def copy_of(tree: Path, where: Path) -> Path:
    """The tree as DEPLOY.md copies it onto the claim: config/ and model-store/, no manifests."""
    copy = where / "copy"
    for folder in ("config", "model-store"):
        shutil.copytree(tree / folder, copy / folder)
    return copy


def pinned(tree: Path) -> str:
    done = CliRunner().invoke(main, ["export", "check", str(tree), "--json"])
    return json.loads(done.stdout)["digest"]


def test_the_export_and_its_copy_pass(exported, tmp_path):
    done = check(exported)
    assert done.exit_code == 0, done.output
    assert done.output.startswith(f"{exported}: 2 files as the export wrote them (sha256:")
    copy = copy_of(exported, tmp_path)
    assert check(copy, "--digest", pinned(exported)).exit_code == 0


@pytest.mark.parametrize("change", ["byte", "added", "removed", "digest"])
def test_a_changed_tree_fails_naming_the_file(exported, tmp_path, change):
    copy = copy_of(exported, tmp_path)
    digest = pinned(exported)
    if change == "byte":
        archive = copy / "model-store" / "resnet18.mar"
        data = bytearray(archive.read_bytes())
        data[-1] ^= 1
        archive.write_bytes(bytes(data))
        expected = "model-store/resnet18.mar differs from what the export wrote"
    elif change == "added":
        shutil.copyfile(copy / "model-store" / "resnet18.mar", copy / "model-store" / "extra.mar")
        expected = "model-store/extra.mar is not in config/tree-digests.json"
    elif change == "removed":
        (copy / "config" / "config.properties").unlink()
        expected = "config/config.properties is missing"
    else:
        digest = "sha256:" + "0" * 64
        expected = "config/tree-digests.json is sha256:"
    done = check(copy, "--digest", digest)
    assert done.exit_code == 1 and expected in done.output, done.output


def test_a_tree_without_its_inferenceservice_needs_the_digest(exported, tmp_path):
    copy = copy_of(exported, tmp_path)
    done = check(copy)
    assert done.exit_code == 2
    assert (
        done.output
        == f"error: {copy / 'inferenceservice.yaml'} does not exist: give the tree's digest with --digest sha256:HEX\n"
    )
    assert check(copy, "--digest", "md5:abc").exit_code == 2
