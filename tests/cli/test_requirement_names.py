"""Requirement lines are read with packaging, names compared as pip compares them (PEP 503): comments,
blank lines and pip options are no names; ``-r other.txt`` is refused with its fix."""

import zipfile

import pytest

from archiver import kserve_images, mar, properties, requirements
from archiver.errors import UserError
from handlers import catalogue


@pytest.mark.parametrize(
    "line, name",
    [
        ("Transformers_X>=4", "transformers-x"),
        ("Zope.Interface>=5", "zope-interface"),
        ("Sentence.Transformers==3.0.1", "sentence-transformers"),
        ("transformers\t>=4.34", "transformers"),
        ("numpy ; python_version < '4'", "numpy"),
        ("rich[jupyter]>=13", "rich"),
        ("six==1.16.0 --hash=sha256:00", "six"),
        ("Pillow>=10  # images", "pillow"),
        ("", None),
        ("   ", None),
        ("# transformers", None),
        ("  # transformers>=4", None),
        ("--no-index", None),
        ("--find-links wheels", None),
        ("--index-url https://example.invalid/simple", None),
        ("-r other.txt", None),
        ("-e ./localpkg", None),
        ("./localpkg", None),
    ],
)
def test_a_lines_name_is_what_pip_would_install(line, name):
    assert requirements.requirement_name(line) == name


def test_a_comment_after_a_tab_is_a_comment():
    assert requirements.check("numpy>=1.24\t# pinned for the image\n", "f") == ["numpy>=1.24"]


def text_model(tmp_path):
    """A sentence-transformers directory as packaging reads it (no weights are read)."""
    directory = tmp_path / "minilm"
    directory.mkdir()
    for name in ("config.json", "modules.json"):
        (directory / name).write_text("{}")
    return directory


def package_embedder(tmp_path, requirements_text: str):
    file = tmp_path / "requirements.txt"
    file.write_text(requirements_text)
    options = mar.PackageOptions(
        model_name="emb",
        handler="text_embedder",
        serialized_file=str(text_model(tmp_path)),
        requirements_file=str(file),
        export_path=str(tmp_path / "store"),
    )
    return mar.package(options), file


def test_the_handlers_requirement_is_not_added_when_the_file_names_its_package_otherwise(tmp_path):
    """The user's 'Sentence.Transformers' is sentence-transformers: the handler's own range is not added
    beside it (two lines for one package; pip refuses the pair when they disagree)."""
    archive, _ = package_embedder(tmp_path, "Sentence.Transformers==3.0.1\n# transformers comes from the handler\n")
    with zipfile.ZipFile(archive) as zf:
        lines = zf.read("requirements.txt").decode().splitlines()
    assert lines == ["Sentence.Transformers==3.0.1", "# transformers comes from the handler", catalogue.TRANSFORMERS]


def test_an_included_requirements_file_is_refused_with_its_fix(tmp_path):
    """TorchServe's per-model install runs `pip install -r requirements.txt` in the unpacked archive, which
    holds that one file: an include would not be found there."""
    with pytest.raises(UserError) as refused:
        package_embedder(tmp_path, "numpy>=1.24\n-r base.txt\n")
    message = str(refused.value)
    assert "\n" not in message
    assert f"--requirements-file {tmp_path / 'requirements.txt'}, line 2: '-r base.txt' includes base.txt" in message
    assert message.endswith("copy the requirements of base.txt into this file instead")
    assert not (tmp_path / "store" / "emb.mar").exists()


@pytest.mark.parametrize("line", ["--requirement base.txt", "--requirement=base.txt", "-rbase.txt"])
def test_every_spelling_of_an_include_is_named(line):
    with pytest.raises(UserError, match="includes base.txt"):
        requirements.check(f"{line}\n", "f")


def test_a_hashed_requirement_the_image_has_is_no_gap():
    """tsctl config's KServe check reads 'packaging==23.2 --hash=...' as packaging 23.2, which the image has."""
    runtime = kserve_images.RUNTIMES["torchserve-kfs:0.9.0"]
    assert properties._lacks("packaging==23.2 --hash=sha256:00", runtime) is None
    assert properties._lacks("packaging==24.0", runtime) == ("packaging==24.0", "packaging 23.2")
