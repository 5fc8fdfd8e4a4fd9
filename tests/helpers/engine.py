"""The tsctl engine (``python -m serving.engine``) as a whole process, and the TorchServe tree it serves."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from archiver import server
from archiver.server import free_port, free_ports  # noqa: F401 - free_port: the tests' import of it
from helpers import waiting
from helpers.paths import ROOT, short_tmp

BIN = Path(sys.executable).parent


def snapshot_entry(mar: str, workers: int, batch: int, delay: int, timeout: int) -> dict:
    return {
        "1.0": {
            "defaultVersion": True,
            "marName": mar,
            "minWorkers": workers,
            "maxWorkers": workers,
            "batchSize": batch,
            "maxBatchDelay": delay,
            "responseTimeout": timeout,
        }
    }


def write_config(path: Path, models: dict, extra: str = "") -> Path:
    snapshot = {"name": "startup.cfg", "modelCount": len(models), "models": models}
    path.write_text(
        "inference_address=http://0.0.0.0:8085\nmax_request_size=16777216\ndisable_token_authorization=true\n"
        f"{extra}model_snapshot={json.dumps(snapshot)}\n"
    )
    return path


def engine_command(model_store: Path, *arguments: str) -> list:
    """``python -m serving.engine --model_store MODEL_STORE ARGUMENTS``, in this Python."""
    return [sys.executable, "-m", "serving.engine", "--model_store", str(model_store), *arguments]


class Engine:
    """``python -m serving.engine`` on free ports, detached; ``stop()`` ends its process group. ``config``:
    root/config/config.properties by default; a root without that file is served without a config (every
    archive of its store)."""

    def __init__(
        self, root: Path, *extra: str, config: Path = None, timeout: float = 240, preexec_fn=None, env: dict = None
    ):
        self.home = short_tmp("engine-")
        self.http, self.grpc, self.ts_grpc, self.ts_grpc_management = free_ports(4)  # the last two TorchServe's gRPC
        self.url = f"http://127.0.0.1:{self.http}"
        self.out = self.home / "engine.out"
        default = root / "config" / "config.properties"
        given = [] if config is None and not default.exists() else ["--ts_config", str(config or default)]
        command = engine_command(
            root / "model-store",
            *given,
            "--host",
            "127.0.0.1",
            "--http_port",
            str(self.http),
            "--grpc_port",
            str(self.grpc),
            "--grpc_inference_port",
            str(self.ts_grpc),
            "--grpc_management_port",
            str(self.ts_grpc_management),
            "--metrics_port",
            str(self.http),
            *extra,
        )  # /metrics on http: metrics_address unbound
        with open(self.out, "wb") as out:
            path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
            env = dict(os.environ, **(env or {}), TEMP=str(self.home), PYTHONPATH=path)  # where it writes its keys
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                preexec_fn=preexec_fn,
                cwd=self.home,
            )
        self.timeout = timeout

    def wait_ready(self):
        """Until /v2/health/ready answers 200, as long as the engine makes progress (helpers/waiting.py)."""

        def health():
            return server.request(f"{self.url}/v2/health/ready", headers=self.headers(), timeout=5)[0]

        waiting.until(
            health, lambda status: status == 200, "the engine is not ready", self.out, self.alive, self.timeout
        )
        return self

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def headers(self, api: str = "inference") -> dict:
        """The engine's key for ``api`` (management, inference or API) when token authorization is on (its
        key_file.json, where it runs)."""
        try:
            key = json.loads((self.home / "key_file.json").read_text())[api]["key"]
        except (OSError, ValueError, KeyError):
            key = None
        return {"Authorization": f"Bearer {key}"} if key else {}

    def get(self, path: str, api: str = ""):
        """GET with the key the path asks for (management for /models, else inference) when tokens are on."""
        api = api or ("management" if path.startswith(("/models", "/token")) else "inference")
        return server.request(self.url + path, headers=self.headers(api), timeout=30)

    def post(self, path: str, body: bytes, kind: str = "text/plain", timeout: float = 60):
        api = "management" if path.startswith(("/models", "/token")) else "inference"
        return server.request(self.url + path, body, "POST", {"Content-Type": kind, **self.headers(api)}, timeout)

    def workers(self, model: str) -> list:
        status, body = self.get(f"/models/{model}", "management")
        assert status == 200, body
        return body[0]["workers"]

    def stop(self, group: bool = True):
        """SIGTERM to the group, as tsctl stop and a pod's end send it (``group=False``: to the engine
        alone, as to a container's PID 1); then nothing of it may remain."""
        try:
            os.kill(self.process.pid, signal.SIGTERM) if not group else os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        code = self.process.wait(45)
        deadline = time.monotonic() + 10
        while server.group_members(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = server.group_members(self.process.pid)
        if left:
            os.killpg(self.process.pid, signal.SIGKILL)
        assert not left, f"processes of the engine outlived it: {left}"
        return code


def received(sock: socket.socket, until: bytes) -> bytes:
    """What the server sent, read until ``until`` arrives or it closes (head and body may come apart)."""
    data = b""
    while until not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data
