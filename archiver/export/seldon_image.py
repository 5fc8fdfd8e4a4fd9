"""``tsctl export seldon``'s server-image/: the build context of the image the Server's mlserver container
runs: python:X.Y-slim, MLServer, tsctl's runtime (the handlers and serving packages at /opt/tsctl) and
what the archives need, pinned."""

from pathlib import Path
from typing import List

from .. import mlserver
from . import tsctl_image
from .images import CPU_TORCH_INDEX, PYTHON, pinned, pins, with_archive_lines, write_context
from .options import SeldonOptions
from .seldon_plan import RUNTIME_PATH, Entry

IMAGE_DIR = "server-image"
# python:X.Y-slim with this environment's Python, MLServer and the pins below: what samples/runtime_env.py's
# mlserver venv (the tests' server) holds. Seldon's own mlserver image has Python 3.10, where several pins
# have no wheels.
BASE_IMAGE = f"python:{PYTHON}-slim"
# The runtime's own imports (serving/mlserver_runtime.py, engine_workers.py: TorchServe's worker) and the
# toolkit handlers', at the versions installed here; MLServer at the release the runtime is tested with;
# captum, which TorchServe's own vision handlers import (pytorch/serve's image examples).
BASE_PACKAGES = ("torch", "torchvision", "torchserve", "numpy", "Pillow", "PyYAML", "captum")
TEXT_PACKAGES = ("transformers", "safetensors")


def requirements(archives: List[Path], text: bool) -> str:
    """The runtime's packages at the versions installed here, then each archive's own requirement lines
    (read as the tsctl engine's image reads them, archiver/export/tsctl_image.py: without that engine's server
    packages, which would replace MLServer's own)."""
    names = BASE_PACKAGES + (TEXT_PACKAGES if text else ())
    lines = [mlserver.REQUIREMENT] + [pinned(name) for name in names]
    engine_pins = pins(tsctl_image.BASE_PACKAGES)
    for line in with_archive_lines(engine_pins, archives):
        if line not in engine_pins and line not in lines:
            lines.append(line)
    return "\n".join(lines) + "\n"


DOCKERFILE = """\
# Seldon Core 2's MLServer with tsctl's runtime (serving.mlserver_runtime.ArchiveModel): the image
# server.yaml's mlserver container runs, started as Seldon's mlserver image starts (the ServerConfig sets
# its ports and MLSERVER_MODELS_DIR), through serving/mlserver_start.py: no REST model repository load or
# unload (Seldon's agent uses gRPC's), request bodies bounded. From the directory DEPLOY.md is in:
#   docker build -t {image} {context} && docker push {image}
FROM {base}
ARG TORCH_INDEX={torch_index}
RUN useradd --uid 1000 --create-home mlserver
COPY requirements.txt {runtime}/requirements.txt
RUN pip install --no-cache-dir --extra-index-url "$TORCH_INDEX" -r {runtime}/requirements.txt
COPY handlers/ {runtime}/handlers/
COPY serving/ {runtime}/serving/
ENV PYTHONPATH={runtime} PYTHONUNBUFFERED=1 MLSERVER_MODELS_DIR=/mnt/agent/models
USER 1000
CMD ["sh", "-c", "exec python -m serving.mlserver_start start \\"$MLSERVER_MODELS_DIR\\""]
"""


def write_image_context(out: Path, options: SeldonOptions, entries: List[Entry]) -> List[Path]:
    """OUT/server-image/: Dockerfile, requirements.txt, the handlers and serving packages."""
    dockerfile = DOCKERFILE.format(
        image=options.image, context=IMAGE_DIR, base=BASE_IMAGE, torch_index=CPU_TORCH_INDEX, runtime=RUNTIME_PATH
    )
    text = any(entry.kind == "text" for entry in entries)
    return write_context(out / IMAGE_DIR, dockerfile, requirements([entry.archive for entry in entries], text))
