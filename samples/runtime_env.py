"""A local stand-in for a KServe TorchServe image: a venv with the image's Python and packages.

    python -m samples.runtime_env torchserve-kfs:0.9.0      # prints the venv's python

torchserve-kfs:0.9.0 is Python 3.9 with TorchServe 0.9.0, torch 2.1.0, torchvision 0.16.0 and
the rest of ``archiver.kserve_images.RUNTIMES`` (what pytorch/serve's build files install), plus what
the image adds for pytorch/serve's kserve_wrapper: ``kserve[storage]`` 0.13.0 (the wrapper imports
``kserve.storage``, which needs the storage extra's boto3 and friends) and grpcio-tools 1.48 (whose
generated code kserve 0.13's protobuf accepts). PyPI's torch 2.1.0 is a CUDA build; it runs on the
CPU like the image's +cpu build. uv makes the venv (it finds Python 3.9 under pyenv here) and caches
the downloads, so a second build takes seconds; the venv has pip, which TorchServe's per-model
install runs.
"""

import fcntl
import glob
import os
import subprocess
import sys
from pathlib import Path

from archiver.export.seldon.core1 import SELDON_PINS
from archiver.kserve_images import RUNTIMES
from archiver.mlserver import REQUIREMENT

ROOT = Path(__file__).resolve().parent.parent / ".runtimes"
WRAPPER_PACKAGES = ("kserve[storage]==0.13.0", "grpcio-tools==1.48.2", "setuptools==68.2.2", "wheel")


def interpreter(version: str) -> str:
    """A Python of ``version`` for uv: pyenv's install if there is one, else let uv look for it."""
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")))
    return found[-1] if found else version


def ensure(name: str, root: Path = ROOT) -> Path:
    """The python of a venv standing in for runtime ``name``, built once (marked complete by a file)."""
    runtime = RUNTIMES[name]
    packages = [f"{package}=={version}" for package, version in sorted(runtime.pins.items())] + list(WRAPPER_PACKAGES)
    return build(root / name.replace(":", "-"), packages, runtime.python)


# MLServer with tsctl's runtime (serving/runtimes/mlserver_runtime.py), as archiver/export/seldon/image.py's image
# holds it: its fastapi, starlette and protobuf are older than kserve's, so it lives in a venv of its own. The serving
# stack is pinned to this environment's versions, so served answers can be compared with in-process ones.
MLSERVER = "mlserver-1.7.1"
MLSERVER_PACKAGES = (REQUIREMENT, "torchserve==0.12.0")
MLSERVER_SAME = (
    "torch",
    "torchvision",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "Pillow",
    "PyYAML",
    "captum",  # TorchServe's vision handlers import it (pytorch/serve's image examples)
)


def ensure_mlserver(root: Path = ROOT) -> Path:
    """The python of a venv with MLServer 1.7.1 and what the workers import, built once."""
    from importlib import metadata

    return build(root / MLSERVER, list(MLSERVER_PACKAGES) + [f"{n}=={metadata.version(n)}" for n in MLSERVER_SAME])


# Seldon Core 1's Python wrapper (``seldon-core-microservice``: Flask 2.2, gunicorn 20, protobuf 3.20, numpy
# < 2, PyYAML <= 6.0.1; Apache-2.0 up to 1.17.1) with tsctl's components (serving/runtimes/seldon_components.py) and
# what the archives' workers import, as archiver/export/seldon/core1.py's image holds them: its pins clash
# with this environment's, so it lives in a venv of its own, the rest pinned to this environment's versions.
SELDON_CORE = "seldon-core-1.17.1"
SELDON_PACKAGES = SELDON_PINS + ("torchserve==0.12.0",)
SELDON_SAME = ("torch", "torchvision", "Pillow", "captum")  # numpy and PyYAML: SELDON_PINS, what seldon-core allows


def ensure_seldon(root: Path = ROOT) -> Path:
    """The python of a venv with seldon-core 1.17.1 (its ``seldon-core-microservice`` beside it) and what
    the components and their workers import, built once."""
    from importlib import metadata

    return build(root / SELDON_CORE, list(SELDON_PACKAGES) + [f"{n}=={metadata.version(n)}" for n in SELDON_SAME])


def build(venv: Path, packages: list, version: str = f"{sys.version_info.major}.{sys.version_info.minor}") -> Path:
    """A venv of Python ``version`` (this one's by default) holding ``packages``, marked complete by a file
    naming them. Two suites in one checkout build it once: the second waits on a lock beside the venv."""
    python = venv / "bin" / "python"
    done = venv / ".complete"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists() and done.read_text() == "\n".join(packages):
            return python
        uv = [sys.executable, "-m", "uv"]
        subprocess.run(
            uv + ["venv", "--quiet", "--seed", "--allow-existing", "-p", interpreter(version), str(venv)], check=True
        )
        subprocess.run(uv + ["pip", "install", "--quiet", "--python", str(python)] + packages, check=True)
        done.write_text("\n".join(packages))
    return python


if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "torchserve-kfs:0.9.0"
    builders = {MLSERVER: ensure_mlserver, SELDON_CORE: ensure_seldon}
    print(builders[name]() if name in builders else ensure(name))
