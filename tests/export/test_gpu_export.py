"""``--gpus N`` on the exports: the predictor (or MLServer's container, Seldon Core 1's model units) asks for
``nvidia.com/gpu``, every manifest valid against the vendored CRDs; the tree's config says ``number_of_gpu``
(what TorchServe and the engine place workers by, serving/gpus.py); KServe's TorchServe runs its image's CUDA
build (``runtimeVersion: VERSION-gpu``), tsctl's images install torch's CUDA build; a config asking for GPUs
the pod is not given is noted; a result file measured on the CPU and exported with GPUs (or the reverse) too."""

import pytest
import torch
import yaml
from click.testing import CliRunner

from archiver import properties
from archiver.cli import main
from archiver.export import crds
from archiver.export.images import CUDA_TORCH_INDEX
from archiver.export.kserve.measured_notes import gpu_notes
from archiver.export.options import SeldonCore1Options
from archiver.export.seldon import core1
from helpers.hostile import build, scripted

SHAPE = "handler:\n  input_shape: [4]\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpus")
    build(root, "linear", "tensor", scripted(root / "linear.pt", torch.nn.Linear(4, 2)), SHAPE, None)
    (root / "store").rename(root / "model-store")
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    return root


def export(project, out, *args):
    command = [
        "export",
        "kserve",
        str(out),
        "--name",
        "linear",
        "--storage-uri",
        "pvc://models/gpu",
        "--model-store",
        str(project / "model-store"),
        "--config",
        str(project / "config" / "config.properties"),
        *args,
    ]
    return CliRunner().invoke(main, command)


@pytest.mark.parametrize("engine", ["torchserve", "tsctl"])
def test_kserve_predictor_asks_for_the_gpus_and_the_tree_says_number_of_gpu(project, tmp_path, engine):
    out = tmp_path / "out"
    extra = ["--engine", "tsctl", "--image", "registry.example.com/tsctl:1"] if engine == "tsctl" else []
    done = export(project, out, "--gpus", "2", *extra)
    assert done.exit_code == 0, done.output
    isvc = yaml.safe_load((out / "inferenceservice.yaml").read_text())
    assert crds.problems(isvc) == []
    model = isvc["spec"]["predictor"]["model"]
    for side in ("requests", "limits"):
        assert model["resources"][side] == {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "2"}
    assert properties.read_properties(out / "config" / "config.properties")["number_of_gpu"] == "2"
    if engine == "torchserve":
        assert model["runtimeVersion"] == "0.9.0-gpu"  # torchserve-kfs:0.9.0-gpu, the default runtime's CUDA image
    else:
        assert "runtimeVersion" not in model
        assert f"ARG TORCH_INDEX={CUDA_TORCH_INDEX}" in (out / "predictor-image" / "Dockerfile").read_text()
        assert "nvidia-ml-py==" in (out / "predictor-image" / "requirements.txt").read_text()


def test_without_gpus_nothing_asks_for_one_and_a_config_asking_is_noted(project, tmp_path):
    config = tmp_path / "config.properties"
    config.write_text((project / "config" / "config.properties").read_text() + "number_of_gpu=1\n")
    done = export(project, tmp_path / "out", "--config", str(config))
    assert done.exit_code == 0, done.output
    isvc = yaml.safe_load((tmp_path / "out" / "inferenceservice.yaml").read_text())
    assert "nvidia.com/gpu" not in isvc["spec"]["predictor"]["model"]["resources"]["limits"]
    assert "says number_of_gpu=1 but the predictor asks for no GPU: its workers run on the CPU; give --gpus 1" in (
        done.output
    )
    done = export(project, tmp_path / "bad", "--gpus", "-1")
    assert done.exit_code == 2 and "--gpus -1 must be 0 (no GPU) or a whole number of GPUs" in done.output


def test_seldon_gives_the_gpus_to_mlserver_and_to_core_1s_model_units(project, tmp_path):
    out = tmp_path / "seldon"
    command = [
        "export",
        "seldon",
        str(out),
        "--model-store",
        str(project / "model-store"),
        "--image",
        "registry.example.com/tsctl-mlserver:1",
        "--gpus",
        "1",
    ]
    done = CliRunner().invoke(main, command)
    assert done.exit_code == 0, done.output
    server = yaml.safe_load((out / "server.yaml").read_text())
    [mlserver] = [c for c in server["spec"]["podSpec"]["containers"] if c["name"] == "mlserver"]
    assert mlserver["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert f"ARG TORCH_INDEX={CUDA_TORCH_INDEX}" in (out / "server-image" / "Dockerfile").read_text()
    options = SeldonCore1Options(out=str(tmp_path / "core1"), image="registry.example.com/c:1", gpus=1)
    model = core1.container(options, "linear", "Model", "MODEL")
    transformer = core1.container(options, "pre", "Transformer", "TRANSFORMER")
    assert model["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu" not in transformer["resources"]["limits"]  # it runs no model


def test_a_measurement_on_other_gpus_than_the_pods_is_noted():
    h200 = {"id": 0, "name": "NVIDIA H200", "memory_mib": 143771}
    assert gpu_notes({"gpus": [h200]}, 1) == []
    [note] = gpu_notes({"gpus": []}, 1)
    assert note.startswith("--from-bench was measured on the CPU, the pod gets --gpus 1")
    [note] = gpu_notes({"gpus": [h200]}, 0)
    assert "measured on 1 GPU(s) (NVIDIA H200), the pod gets --gpus 0: export with --gpus 1" in note
