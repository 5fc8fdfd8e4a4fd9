"""Build the sample image model: torchvision resnet18 with random (seeded) weights, saved to files.

    python -m samples.image_model samples/build/resnet18

writes model.py (the class), resnet18.pt (a state_dict), index_to_name.json, model-config.yaml and
two sample JPEGs. There is no model hub here: the weights are made on the spot, so the labels are
arbitrary, but every byte the server sees is real.
"""

import io
import json
import subprocess
import sys
from pathlib import Path

import torch
from PIL import Image, ImageDraw

MODEL_PY = """\
from torchvision.models.resnet import BasicBlock, ResNet


class ResNet18(ResNet):
    def __init__(self):
        super().__init__(BasicBlock, [2, 2, 2, 2], num_classes=1000)
"""

MODEL_CONFIG = """\
minWorkers: 1
maxWorkers: 1
batchSize: 4
maxBatchDelay: 50
responseTimeout: 120
handler:
  top_k: 5
"""


def resnet18(seed: int = 0) -> torch.nn.Module:
    from torchvision.models import resnet18 as make

    torch.manual_seed(seed)
    return make(weights=None, num_classes=1000).eval()


def torchscript_resnet18(path: Path) -> Path:
    """The sample resnet18 traced to TorchScript and saved at ``path``."""
    torch.jit.trace(resnet18(), torch.randn(1, 3, 224, 224)).save(str(path))
    return path


def package_builtin(serialized: Path, store: Path, name: str, config: Path = None, extra_files=()) -> Path:
    """Package with torch-model-archiver and TorchServe's built-in image_classifier handler: the
    baseline tsctl is compared with."""
    archiver = Path(sys.executable).parent / "torch-model-archiver"
    command = [
        str(archiver),
        "--model-name",
        name,
        "--version",
        "1.0",
        "--serialized-file",
        str(serialized),
        "--handler",
        "image_classifier",
        "--export-path",
        str(store),
    ]
    if config:
        command += ["--config-file", str(config)]
    if extra_files:
        command += ["--extra-files", ",".join(str(f) for f in extra_files)]
    Path(store).mkdir(parents=True, exist_ok=True)
    subprocess.run(command, check=True, timeout=600)
    return Path(store) / f"{name}.mar"


def sample_jpeg(seed: int, size=(640, 480)) -> bytes:
    """A synthetic photo-like JPEG: a gradient with shapes, different per seed."""
    g = torch.Generator().manual_seed(seed)
    w, h = size
    base = torch.rand(3, generator=g) * 255
    image = Image.new("RGB", size, tuple(int(c) for c in base))
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, y0 = int(torch.randint(0, w, (1,), generator=g)), int(torch.randint(0, h, (1,), generator=g))
        x1, y1 = (
            x0 + int(torch.randint(20, w // 2, (1,), generator=g)),
            y0 + int(torch.randint(20, h // 2, (1,), generator=g)),
        )
        colour = tuple(int(c) for c in torch.randint(0, 256, (3,), generator=g))
        draw.ellipse((x0, y0, x1, y1), fill=colour) if torch.rand(1, generator=g) < 0.5 else draw.rectangle(
            (x0, y0, x1, y1), fill=colour
        )
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


def build(out: Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = resnet18()
    torch.save(model.state_dict(), out / "resnet18.pt")
    (out / "model.py").write_text(MODEL_PY)
    (out / "model-config.yaml").write_text(MODEL_CONFIG)
    labels = {str(i): [f"n{i:08d}", f"class_{i:03d}"] for i in range(1000)}
    (out / "index_to_name.json").write_text(json.dumps(labels))
    for seed, name in ((1, "kitten.jpg"), (2, "street.jpg")):
        (out / name).write_bytes(sample_jpeg(seed))
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "samples/build/resnet18")))
