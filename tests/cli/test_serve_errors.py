"""tsctl serve never hangs: whatever keeps a model from coming up, it fails within seconds naming the
real cause from TorchServe's logs (the worker's own error, pip's error, the missing archive)."""

import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from archiver import properties, server, torchserve_log
from archiver.cli import main
from archiver.engines import torchserve_launch
from archiver.errors import ServerFailure, UserError
from helpers.models import package_resnet
from helpers.paths import short_tmp


def test_a_worker_that_cannot_load_fails_serve_with_its_error(image_sample, tmp_path):
    broken = tmp_path / "sample"
    broken.mkdir()
    for name in ("model.py", "index_to_name.json", "model-config.yaml"):
        (broken / name).write_bytes((image_sample / name).read_bytes())
    # begins as torch.save's pickle does (what packaging checks), then is not weights: only loading finds out
    (broken / "resnet18.pt").write_bytes(b"\x80\x02" + b"these are not weights" * 100)
    store = tmp_path / "model-store"
    package_resnet(broken, store)
    home = short_tmp("ts-")
    config = properties.write_config(store, home / "config.properties")
    started = time.monotonic()
    with pytest.raises(ServerFailure) as caught:
        torchserve_launch.start(config, store, home, timeout=240)
    elapsed = time.monotonic() - started
    assert "resnet18.pt could not be read by torch.load" in str(caught.value)
    assert str(caught.value).startswith("model resnet18: a model worker failed to start"), caught.value  # whose
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


def failed_start(store, **options):
    """torchserve_launch.start on ``store``; returns (the error it raised, seconds it took); nothing may be left
    running."""
    home = short_tmp("ts-")
    config = properties.write_config(store, home / "config.properties")
    started = time.monotonic()
    try:
        with pytest.raises((ServerFailure, UserError)) as caught:
            torchserve_launch.start(config, store, home, timeout=240, **options)
        return caught.value, time.monotonic() - started
    finally:
        assert server.read_state(home) is None
        assert not processes_mentioning(str(home)), "a TorchServe process outlived the failed start"
        shutil.rmtree(home, ignore_errors=True)


def test_an_import_error_inside_the_users_handler_is_named(image_sample, tmp_path):
    handler = tmp_path / "my_handler.py"
    handler.write_text("import nosuchmodule_tsctl_test\n\n\ndef handle(data, context):\n    return data\n")
    store = tmp_path / "store"
    package_resnet(image_sample, store, handler=str(handler), config_file=None)
    error, seconds = failed_start(store)
    assert "No module named 'nosuchmodule_tsctl_test'" in str(error), error
    assert "ts.torch_handler" not in str(error)  # TorchServe's fallback import, not the cause
    assert seconds < 90, seconds


def test_the_engine_names_a_module_its_python_lacks_and_the_fix(image_sample, tmp_path):
    """pytorch/serve's stateful example imports lru (lru-dict, its requirements.txt): the engine's line named
    the module and no fix (#44's newcomer)."""
    from archiver import engines

    handler = tmp_path / "my_handler.py"
    handler.write_text("import nosuchmodule_tsctl_test\n\n\ndef handle(data, context):\n    return data\n")
    store = tmp_path / "store"
    package_resnet(image_sample, store, handler=str(handler), config_file=None)
    home = short_tmp("te-")
    try:
        with pytest.raises(ServerFailure) as caught:
            engines.named("tsctl").start(store, None, home, 240)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert "No module named 'nosuchmodule_tsctl_test': install 'nosuchmodule_tsctl_test' in the engine's Python" in str(
        caught.value
    ), caught.value


