"""tsctl doctor: the real checks on this machine (which has what TorchServe needs), then problems made for
real by the environment (no java on PATH, an old java in JAVA_HOME, a TMPDIR that is not there, too little
disk, no MLServer), each one line with its fix; --json against its documented schema; --help."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from archiver import doctor

ROOT = Path(__file__).resolve().parents[2]
MODEL_LIBRARIES = {"torch", "torchvision", "transformers", "numpy", "ts", "kserve", "mlserver"}

# The schema docs/json-output.md gives for `tsctl doctor --json`.
SCHEMA = {
    "type": "object",
    "required": ["ok", "checks"],
    "additionalProperties": False,
    "properties": {
        "ok": {"type": "boolean"},
        "checks": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "ok", "detail", "fix", "needed_for"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "ok": {"type": "boolean"},
                    "detail": {"type": "string"},
                    "fix": {"type": ["string", "null"]},
                    "needed_for": {"type": "string"},
                },
            },
        },
    },
}


def tsctl_doctor(*args, env=None, cwd=None, importtime=False):
    environment = dict(os.environ, PYTHONPATH=str(ROOT)) if env is None else dict(env, PYTHONPATH=str(ROOT))
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "archiver.cli", "doctor", *args]
    return subprocess.run(command, env=environment, cwd=cwd or ROOT, capture_output=True, text=True, timeout=300)


def lines_of(done) -> dict:
    """The check lines by check name: 'ok      NAME (for ...): ...' / 'problem NAME (for ...): ...; fix: ...'."""
    found = {}
    for line in done.stdout.splitlines():
        state, name = line.split()[:2]
        assert state in ("ok", "problem"), line
        assert (state == "problem") == ("; fix: " in line), line
        found[name] = line
    return found


def without(env: dict, *names) -> dict:
    return {key: value for key, value in env.items() if key not in names}


def fake_java(home: Path, version_line: str) -> Path:
    """A JAVA_HOME whose bin/java prints ``version_line`` on stderr, as ``java -version`` does."""
    java = home / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\necho 'OpenJDK Runtime Environment' >&2\n")
    java.chmod(0o755)
    return home


def test_this_machine_has_what_torchserve_needs():
    done = tsctl_doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    lines = lines_of(done)
    assert list(lines) == [check.name for check in doctor.run_checks()]  # one line per check, in order
    for name in ("python", "torchserve", "java"):
        assert lines[name].startswith(f"ok      {name} (for torchserve): "), lines[name]
    assert "Java " in lines["java"] and "at " in lines["java"]
    assert lines["gpu"].startswith("ok      gpu (for GPUs (number_of_gpu, deviceType: gpu, --gpu)): no GPU ("), lines
    assert lines["gpu"].endswith("): workers run on the CPU")


def test_gpus_named_but_not_seen_by_torch_name_the_fix(tmp_path, monkeypatch):
    """CUDA_VISIBLE_DEVICES names two GPUs, which TorchServe would count; this torch (a CUDA build, no driver)
    sees none: a problem naming the CUDA build of torch, without changing the exit code."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    check = doctor.gpu_check()
    assert not check.ok and check.detail.startswith("2 GPU(s) [], driver None; torch ") and "sees 0" in check.detail
    assert "install a CUDA build of torch" in check.fix
    assert doctor.all_ok([check])  # GPUs are no need of the default engine


