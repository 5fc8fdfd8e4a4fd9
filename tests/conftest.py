"""Shared fixtures: sample models built on the spot (resnet18, JPEGs, the text models). What the tests
share besides fixtures is in tests/helpers/; pyproject.toml puts the repository and tests/ on sys.path."""

from pathlib import Path

import pytest

from samples import image_model


@pytest.fixture(scope="session")
def image_sample(tmp_path_factory) -> Path:
    """samples/image_model.py's output: resnet18 state_dict, model.py, labels, JPEGs."""
    return image_model.build(tmp_path_factory.mktemp("resnet18"))


@pytest.fixture(scope="session")
def jpegs(image_sample):
    """Eight different realistic-size JPEGs."""
    return [image_model.sample_jpeg(seed, (640 + 16 * seed, 480)) for seed in range(10, 18)]


@pytest.fixture(scope="session")
def text_samples(tmp_path_factory) -> Path:
    """minilm (the real all-MiniLM-L6-v2), classifier and tagger (small random BERTs)."""
    from samples import text_models

    return text_models.build(tmp_path_factory.mktemp("text"))
