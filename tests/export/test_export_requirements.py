"""The requirements an export puts in an image's build context (``export kserve --engine tsctl``'s
predictor-image/, ``export seldon``'s server-image/) are checked as ``package`` and the TorchServe export
check them (archiver/requirements.py): ``docker build`` runs ``pip install -r`` on that file, so a URL, a
VCS link, a local path or a pip option in an archive built elsewhere would fetch or build the archive
author's code. Each is refused in one line naming the archive, the line and the fix; nothing is written."""

import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from archiver import mar, properties
from archiver.cli import main
from helpers.hostile import scripted

IMAGE = "registry.example.com/tsctl:1"
BAD_LINES = {
    "direct URL": "evilpkg @ https://example.com/evilpkg-1.0.tar.gz",
    "bare URL": "https://example.com/evilpkg-1.0.tar.gz",
    "VCS": "git+https://example.com/evil.git#egg=evil",
    "editable": "-e .",
    "index option": "--index-url https://example.com/simple",
    "extra index option": "--extra-index-url=https://example.com/simple",
    "include": "-r other.txt",
    "relative path": "./evil",
    "absolute wheel": "/tmp/x-1.0-py3-none-any.whl",
}


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    """A project whose one archive (tensor.mar) asks for a plain pinned requirement."""
    root = tmp_path_factory.mktemp("requirements")
    wanted = root / "requirements.txt"
    wanted.write_text("six==1.16.0\n")
    options = mar.PackageOptions(
        model_name="tensor",
        handler="tensor",
        serialized_file=str(scripted(root / "tensor.pt", torch.nn.Linear(4, 2))),
        export_path=str(root / "model-store"),
        requirements_file=str(wanted),
    )
    mar.build(options)
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    return root


def with_requirements(clean: Path, tmp: Path, text: str) -> Path:
    """A copy of the clean project whose archive's requirements.txt is ``text``, as an archive built
    elsewhere (torch-model-archiver checks nothing) would carry it."""
    root = tmp / "project"
    shutil.copytree(clean, root)
    archive = root / "model-store" / "tensor.mar"
    edited = tmp / "edited.mar"
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(edited, "w") as target:
        for item in source.infolist():
            data = text.encode() if item.filename == "requirements.txt" else source.read(item)
            target.writestr(item, data)
    edited.replace(archive)
    return root


def export_kserve(root: Path, out: Path):
    args = [
        "export",
        "kserve",
        str(out),
        "--name",
        "tensor",
        "--storage-uri",
        "pvc://models/tensor",
        "--engine",
        "tsctl",
        "--image",
        IMAGE,
        "--config",
        str(root / "config" / "config.properties"),
        "--model-store",
        str(root / "model-store"),
    ]
    return CliRunner().invoke(main, args)


def export_seldon(root: Path, out: Path):
    args = ["export", "seldon", str(out), "--image", IMAGE, "--model-store", str(root / "model-store")]
    return CliRunner().invoke(main, args)


EXPORTS = {"export kserve --engine tsctl": export_kserve, "export seldon": export_seldon}


@pytest.mark.parametrize("export", list(EXPORTS))
@pytest.mark.parametrize("kind", list(BAD_LINES))
def test_each_line_that_is_not_a_plain_requirement_is_refused(clean, tmp_path, export, kind):
    root = with_requirements(clean, tmp_path, f"# fine\nsix==1.16.0\n{BAD_LINES[kind]}\n")
    out = tmp_path / "out" / "export"
    done = EXPORTS[export](root, out)
    assert done.exit_code == 2 and isinstance(done.exception, SystemExit), done.output
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.output, done.output
    assert lines[0].startswith("error: tensor.mar's requirements.txt, line 3: "), lines[0]
    assert repr(BAD_LINES[kind]) in lines[0] and ("instead" in lines[0] or "remove it" in lines[0]), lines[0]
    assert not (tmp_path / "out").exists()  # refused before anything is written: no OUT, no staging beside it


@pytest.mark.parametrize(
    "export, context", [("export kserve --engine tsctl", "predictor-image"), ("export seldon", "server-image")]
)
def test_a_plain_pinned_requirement_is_copied_without_its_hashes_and_comments(clean, tmp_path, export, context):
    root = with_requirements(clean, tmp_path, "six==1.16.0 --hash=sha256:00  # pinned\n--no-index\n")
    out = tmp_path / "out"
    done = EXPORTS[export](root, out)
    assert done.exit_code == 0, done.output
    copied = (out / context / "requirements.txt").read_text().splitlines()
    assert "six==1.16.0" in copied and not any("hash" in line or line.startswith("-") for line in copied), copied