def test_a_failed_per_model_pip_install_is_named_with_pips_error(image_sample, tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("nosuchpackage-tsctl-test==9.9\n")
    store = tmp_path / "store"
    package_resnet(image_sample, store, requirements_file=str(requirements))
    error, seconds = failed_start(store, install_deps=True)
    assert isinstance(error, ServerFailure)
    assert "Custom pip package installation failed for model resnet18" in str(error), error
    assert "No matching distribution found for nosuchpackage-tsctl-test==9.9" in str(error), error
    assert "ACCESS_LOG" not in str(error)
    assert seconds < 90, seconds


def test_a_snapshot_naming_a_missing_archive_is_refused_before_starting(image_sample, tmp_path):
    store = tmp_path / "store"
    package_resnet(image_sample, store)
    home = short_tmp("ts-")
    config = properties.write_config(store, home / "config.properties")
    (store / "resnet18.mar").rename(store / "renamed.mar")
    result = CliRunner().invoke(
        main, ["serve", "--config", str(config), "--model-store", str(store), "--home", str(home)]
    )
    assert result.exit_code == 2, result.output
    assert "model_snapshot names 'resnet18.mar' for model 'resnet18', which is not in" in result.output
    assert not (home / "logs").exists()  # refused before TorchServe started
    shutil.rmtree(home, ignore_errors=True)


def test_install_deps_without_pip_is_a_user_error(image_sample, tmp_path):
    store = tmp_path / "store"
    package_resnet(image_sample, store)
    home = short_tmp("ts-")
    config = properties.write_config(store, home / "config.properties")
    nopip = tmp_path / "python"  # a Python whose environment has no pip
    nopip.write_text("#!/bin/sh\nif [ \"$2\" = pip ]; then echo 'No module named pip' >&2; exit 1; fi\n")
    nopip.chmod(0o755)
    with pytest.raises(UserError, match="--install-deps needs pip"):
        torchserve_launch.start(config, store, home, python=str(nopip), install_deps=True)
    shutil.rmtree(home, ignore_errors=True)


def test_a_home_too_deep_for_a_unix_socket_gets_a_short_temp_that_stop_removes(tmp_path):
    """A project deep in the file system: TEMP/.ts.sock.PORT past 107 bytes failed every worker with
    "AF_UNIX path too long" (README's flow, run from pytest's tmp_path). TEMP moves to a private short
    directory that home/tmp links to; stop removes both. (Served end to end: tests/cli/test_readme.py.)"""
    home = tmp_path / ("deep-" * 12) / ".tsctl"
    home.mkdir(parents=True)
    temp = server.check_home(home)
    assert len(str(temp / ".ts.sock.65535")) < 108 and temp.is_dir()
    assert (home / "tmp").resolve() == temp.resolve() and oct(temp.stat().st_mode)[-3:] == "700"
    (temp / "unpacked").write_text("x")
    again = server.check_home(home)  # a new start clears what the last one left
    assert not temp.exists() and again.is_dir()
    server.remove_temp(home)
    assert not again.exists() and not (home / "tmp").exists()
    shallow = short_tmp("ts-")
    assert server.check_home(shallow) == shallow / "tmp"  # a short home keeps its own tmp/


# What TorchServe 0.12's ts_log.log holds after one death of a worker (copied from a run, each line twice as
# it writes them): "died" and "failed" several times, the retry once a death.
WLM = "W-34300-resnet18_1.0 org.pytorch.serve.wlm"
ONE_DEATH = f"""\
{{t}},212 [INFO ] W-34300-resnet18_1.0-stdout MODEL_LOG - Backend worker process died.
{{t}},224 [DEBUG] {WLM}.WorkerThread - Backend worker monitoring thread interrupted or backend worker process died.
{{t}},245 [WARN ] {WLM}.BatchAggregator - Load model failed: resnet18, error: Worker died.
{{t}},245 [WARN ] {WLM}.BatchAggregator - Load model failed: resnet18, error: Worker died.
{{t}},247 [INFO ] {WLM}.WorkerThread - Retry worker: 34300 in 1 seconds.
{{t}},247 [INFO ] {WLM}.WorkerThread - Retry worker: 34300 in 1 seconds.
"""
ERROR = "{t},214 [INFO ] W-34300-resnet18_1.0-stdout MODEL_LOG - ModuleNotFoundError: No module named 'absent'\n"


def test_a_crash_loop_is_two_deaths_not_two_lines_of_one(tmp_path):
    """One death is not a loop yet: its error may still be on its way to model_log.log (a fresh clone's run
    reported "see the log" for the import error above, the error logged a moment later)."""
    server = SimpleNamespace(logs=tmp_path)
    ts_log, model_log = tmp_path / "ts_log.log", tmp_path / "model_log.log"
    ts_log.write_text(ONE_DEATH.format(t="2026-11-28T15:06:10"))
    model_log.write_text("")
    assert torchserve_log.worker_failure(server) is None
    ts_log.write_text(ts_log.read_text() + ONE_DEATH.format(t="2026-11-28T15:06:11"))
    assert torchserve_log.worker_failure(server) == "see the log"
    model_log.write_text(ERROR.format(t="2026-11-28T15:06:10"))
    assert torchserve_log.worker_failure(server) == "ModuleNotFoundError: No module named 'absent'"
