"""A .mar built by tsctl loads in a TorchServe whose Python has no tsctl: only what the MAR carries."""

import importlib.metadata
import shutil
import subprocess
import sys

import pytest

from helpers.models import package_resnet
from helpers.paths import short_tmp
from helpers.servers import RunningServer, post
from serving.local_model import LocalModel

RUNTIME = ("torch", "torchvision", "torchserve", "pyyaml", "pillow")


@pytest.fixture(scope="module")
def bare_python():
    """A fresh venv with TorchServe's runtime only (uv links packages from its cache: seconds)."""
    venv = short_tmp("bare-")
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in RUNTIME]
    subprocess.run([sys.executable, "-m", "uv", "venv", "-q", str(venv)], check=True, timeout=120)
    subprocess.run(
        [sys.executable, "-m", "uv", "pip", "install", "-q", "--python", str(venv / "bin/python"), *pins],
        check=True,
        timeout=600,
    )
    yield venv / "bin" / "python"
    shutil.rmtree(venv, ignore_errors=True)


def test_bare_python_cannot_import_the_toolkit(bare_python):
    for module in ("handlers", "serving", "archiver"):
        result = subprocess.run(
            [str(bare_python), "-c", f"import {module}"], capture_output=True, text=True, cwd=bare_python.parents[1]
        )
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr


def test_mar_serves_on_a_torchserve_without_tsctl(bare_python, image_sample, jpegs, tmp_path):
    store = tmp_path / "model-store"
    path = package_resnet(image_sample, store)
    with LocalModel(path) as local:
        expected = local.predict([jpegs[0]])[0].json()
    with RunningServer(store, python=str(bare_python)) as srv:
        status, body = post(srv, "resnet18", jpegs[0], "image/jpeg")
        log = (srv.logs / "model_log.log").read_text(errors="replace")
    assert status == 200, body
    assert list(body) == list(expected)
    assert list(body.values()) == pytest.approx(list(expected.values()), rel=1e-4)
    assert str(bare_python.parents[1]) in log  # the worker really ran the bare venv's Python
