"""Small models for the hostile-input tests, packaged on the spot, and answers compared within rounding."""

from pathlib import Path

import pytest
import torch

from archiver import golden, mar

BATCH = "batchSize: 8\nmaxBatchDelay: 100\n"


class Linear(torch.nn.Module):
    """Any image-sized input to 10 logits, cheaply: the fuzz is about the path, not the model."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 10)

    def forward(self, x):
        return self.fc(x.mean(dim=(2, 3)))


def scripted(path: Path, module: torch.nn.Module) -> Path:
    torch.manual_seed(0)
    torch.jit.script(module.eval()).save(str(path))
    return path


def build(tmp: Path, name: str, handler: str, weights: Path, config: str, golden_inputs: Path = None) -> Path:
    """tmp/store/NAME.mar of ``weights`` under ``handler``, ``config`` its model-config.yaml; with
    ``golden_inputs``, their golden answers recorded in it (package --golden)."""
    (tmp / f"{name}.yaml").write_text(config)
    options = mar.PackageOptions(
        model_name=name,
        handler=handler,
        serialized_file=str(weights),
        config_file=str(tmp / f"{name}.yaml"),
        export_path=str(tmp / "store"),
        force=True,
    )
    if golden_inputs is not None:
        return golden.package(options, str(golden_inputs))[0]
    return mar.package(options)


def assert_close(got, expected):
    """Equal structure, numbers within rel 1e-4 (batches of other sizes round differently)."""
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            assert_close(got[key], expected[key])
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected)
        for a, b in zip(got, expected):
            assert_close(a, b)
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-6)
    else:
        assert got == expected
