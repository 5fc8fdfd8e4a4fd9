"""Servers run for real: TorchServe from a `tsctl config`, the KServe transformer, TorchServe as KServe's
runtime starts it, a stand-in HTTP server; requests to them and what their logs and APIs tell."""

import concurrent.futures
import http.server
import json
import shutil
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from archiver import engines, properties, server
from archiver.engines import torchserve_launch
from helpers import waiting
from helpers.paths import ROOT, short_tmp


class Transformer:
    """``python -m serving.runtimes.kserve_transformer`` for ``archive`` in front of the predictor at
    ``predictor_host``, on free 127.0.0.1 ports, detached; ``url`` once it answers, or ``exit_code``
    and ``output`` if it exits first. ``stop()`` ends its process group."""

    def __init__(self, archive: Path, model: str, predictor_host: str, protocol: str, *extra: str, timeout=120):
        import os
        import subprocess

        port, grpc = server.free_ports(2)
        self.home = short_tmp("tr-")
        self.log = self.home / "transformer.log"
        command = [sys.executable, "-m", "serving.runtimes.kserve_transformer", "--model_name", model]
        command += ["--archive", str(archive), "--predictor_host", predictor_host, "--predictor_protocol", protocol]
        command += ["--http_port", str(port), "--grpc_port", str(grpc), "--enable_grpc", "false", *extra]
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
        self.url, self.exit_code = None, None

        def state():
            exited = self.process.poll() is not None
            return "exited" if exited else server.request(f"http://127.0.0.1:{port}/v1/models/{model}", timeout=2)[0]

        try:  # as long as it makes progress (helpers/waiting.py)
            shown = waiting.until(
                state,
                lambda s: s in ("exited", 200),
                "transformer did not come up",
                self.log,
                timeout=timeout,
                every=0.5,
            )
        except AssertionError:
            self.stop()
            raise
        if shown == "exited":
            self.exit_code = self.process.returncode
        else:
            self.url = f"http://127.0.0.1:{port}"

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self):
        server.stop(server.Server(self.process.pid, str(self.home), "", "", "", []), grace=30)
        shutil.rmtree(self.home, ignore_errors=True)


class RunningServer:
    """Start TorchServe on a model store with a config from `tsctl config`; stop it on exit."""

    def __init__(self, store: Path, python=None, timeout=240, env=None, **overrides):
        self.home = short_tmp("ts-")
        self.config = properties.write_config(store, self.home / "config.properties", overrides)
        self.store = store
        self.python = python
        self.timeout = timeout
        self.env = env
        self.server = None

    def __enter__(self) -> server.Server:
        self.server = torchserve_launch.start(
            self.config, self.store, self.home, timeout=self.timeout, python=self.python, env=self.env
        )
        return self.server

    def __exit__(self, *exc):
        if self.server is not None:
            server.stop(self.server)
        shutil.rmtree(self.home, ignore_errors=True)


def post(srv, model: str, body: bytes, content_type="application/octet-stream", timeout=60):
    headers = {"Content-Type": content_type}
    return server.request(f"{srv.inference}/predictions/{model}", body, "POST", headers, timeout)


def post_concurrently(srv, model, bodies, content_type="application/octet-stream"):
    return post_to_concurrently(srv, f"/predictions/{model}", bodies, content_type)


def post_json_concurrently(srv, path, bodies):
    return post_to_concurrently(srv, path, bodies, "application/json")


def post_to_concurrently(srv, path, bodies, content_type):
    return post_mixed_concurrently(srv, path, [(body, content_type) for body in bodies])


def post_mixed_concurrently(srv, path, bodies):
    """POST each (body, content type) to ``path`` at once, one thread each; (status, body) in order."""
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        futures = [
            pool.submit(server.request, srv.inference + path, body, "POST", {"Content-Type": kind}, 60)
            for body, kind in bodies
        ]
        return [f.result(timeout=120) for f in futures]


def batch_lines(srv):
    """The handler's per-batch log lines from where its engine puts them, parsed."""
    lines = []
    log = engines.engine_of(srv).handler_log(srv)
    for line in log.read_text(errors="replace").splitlines():
        if "tsctl batch " in line:
            fields = dict(f.split("=") for f in line.split("tsctl batch ", 1)[1].split())
            lines.append({k: float(v) if "." in v else int(v) for k, v in fields.items()})
    return lines


def workers(srv, model):
    """(id, start time, pid) of the model's workers, from its engine's management API (both engines
    describe a model as TorchServe does)."""
    status, body = server.request(f"{srv.management}/models/{model}", timeout=10)
    assert status == 200, body
    return [(w["id"], w["startTime"], w["pid"]) for w in body[0]["workers"]]


def as_json(body):
    return json.loads(body) if isinstance(body, str) else body


@contextmanager
def stand_in_http(handler_class):
    """A stand-in HTTP server on a free 127.0.0.1 port answering with ``handler_class`` (its request log
    silenced): its address, ``http://127.0.0.1:PORT``; shut down after."""

    class Quiet(handler_class):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def kserve_runtime(exported, envelope):
    return torchserve_launch.start(
        exported / "config" / "config.properties",
        exported / "model-store",
        short_tmp("ks-"),
        timeout=240,
        kserve_args=True,
        env={"TS_SERVICE_ENVELOPE": envelope},
    )
