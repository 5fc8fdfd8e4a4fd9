"""tsctl serve never hangs: a crash-looping worker fails fast with the worker's own error."""

import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver import properties, server
from archiver.cli import main
from archiver.errors import ServerError
from conftest import package_resnet, short_tmp


def test_a_worker_that_cannot_load_fails_serve_with_its_error(image_sample, tmp_path):
    broken = tmp_path / "sample"
    broken.mkdir()
    for name in ("model.py", "index_to_name.json", "model-config.yaml"):
        (broken / name).write_bytes((image_sample / name).read_bytes())
    (broken / "resnet18.pt").write_bytes(b"these are not weights" * 100)
    store = tmp_path / "model-store"
    package_resnet(broken, store)
    home = short_tmp("ts-")
    config = properties.write_config(store, home / "config.properties")
    started = time.monotonic()
    with pytest.raises(ServerError) as caught:
        server.start(config, store, home, timeout=240)
    elapsed = time.monotonic() - started
    assert "resnet18.pt could not be read by torch.load" in str(caught.value)
    assert elapsed < 120, f"took {elapsed:.0f}s to notice the crash loop"
    assert server.read_state(home) is None  # start() stopped what it started
    assert not processes_mentioning(str(home)), "a TorchServe process outlived the failed start"
    shutil.rmtree(home, ignore_errors=True)


def processes_mentioning(text):
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_serve_without_a_config_is_a_user_error(tmp_path):
    result = CliRunner().invoke(main, ["serve", "--config", str(tmp_path / "none.properties"), "--home", str(tmp_path)])
    assert result.exit_code == 2
    assert "does not exist: write it with 'tsctl config'" in result.output
