"""What both image recipes share (the tsctl engine's predictor-image/, Seldon's server-image/): pins at the
versions installed here, each archive's own requirement lines checked, and tsctl's packages copied into
the build context. No torch import here: versions come from the installed distributions' metadata."""

import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Iterable, List

import serving
from handlers import archives as archive_files

from .archive_facts import ArchiveFacts

CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# PyPI itself: its Linux torch wheels are the CUDA build (an image asked for with --gpus)
CUDA_TORCH_INDEX = "https://pypi.org/simple"


def torch_index(gpus: int) -> str:
    """Where an image's torch comes from: the CPU build, unless its containers are given GPUs."""
    return CUDA_TORCH_INDEX if gpus else CPU_TORCH_INDEX


PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"  # the images' Python: this one's


def pins(names: Iterable[str]) -> List[str]:
    """``NAME==VERSION`` for each, as installed here (PackageNotFoundError for one that is not)."""
    return [f"{name}=={metadata.version(name)}" for name in names]


def pinned(name: str) -> str:
    """``name==VERSION`` as installed here, else the bare name."""
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


def with_archive_lines(lines: List[str], archives: List[ArchiveFacts]) -> List[str]:
    """``lines`` and then each archive's own requirement lines that are not among them yet, each checked when
    the archive was read to be a plain requirement (archiver/requirements.py: ``docker build`` would fetch a
    URL or run a local setup.py)."""
    lines = list(lines)
    for archive in archives:
        lines += [line for line in archive.requirement_lines if line not in lines]
    return lines


def write_context(context: Path, dockerfile: str, requirements: str) -> List[Path]:
    """An image's build context: its Dockerfile, its requirements.txt, and tsctl's packages (``copy_packages``)."""
    context.mkdir(parents=True)
    written = [context / "Dockerfile", context / "requirements.txt"]
    written[0].write_text(dockerfile)
    written[1].write_text(requirements)
    return written + copy_packages(context)


def copy_packages(context: Path) -> List[Path]:
    """The toolkit (``handlers/``) and the serving side (``serving/``) into an image's build context."""
    copied = []
    for package in (archive_files, serving):
        source = Path(package.__file__).parent
        copied.append(context / source.name)
        shutil.copytree(source, copied[-1], ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copied
