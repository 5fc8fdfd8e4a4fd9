"""A model behind a transformer takes the tensor the transformer makes (issue #34, F1): every export with a
transformer (``export seldon --core 1``'s graph, Core 2's pipeline, KServe's transformer) refuses, in one line, a
tensor model whose ``handler.input_shape`` differs from the image archive's ``[3, crop, crop]``: served, every
request routed to it would get the tensor handler's 400. Where a shape is unknown (no input_shape, a handler of
one's own as the transformer) nothing is said."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver import properties
from archiver.cli import main
from archiver.export import archive_facts, core
from helpers.models import package_resnet

IMAGE = "registry.example.com/tsctl:1"


@pytest.fixture(scope="module")
def shapes(image_sample, tmp_path_factory):
    """model-store: big (tensor [3, 224, 224]), small (tensor [3, 128, 128]), free (tensor, no input_shape);
    transformer/vision.mar (image_classifier, crop 224), crop128/vision.mar (crop 128); config.properties."""
    root = tmp_path_factory.mktemp("shapes")
    store = root / "model-store"
    configs = {
        "big": "handler:\n  input_shape: [3, 224, 224]\n",
        "small": "handler:\n  input_shape: [3, 128, 128]\n",
        "free": "batchSize: 2\n",
    }
    for name, config in configs.items():
        package_resnet(image_sample, store, name=name, handler="tensor", config_text=config, extra_files=[])
    package_resnet(image_sample, root / "transformer", name="vision")
    package_resnet(image_sample, root / "crop128", name="vision", config_text="handler:\n  resize: 146\n  crop: 128\n")
    properties.write_config(store, root / "config" / "config.properties")
    return root


def export(shapes: Path, out: Path, kind: str, model: str, transformer="transformer"):
    archive = str(shapes / transformer / "vision.mar")
    other = "big" if model == "free" else "free"  # Core 1's router's other candidate
    common = [str(out), "--model-store", str(shapes / "model-store"), "--transformer-archive", archive]
    args = {
        "core1": ["seldon", "--core", "1", *common, "--image", IMAGE, "--ab", f"{model}=90", "--ab", f"{other}=10"],
        "core2": ["seldon", *common, "--image", IMAGE, "--transformer-model", model],
        "kserve": [
            "kserve",
            *common,
            "--name",
            "vision",
            "--storage-uri",
            "pvc://models/v",
            "--config",
            str(shapes / "config" / "config.properties"),
            "--transformer-image",
            IMAGE,
            "--transformer-model",
            model,
        ],
    }[kind]
    return CliRunner().invoke(main, ["export", *args])


@pytest.mark.parametrize("kind", ["core1", "core2", "kserve"])
def test_a_model_of_another_shape_is_refused_in_one_line(shapes, tmp_path, kind):
    result = export(shapes, tmp_path / "out", kind, "small")
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith(
        "error: model 'small' takes tensors of shape [3, 128, 128] (its handler.input_shape), but "
        "the transformer vision.mar makes [3, 224, 224]"
    ), line
    assert "package 'small' with handler.input_shape: [3, 224, 224]" in line and "handler.crop: 128" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["core1", "core2", "kserve"])
def test_equal_or_unknown_shapes_pass(shapes, tmp_path, kind):
    for model in ("big", "free"):  # free: no input_shape, nothing to compare
        result = export(shapes, tmp_path / model, kind, model)
        assert result.exit_code == 0, result.output
    result = export(shapes, tmp_path / "crop", kind, "small", transformer="crop128")  # crop 128 makes [3, 128, 128]
    assert result.exit_code == 0, result.output


def test_the_transformer_shape_is_known_for_the_toolkit_image_classifier_only(shapes):
    assert core.transformer_shape(archive_facts.read(shapes / "transformer" / "vision.mar")) == [3, 224, 224]
    assert core.transformer_shape(archive_facts.read(shapes / "crop128" / "vision.mar")) == [3, 128, 128]
    big = archive_facts.read(shapes / "model-store" / "big.mar")
    assert core.transformer_shape(big) is None  # not an image_classifier
