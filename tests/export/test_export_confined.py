"""Issue #45, an outsider's attack on the exports: what goes into the exported tree (and so into the model image)
comes from inside the model store alone, as the engine serves only what lies inside it.

- A directory archive holding ``notes.txt -> /tmp/secret`` (a 0600 file of this machine) was exported without
  a word: the tree, its listing and the image's layer held the secret, readable (0644). A link to /tmp had the
  export copy all of /tmp. Now a link leading out of the store is one line naming it, and nothing is written.
- A dangling link or a FIFO inside a directory archive ended the export in a ``shutil.Error`` traceback. Now
  they are left out of the copy, as the engine leaves them out of its own.
- A store entry that is itself a link to an archive outside the store: refused, as the engine refuses it."""

import os
import shutil
from pathlib import Path

import pytest

from archiver import properties
from archiver.errors import UserError
from archiver.export.kserve import export as kserve
from helpers.archive_reading import unpack
from helpers.models import package_resnet


@pytest.fixture
def project(image_sample, tmp_path) -> Path:
    """A store holding one directory archive (resnet18 unpacked), and its config."""
    root = tmp_path / "project"
    built = package_resnet(image_sample, tmp_path / "built")
    unpack(built, root / "model-store" / "resnet18")
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    return root


def export(project: Path, out: Path):
    config, store = project / "config" / "config.properties", project / "model-store"
    options = kserve.ExportOptions(
        out=str(out),
        name="vision",
        config=str(config),
        model_store=str(store),
        storage="oci",
        image_ref="registry.example.com/models/vision:1",
    )
    return kserve.export(options)


def layer_text(out: Path) -> str:
    return "".join(p.read_bytes().decode("latin-1") for p in (out / "model-image" / "blobs" / "sha256").iterdir())


def test_a_link_out_of_the_store_in_a_directory_archive_is_refused_and_nothing_is_written(project, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("a secret of this machine\n")
    secret.chmod(0o600)
    (project / "model-store" / "resnet18" / "notes.txt").symlink_to(secret)
    out = tmp_path / "out"
    with pytest.raises(UserError) as refused:
        export(project, out)
    assert "\n" not in str(refused.value) and "notes.txt" in str(refused.value), refused.value
    assert "outside" in str(refused.value), refused.value
    assert not out.exists()


def test_a_dangling_link_and_a_pipe_in_a_directory_archive_are_left_out_not_a_traceback(project, tmp_path):
    folder = project / "model-store" / "resnet18"
    (folder / "gone.txt").symlink_to(tmp_path / "nothing-here")
    os.mkfifo(folder / "pipe")
    out = tmp_path / "out"
    export(project, out)
    copied = out / "model-store" / "resnet18"
    assert (copied / "MAR-INF" / "MANIFEST.json").is_file()
    assert not (copied / "gone.txt").exists() and not (copied / "pipe").exists()
    assert "a secret" not in layer_text(out)


def test_a_store_entry_linking_to_an_archive_outside_the_store_is_refused(image_sample, tmp_path):
    root = tmp_path / "project"
    outside = package_resnet(image_sample, tmp_path / "elsewhere")
    (root / "model-store").mkdir(parents=True)
    shutil.copy(outside, root / "model-store" / "resnet18.mar")
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    (root / "model-store" / "resnet18.mar").unlink()
    (root / "model-store" / "resnet18.mar").symlink_to(outside)
    with pytest.raises(UserError) as refused:
        export(root, tmp_path / "out")
    assert "\n" not in str(refused.value) and "outside" in str(refused.value), refused.value
    assert not (tmp_path / "out").exists()
