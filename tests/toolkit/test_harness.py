"""The in-process harness and the image handler, for every weights kind, without a server."""

import base64
import importlib.util
import io
import json
import sys

import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from torchvision import transforms

from archiver import mar
from archiver.cli import main
from samples.image_model import sample_jpeg
from serving.local_model import LocalModel

TINY = """\
import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))
"""
CONFIG = "batchSize: 4\nhandler:\n  resize: 40\n  crop: 32\n  top_k: 3\n  jpeg_draft: false\n"  # the exact path


def tiny_model(tmp_path):
    (tmp_path / "tiny.py").write_text(TINY)
    spec = importlib.util.spec_from_file_location("tiny", tmp_path / "tiny.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["tiny"] = module  # importable by name, as the MAR's tiny.py will be for torch.load
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    return module.Tiny().eval()


def save(model, kind, tmp_path):
    """Weights file for ``kind``; returns (serialized file, model file or None)."""
    if kind == "state_dict":
        torch.save(model.state_dict(), tmp_path / "tiny.pt")
        return tmp_path / "tiny.pt", tmp_path / "tiny.py"
    if kind == "torchscript":
        torch.jit.trace(model, torch.randn(1, 3, 32, 32)).save(str(tmp_path / "tiny_ts.pt"))
        return tmp_path / "tiny_ts.pt", None
    if kind == "export":
        batch = torch.export.Dim("batch", min=1, max=64)
        program = torch.export.export(model, (torch.randn(2, 3, 32, 32),), dynamic_shapes={"x": {0: batch}})
        torch.export.save(program, str(tmp_path / "tiny.pt2"))
        return tmp_path / "tiny.pt2", None
    if kind == "safetensors":
        from safetensors.torch import save_file

        save_file(model.state_dict(), str(tmp_path / "tiny.safetensors"))
        return tmp_path / "tiny.safetensors", tmp_path / "tiny.py"
    raise ValueError(kind)


def reference_top3(model, jpeg: bytes):
    """What the handler must answer, computed with torchvision's classic transforms."""
    pipeline = transforms.Compose(
        [
            transforms.Resize(40),
            transforms.CenterCrop(32),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    x = pipeline(Image.open(io.BytesIO(jpeg)).convert("RGB")).unsqueeze(0)
    with torch.no_grad():
        probabilities = torch.softmax(model(x), dim=1)[0]
    values, indices = probabilities.topk(3)
    return {str(i): v for i, v in zip(indices.tolist(), values.tolist())}


def package_tiny(tmp_path, kind):
    model = tiny_model(tmp_path)
    serialized, model_file = save(model, kind, tmp_path)
    (tmp_path / "model-config.yaml").write_text(CONFIG)
    path = mar.package(
        mar.PackageOptions(
            model_name=f"tiny_{kind}",
            handler="image_classifier",
            serialized_file=str(serialized),
            model_file=str(model_file) if model_file else None,
            config_file=str(tmp_path / "model-config.yaml"),
            export_path=str(tmp_path / "store"),
        )
    )
    return model, path


def assert_same_answer(served: dict, expected: dict):
    assert list(served) == list(expected)
    for label, probability in expected.items():
        assert served[label] == pytest.approx(probability, rel=1e-4, abs=1e-6)


# torchscript and safetensors (16 s): make matrix's
KINDS = ["state_dict", "export", *(pytest.param(k, marks=pytest.mark.matrix) for k in ("torchscript", "safetensors"))]


@pytest.mark.parametrize("kind", KINDS)
def test_every_weights_kind_answers_like_the_model_itself(tmp_path, kind):
    model, path = package_tiny(tmp_path, kind)
    images = [sample_jpeg(seed, (120 + 10 * seed, 90)) for seed in range(3)]
    with LocalModel(path) as local:
        responses = local.predict(images)
    for image, response in zip(images, responses):
        assert response.status == 200, response.body
        assert response.content_type == "application/json"
        assert_same_answer(response.json(), reference_top3(model, image))


def test_one_bad_item_fails_alone_and_forms_follow_the_question(tmp_path):
    model, path = package_tiny(tmp_path, "state_dict")
    good = sample_jpeg(7, (100, 80))
    b64 = base64.b64encode(good).decode()
    expected = reference_top3(model, good)
    with LocalModel(path) as local:
        raw, corrupt, v1, v2, bad_b64 = local.predict(
            [
                good,
                good[: len(good) // 3],
                {"instances": [{"data": b64}, {"b64": b64}]},
                {"inputs": [{"name": "img", "shape": [1], "datatype": "BYTES", "data": [b64]}]},
                {"data": "%%%"},
            ]
        )
    assert raw.status == 200 and v1.status == 200 and v2.status == 200
    assert_same_answer(raw.json(), expected)
    assert_same_answer(v1.json()["predictions"][1], expected)
    assert_same_answer(json.loads(v2.json()["outputs"][0]["data"][0]), expected)
    assert corrupt.status == 400 and "could not decode image" in corrupt.json()["message"]
    assert bad_b64.status == 400 and bad_b64.json() == {
        "code": 400,
        "type": "ClientError",
        "message": "image is a string but not valid base64",
    }


def test_pickled_models_are_refused_unless_allowed(tmp_path):
    model = tiny_model(tmp_path)
    torch.save(model, tmp_path / "whole.pt")
    (tmp_path / "model-config.yaml").write_text(CONFIG)
    options = mar.PackageOptions(
        model_name="whole",
        handler="image_classifier",
        serialized_file=str(tmp_path / "whole.pt"),
        model_file=str(tmp_path / "tiny.py"),
        config_file=str(tmp_path / "model-config.yaml"),
        export_path=str(tmp_path / "store"),
    )
    with pytest.raises(Exception, match="weights_only=True refused it"):
        LocalModel(mar.package(options))
    (tmp_path / "model-config.yaml").write_text(CONFIG + "  allow_pickle: true\n")
    options.force = True
    with LocalModel(mar.package(options)) as local:
        assert local.predict([sample_jpeg(1, (64, 64))])[0].status == 200


def test_tsctl_run_prints_one_result_per_input(tmp_path):
    _, path = package_tiny(tmp_path, "torchscript")
    (tmp_path / "a.jpg").write_bytes(sample_jpeg(3, (64, 48)))
    (tmp_path / "b.jpg").write_bytes(b"not an image")
    result = CliRunner().invoke(main, ["run", str(path), str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg")])
    lines = result.output.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{tmp_path / 'a.jpg'}: 200 {{")
    assert lines[1].startswith(f"{tmp_path / 'b.jpg'}: 400 ") and "could not decode image" in lines[1]
    assert result.exit_code == 1


def test_resize_crop_equals_torchvisions_resize_then_center_crop():
    """The crop-box resize (bounded work for any shape) against torchvision's Resize + CenterCrop on
    random images of many shapes: within one gray level everywhere, equal almost everywhere."""
    import numpy as np
    from torchvision.transforms.v2 import functional as F

    from handlers.image import resize_crop

    rng = np.random.default_rng(0)
    differing = total = 0
    for _ in range(60):
        width, height = (int(v) for v in rng.integers(1, 1200, size=2))
        if max(width, height) / min(width, height) > 50:
            continue
        image = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
        for resize, crop in ((256, 224), (40, 32), (224, 224)):
            ours = np.asarray(resize_crop(image, resize, crop)).astype(int)
            theirs = np.asarray(F.center_crop(F.resize(image, [resize], antialias=True), [crop])).astype(int)
            assert ours.shape == theirs.shape
            assert np.abs(ours - theirs).max() <= 1, (width, height, resize, crop)
            differing += int((ours != theirs).sum())
            total += ours.size
    assert differing / total < 0.1
