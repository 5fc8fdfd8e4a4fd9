"""The tsctl engine's runtime image, built and run for real (``make image-test``; in ``make matrix`` too):
docs/kserve.md's kserve-image-base, kserve-image-settings, kserve-image and kserve-image-stop blocks as
written. Debian's tools installed where missing, a Debian bookworm root (debootstrap) imported as the base,
podman's settings where its defaults cannot start a container, the export's recipe built on the base with
podman, the container run with the exported tree at /mnt/models, the runtime's own arguments, envelope,
user, capabilities and resources; answered with curl, ``tsctl verify --url`` (v1 and v2) and, here,
tritonclient over HTTP and gRPC, each answer the archive's in-process one. Skipped, saying why, where it
cannot run: not root, no apt-get to install a missing tool, or podman unable to start a container even with
the settings block's.

The root and the base image are kept in /var/cache/tsctl-image, the image's layers in podman's storage:
a rerun builds nothing that did not change (the first run: minutes, most of it pip)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import grpc_client
from helpers.hostile import assert_close
from serving.local_model import LocalModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from test_readme import run_blocks  # noqa: E402 - the docs' block runner, beside it

CONTAINER = "tsctl-vision"  # the blocks' container name
CONF = Path("/var/cache/tsctl-image/containers.conf")  # kserve-image-settings' file, where podman needs one
TOOLS = ("podman", "runc", "debootstrap", "curl")  # what kserve-image-base installs where one is missing


def missing() -> str:
    """Why the blocks cannot run here at all (not root; a tool missing and no apt-get to install it), or ''."""
    if os.geteuid() != 0:
        return "needs root: apt-get, debootstrap, chroot and rootful podman (docs/kserve.md)"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent and shutil.which("apt-get") is None:
        return f"{', '.join(absent)} not installed, and no apt-get to install them"
    return ""


def port(number: int) -> str:
    done = subprocess.run(["podman", "port", CONTAINER, str(number)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.matrix
@pytest.mark.timeout(5400)
def test_the_runtime_image_serves_the_export_as_kserve_runs_it(tmp_path, monkeypatch):
    why = missing()
    if why:
        pytest.skip(why)
    repository = tmp_path / "repo"
    repository.mkdir()
    print(run_blocks(repository, "kserve-image-base", timeout=1800))  # debootstrap and import: once per machine
    try:
        print(run_blocks(repository, "kserve-image-settings", timeout=600))
    except AssertionError as failed:  # podman's last words with the settings too
        pytest.skip(f"podman cannot start a container here: {str(failed).strip().splitlines()[-1]}")
    if CONF.exists():  # as the blocks give it to podman, for this test's own podman calls
        monkeypatch.setenv("CONTAINERS_CONF", str(CONF))
    subprocess.run(["podman", "rm", "-f", CONTAINER], capture_output=True, timeout=120)  # a failed run's
    try:
        out = run_blocks(repository, "kserve-image", timeout=3600)
        print(out)  # the build time and the start time, with -s
        assert re.search(r"^built in \d+ s$", out, re.M) and re.search(r"^ready [\d.]+ s after podman run$", out, re.M)
        assert out.count("1 of 1 golden answers match") == 2, out  # v1 and v2, through tsctl verify
        assert re.search(r'"(tabby|tiger_cat|Egyptian_cat|class_\d+)"', out), out  # /predictions' answer
        assert re.search(r"^ts_", out, re.M), out

        kitten = (repository / "golden" / "kitten.jpg").read_bytes()
        with LocalModel(repository / "model-store" / "resnet18.mar") as local:
            [want] = local.predict_rows([{"body": kitten}], [{"Content-Type": "image/jpeg"}])
        assert want.status == 200
        http_answer = tritonclient_http(port(8080), kitten)
        assert_close(http_answer, want.json())
        answer = grpc_client.call(port(8081), "resnet18", [kitten])
        assert answer["server_ready"] and answer["model_ready"]
        assert_close([json.loads(a) for a in answer["answers"]], [http_answer])
        inspected = subprocess.run(
            ["podman", "inspect", CONTAINER], capture_output=True, text=True, timeout=60, check=True
        )
        [container] = json.loads(inspected.stdout)
        assert container["Config"]["User"] == "1000" and container["HostConfig"]["CapDrop"]
        assert "TS_SERVICE_ENVELOPE=kserve" in container["Config"]["Env"]
        assert container["Args"][-4:] == [
            "--model_store=/mnt/models/model-store",
            "--ts_config=/mnt/models/config/config.properties",
            "--http_port=8080",
            "--grpc_port=8081",
        ]
    finally:
        stop = tmp_path / "stop"
        stop.mkdir()
        run_blocks(stop, "kserve-image-stop", timeout=120)
    gone = subprocess.run(["podman", "container", "exists", CONTAINER], timeout=60)
    assert gone.returncode == 1


def tritonclient_http(address: str, jpeg: bytes):
    import tritonclient.http as triton

    client = triton.InferenceServerClient(address, connection_timeout=60, network_timeout=120)
    assert client.is_server_ready() and client.is_model_ready("resnet18")
    tensor = triton.InferInput("input-0", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([jpeg], dtype=np.object_), binary_data=True)
    result = client.infer("resnet18", [tensor], outputs=[triton.InferRequestedOutput("output-0", binary_data=False)])
    [element] = result.get_response()["outputs"][0]["data"]
    return json.loads(element)
