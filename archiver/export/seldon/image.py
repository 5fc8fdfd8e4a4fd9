"""``tsctl export seldon``'s server-image/: the build context of the image the Server's mlserver container
runs: python:X.Y-slim, MLServer, tsctl's runtime (the handlers and serving packages at /opt/tsctl) and
what the archives need, pinned."""

from pathlib import Path
from typing import List

from ... import mlserver
from ..archive_facts import ArchiveFacts
from ..core import render
from ..images import PYTHON, pinned, pins, torch_index, with_archive_lines, write_context
from ..kserve import tsctl_image
from ..options import SeldonOptions
from .plan import RUNTIME_PATH, Entry

IMAGE_DIR = "server-image"
# python:X.Y-slim with this environment's Python, MLServer and the pins below: what samples/runtime_env.py's
# mlserver venv (the tests' server) holds. Seldon's own mlserver image has Python 3.10, where several pins
# have no wheels.
BASE_IMAGE = f"python:{PYTHON}-slim"
# The runtime's own imports (serving/runtimes/mlserver_runtime.py, serving/engine/workers.py: TorchServe's worker)
# and the toolkit handlers', at the versions installed here; MLServer at the release the runtime is tested with;
# captum, which TorchServe's own vision handlers import (pytorch/serve's image examples).
BASE_PACKAGES = ("torch", "torchvision", "torchserve", "numpy", "Pillow", "PyYAML", "captum", "nvidia-ml-py")
TEXT_PACKAGES = ("transformers", "safetensors")


def requirements(archives: List[ArchiveFacts], text: bool) -> str:
    """The runtime's packages at the versions installed here, then each archive's own requirement lines
    (read as the tsctl engine's image reads them, archiver/export/kserve/tsctl_image.py: without that engine's server
    packages, which would replace MLServer's own)."""
    names = BASE_PACKAGES + (TEXT_PACKAGES if text else ())
    lines = [mlserver.REQUIREMENT] + [pinned(name) for name in names]
    engine_pins = pins(tsctl_image.BASE_PACKAGES)
    for line in with_archive_lines(engine_pins, archives):
        if line not in engine_pins and line not in lines:
            lines.append(line)
    return "\n".join(lines) + "\n"


def write_image_context(out: Path, options: SeldonOptions, entries: List[Entry]) -> List[Path]:
    """OUT/server-image/: Dockerfile (templates/seldon-image.Dockerfile), requirements.txt, the handlers and
    serving packages."""
    text = any(entry.kind == "text" for entry in entries)
    recipe = dockerfile("seldon-image.Dockerfile", options.image, IMAGE_DIR, options.gpus)
    return write_context(out / IMAGE_DIR, recipe, requirements([entry.facts for entry in entries], text))


def dockerfile(template: str, image: str, context: str, gpus: int) -> str:
    """A Seldon image's Dockerfile (templates/TEMPLATE: Core 2's server, Core 1's components): BASE_IMAGE, the
    torch build for ``gpus``, the handlers and serving packages under RUNTIME_PATH, built from OUT/``context``."""
    return render(
        template, image=image, context=context, base=BASE_IMAGE, torch_index=torch_index(gpus), runtime=RUNTIME_PATH
    )
