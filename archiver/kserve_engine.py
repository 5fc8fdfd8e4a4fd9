"""``tsctl export kserve --engine kserve``: the archives on KServe's Python ModelServer, no TorchServe.

The InferenceService's predictor is a custom container running ``python -m handlers.kserve_predictor
--model_store /mnt/models/model-store`` (KServe mounts the storage URI at /mnt/models, as for its
TorchServe runtime), from an image built with the files written to OUT/predictor-image/:

    Dockerfile          python:X.Y-slim, uid 1000, the requirements, handlers/; ENTRYPOINT the predictor
    requirements.txt    torch, torchvision, torchserve (its Python model loader only), kserve, and every
                        archive's own requirements, pinned to the versions tsctl was tested with here
    handlers/           the toolkit's handlers package (each archive runs its own copy; this one starts them)

No torch import here: versions come from the installed distributions' metadata.
"""

import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import List

from handlers import archives as archive_files

IMAGE_DIR = "predictor-image"
PORT = 8080
BASE_PACKAGES = ("torch", "torchvision", "torchserve", "kserve", "numpy", "Pillow", "PyYAML")
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
MAX_REQUIREMENTS_BYTES = 1 << 20


def predictor(image: str, storage_uri: str, resources: dict) -> dict:
    """The InferenceService predictor: the custom container, the storage URI mounted at /mnt/models."""
    return {
        "containers": [
            {
                "name": "kserve-container",
                "image": image,
                "args": ["--model_store", "/mnt/models/model-store", "--http_port", str(PORT)],
                "env": [{"name": "STORAGE_URI", "value": storage_uri}],
                "ports": [{"containerPort": PORT, "protocol": "TCP"}],
                "resources": resources,
            }
        ]
    }


def requirements(archives: List[Path]) -> str:
    """The image's requirements: the serving stack at the versions installed here, then each archive's
    own requirements.txt lines (the ModelServer installs nothing per model)."""
    lines = [f"{name}=={metadata.version(name)}" for name in BASE_PACKAGES]
    for archive in archives:
        manifest = archive_files.read_manifest(archive)["model"]
        member = manifest.get("requirementsFile")
        data = archive_files.read_member(archive, member, MAX_REQUIREMENTS_BYTES) if member else None
        for line in (data or b"").decode("utf-8", errors="replace").splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-") and line not in lines:
                lines.append(line)
    return "\n".join(lines) + "\n"


DOCKERFILE = """\
# The predictor image of a tsctl export: KServe's ModelServer serving every archive in
# /mnt/models/model-store (handlers/kserve_predictor.py). Build and push it, then apply
# inferenceservice.yaml:   docker build -t {image} . && docker push {image}
FROM python:{python}-slim
ARG TORCH_INDEX={torch_index}
RUN useradd --uid 1000 --create-home model
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir --extra-index-url "$TORCH_INDEX" -r requirements.txt
COPY handlers/ handlers/
USER 1000
ENV PYTHONUNBUFFERED=1
EXPOSE {port}
ENTRYPOINT ["python", "-m", "handlers.kserve_predictor"]
CMD ["--model_store", "/mnt/models/model-store", "--http_port", "{port}"]
"""


def write_image_context(out: Path, image: str, archives: List[Path]) -> List[Path]:
    """OUT/predictor-image/: Dockerfile, requirements.txt and the handlers package."""
    context = out / IMAGE_DIR
    context.mkdir(parents=True)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    dockerfile = context / "Dockerfile"
    dockerfile.write_text(DOCKERFILE.format(image=image, python=python, torch_index=CPU_TORCH_INDEX, port=PORT))
    pinned = context / "requirements.txt"
    pinned.write_text(requirements(archives))
    source = Path(archive_files.__file__).parent
    shutil.copytree(source, context / "handlers", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return [dockerfile, pinned, context / "handlers"]


def build_steps(image: str) -> List[str]:
    """DEPLOY.md's step 0 for the KServe engine: build and push the predictor image."""
    return [
        "## 0. The predictor image",
        "",
        "The InferenceService runs KServe's ModelServer from an image of your own (no TorchServe, no Java):",
        f"`{IMAGE_DIR}/` is its build context. Push it where the cluster pulls from:",
        "",
        "```sh",
        f"docker build -t {image} {IMAGE_DIR}",
        f"docker push {image}",
        "```",
        "",
        "It batches each model as its archive's model-config.yaml says (batchSize, maxBatchDelay); "
        "config/config.properties is copied for TorchServe and not read.",
        "",
    ]
