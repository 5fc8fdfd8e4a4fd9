"""TorchServe 0.12 and tsctl's engine side by side, for the management API and token authorization: the
same tree (echo 1.0 in the snapshot; echo 2.0 and an archive that cannot load beside it in the store),
each started by tsctl's runtimes on free 127.0.0.1 ports (management on a port of its own, as ``tsctl
serve`` starts both), and the same call to each with the key it asks for; answers normalised where
they must differ (pids, worker ids, times, memory)."""

import concurrent.futures
import json
import os
import subprocess
import sys
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Optional

import psutil

from archiver import engines, server

BIN = Path(sys.executable).parent
SIDES = ("torchserve", "tsctl")

ECHO = """\
import json, os


def handle(data, context):
    if data is None:
        return None
    out = []
    for row in data:
        body = row.get("body") if row.get("body") is not None else row.get("data")
        if isinstance(body, (bytes, bytearray)):
            body = bytes(body).decode()
        out.append({"echo": body if isinstance(body, str) else json.dumps(body), "pid": os.getpid()})
    return out
"""
BROKEN = """\
def handle(data, context):
    raise RuntimeError("this model cannot load")
"""


def build_store(root: Path, echo: str = ECHO) -> Path:
    """``root/model-store``: echo.mar (echo 1.0), echo2.mar (echo 2.0), broken.mar (fails to load), made
    by torch-model-archiver (``echo``: the echo handler's source)."""
    store = root / "model-store"
    store.mkdir(parents=True)
    for name, version, text, out in (
        ("echo", "1.0", echo, "echo"),
        ("echo", "2.0", echo, "echo2"),
        ("broken", "1.0", BROKEN, "broken"),
    ):
        folder = root / f"src-{out}"
        folder.mkdir()
        (folder / f"{out}.py").write_text(text)
        command = [
            str(BIN / "torch-model-archiver"),
            "--model-name",
            name,
            "--version",
            version,
            "--handler",
            str(folder / f"{out}.py"),
            "--export-path",
            str(folder),
        ]
        subprocess.run(command, check=True, capture_output=True, env=dict(os.environ, TMPDIR=str(root)))
        (folder / f"{name}.mar").rename(store / f"{out}.mar")
    return store


def write_config(root: Path, name: str = "config.properties", **extra: str) -> Path:
    """A config both serve: echo 1.0 (1 to 2 workers) from the snapshot, the model API on, archives from the
    store only (``allowed_urls``), token authorization as TorchServe's default (on) unless ``extra`` says."""
    store = root / "model-store"
    entry = {
        "defaultVersion": True,
        "marName": "echo.mar",
        "minWorkers": 1,
        "maxWorkers": 2,
        "batchSize": 1,
        "maxBatchDelay": 100,
        "responseTimeout": 120,
    }
    snapshot = {"name": "startup.cfg", "modelCount": 1, "models": {"echo": {"1.0": entry}}}
    settings = {
        "enable_envvars_config": "true",
        "enable_model_api": "true",
        "model_store": str(store),
        "allowed_urls": f"file://{store}/.*",
        **extra,
    }
    lines = [f"{key}={value}" for key, value in settings.items()] + [f"model_snapshot={json.dumps(snapshot)}"]
    config = root / name
    config.write_text("\n".join(lines) + "\n")
    return config


def start(side: str, root: Path, config: Path, home: Path) -> server.Server:
    env = {"OMP_NUM_THREADS": "1"}  # every worker of one environment: one fork server on the engine
    return engines.named(side).start(root / "model-store", config, home, 180, env=env)


@contextmanager
def pair(root: Path, config: Path, homes: Dict[str, Path]):
    """TorchServe and the engine on ``config``, started at once; stopped after."""
    running: Dict[str, server.Server] = {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {side: pool.submit(start, side, root, config, homes[side]) for side in SIDES}
        try:
            for side, future in futures.items():
                running[side] = future.result()
            yield {side: Side(side, running[side]) for side in SIDES}
        finally:
            for side, future in futures.items():
                if side not in running and future.exception() is None:
                    running[side] = future.result()
            for srv in running.values():
                engines.engine_of(srv).stop(srv)


class Side:
    """One server, called as a client scripts it: with the key an API asks for (from its key_file.json)."""

    def __init__(self, name: str, srv: server.Server):
        self.name, self.srv = name, srv

    def key(self, which: str) -> str:
        return json.loads((Path(self.srv.home) / "key_file.json").read_text())[which]["key"]

    def call(
        self,
        method: str,
        path: str,
        key: Optional[str] = "management",
        api: Optional[str] = None,
        body: Optional[bytes] = None,
        headers: Optional[dict] = None,
        timeout: float = 120,
    ):
        """(status, body) of one call. ``key``: the key file's ``management``, ``inference`` or ``API`` key,
        None for no Authorization header, anything else sent as it is (``Bearer wrong``). ``api``: which
        listener (default: management for /models and /token, inference otherwise)."""
        api = api or ("management" if path.startswith(("/models", "/token")) else "inference")
        base = self.srv.management if api == "management" else self.srv.inference
        sent = dict(headers or {})
        if key in ("management", "inference", "API"):
            sent["Authorization"] = f"Bearer {self.key(key)}"
        elif key is not None:
            sent["Authorization"] = key
        return server.request(base + path, body, method, sent, timeout)

    def workers(self, name: str, version: str = "") -> list:
        status, body = self.call("GET", f"/models/{name}/{version}".rstrip("/"))
        assert status == 200, (self.name, body)
        return body[0]["workers"]

    def descendants(self) -> set:
        """Every process the server runs (its workers, TorchServe's Java, the engine's fork servers)."""
        try:
            return {
                p.pid
                for p in psutil.Process(self.srv.pid).children(recursive=True)
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            }
        except psutil.Error:
            return set()


def normal(body):
    """An answer with what must differ between two servers replaced: each worker's id, pid, start time
    and memory (describe); a describe of several versions sorted by version."""
    if isinstance(body, list) and body and all(isinstance(m, dict) and "workers" in m for m in body):
        return [normal_model(m) for m in sorted(body, key=lambda m: m.get("modelVersion", ""))]
    return body


def normal_model(model: dict) -> dict:
    model = dict(model)
    model["workers"] = [{**w, "id": "*", "pid": "*", "startTime": "*", "memoryUsage": "*"} for w in model["workers"]]
    return model


def query(**values) -> str:
    return "?" + urllib.parse.urlencode(values)