def test_no_java_on_path_and_no_java_home_names_the_fix(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    done = tsctl_doctor(env=dict(without(os.environ, "JAVA_HOME"), PATH=str(empty)))
    assert done.returncode == 1, done.stdout + done.stderr
    assert lines_of(done)["java"] == (
        "problem java (for torchserve): no java on PATH and JAVA_HOME is not set; fix: install a JDK 17+ "
        "(e.g. apt-get install openjdk-17-jre-headless) and put its bin/ on PATH, or set JAVA_HOME"
    )


@pytest.mark.parametrize(
    "version_line, shown",
    [('openjdk version "11.0.2" 2019-01-15', "11.0.2"), ('java version "1.8.0_301"', "1.8.0_301")],
)
def test_a_java_home_with_an_old_java_is_too_old(tmp_path, version_line, shown):
    home = fake_java(tmp_path / "jdk", version_line)
    done = tsctl_doctor(env=dict(os.environ, JAVA_HOME=str(home)))  # JAVA_HOME wins over PATH, as for TorchServe
    assert done.returncode == 1, done.stdout + done.stderr
    line = lines_of(done)["java"]
    assert line.startswith(
        f"problem java (for torchserve): Java {shown} at {home}/bin/java (from JAVA_HOME={home}) is too old: "
        "TorchServe 0.12 needs Java 17+; fix: install a JDK 17+"
    ), line
    assert line.endswith(f"or point JAVA_HOME at it (JAVA_HOME={home} now)")


def test_a_java_home_with_java_17_is_enough(tmp_path):
    home = fake_java(tmp_path / "jdk", 'openjdk version "17.0.2" 2022-01-18')
    done = tsctl_doctor(env=dict(os.environ, JAVA_HOME=str(home)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        lines_of(done)["java"]
        == f"ok      java (for torchserve): Java 17.0.2 at {home}/bin/java (from JAVA_HOME={home})"
    )


def test_a_java_home_without_java(tmp_path):
    done = tsctl_doctor(env=dict(os.environ, JAVA_HOME=str(tmp_path)))
    assert done.returncode == 1
    assert lines_of(done)["java"].startswith(
        f"problem java (for torchserve): JAVA_HOME={tmp_path} has no bin/java; fix: "
    )


def test_a_missing_tmpdir_is_reported_without_failing_torchserve(tmp_path):
    gone = tmp_path / "gone"
    done = tsctl_doctor(env=dict(os.environ, TMPDIR=str(gone)))
    assert done.returncode == 0, done.stdout + done.stderr  # not what TorchServe needs to start
    assert lines_of(done)["disk-tmp"] == (
        f"problem disk-tmp (for pip and uv downloads: torch wheels): TMPDIR={gone} is not a writable directory "
        f"(pip, uv and Python would fall back to another); fix: create {gone} or unset TMPDIR"
    )


def test_short_disk_names_where_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    enough = {check.name: check for check in doctor.disk_checks(min_free=1)}
    assert enough["disk-tmp"].ok and enough["disk-tmp"].detail.endswith(f"GiB free in {tmp_path} (TMPDIR)")
    short = {check.name: check for check in doctor.disk_checks(min_free=1 << 60)}  # more than any disk here
    assert not short["disk-cwd"].ok and not short["disk-tmp"].ok
    assert (
        short["disk-cwd"].line().endswith("fix: free space there (at least 1073741824 GiB), or work from a bigger disk")
    )
    assert short["disk-tmp"].fix.endswith("or point TMPDIR at a bigger disk")
    assert doctor.all_ok(short.values())  # disk space warns; the exit code is TorchServe's


def test_mlserver_says_where_it_looked(tmp_path):
    if doctor._found("mlserver"):
        pytest.skip("MLServer is installed in this Python")
    check = doctor.mlserver_check(tmp_path)
    venv_python = tmp_path / "mlserver-1.7.1" / "bin" / "python"
    assert not check.ok and check.needed_for == "--engine mlserver"
    assert check.detail == f"MLServer is neither in {sys.executable} nor in {venv_python}"
    assert check.fix.startswith(f"run 'make runtimes' in tsctl's checkout and serve with --python {venv_python}")
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\nexit 0\n")  # a venv python that finds mlserver and ts
    venv_python.chmod(0o755)
    check = doctor.mlserver_check(tmp_path)
    assert check.ok and check.detail.endswith(f"serve with --python {venv_python}")


def test_a_missing_kserve_module_names_the_extra(monkeypatch):
    monkeypatch.setattr(doctor, "KSERVE_MODULES", ("kserve", "tsctl_no_such_module"))
    check = doctor.kserve_check()
    assert not check.ok and check.detail.startswith("tsctl_no_such_module not importable in ")
    assert "uv sync --extra kserve" in check.fix and "pip install 'tsctl[kserve]'" in check.fix


def test_json_matches_the_documented_schema(tmp_path):
    done = tsctl_doctor("--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["ok"] is True
    assert all(check["ok"] == (check["fix"] is None) for check in report["checks"])
    empty = tmp_path / "bin"
    empty.mkdir()
    done = tsctl_doctor("--json", env=dict(without(os.environ, "JAVA_HOME"), PATH=str(empty)))
    assert done.returncode == 1
    report = json.loads(done.stdout)
    jsonschema.validate(report, SCHEMA)
    [java] = [check for check in report["checks"] if check["name"] == "java"]
    assert report["ok"] is False and java["ok"] is False and java["needed_for"] == "torchserve"
    assert java["fix"].startswith("install a JDK 17+")


def test_the_schema_is_the_documented_one():
    doc = (ROOT / "docs" / "json-output.md").read_text()
    section = doc.split("## tsctl doctor", 1)[1]
    example = json.loads(section.split("```json", 1)[1].split("```", 1)[0])
    jsonschema.validate(example, SCHEMA)
    for key in ("name", "ok", "detail", "fix", "needed_for"):
        assert f"`{key}`" in section


def test_help_and_no_model_library_loaded():
    done = subprocess.run(
        [sys.executable, "-m", "archiver.cli", "doctor", "--help"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "--json" in done.stdout and "Exits 0" in done.stdout, done.stderr
    done = tsctl_doctor(importtime=True)
    modules = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert not modules & MODEL_LIBRARIES, modules & MODEL_LIBRARIES
