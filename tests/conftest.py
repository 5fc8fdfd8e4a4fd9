"""Shared fixtures: sample models built on the spot, archives, and real TorchServe instances."""

import concurrent.futures
import http.server
import json
import shutil
import sys
import tempfile
import threading
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from archiver import engines, mar, properties, server  # noqa: E402
from samples import image_model  # noqa: E402


@pytest.fixture(scope="session")
def image_sample(tmp_path_factory) -> Path:
    """samples/image_model.py's output: resnet18 state_dict, model.py, labels, JPEGs."""
    return image_model.build(tmp_path_factory.mktemp("resnet18"))


@pytest.fixture(scope="session")
def jpegs(image_sample):
    """Eight different realistic-size JPEGs."""
    return [image_model.sample_jpeg(seed, (640 + 16 * seed, 480)) for seed in range(10, 18)]


def stand_in_torchscript(path: Path, padding: int = 0) -> Path:
    """A file packaging takes for TorchScript (a zip holding code/ and constants.pkl), made without
    torch: for tests of packaging, which never loads weights."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("w/code/__torch__/model.py", "")
        z.writestr("w/constants.pkl", b"")
        z.writestr("w/data.pkl", b"\0" * padding)
    return path


def write_model_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def package_resnet(sample: Path, store: Path, name="resnet18", config_text=None, **extra) -> Path:
    config = sample / "model-config.yaml"
    if config_text is not None:
        config = write_model_config(store.parent / f"{name}-config.yaml", config_text)
    options = mar.PackageOptions(
        model_name=name,
        handler="image_classifier",
        serialized_file=str(sample / "resnet18.pt"),
        model_file=str(sample / "model.py"),
        extra_files=[str(sample / "index_to_name.json")],
        config_file=str(config),
        export_path=str(store),
        force=True,
    )
    for key, value in extra.items():
        setattr(options, key, value)
    return mar.package(options)


def export_tree(root: Path, out: str = "pvc", **options) -> Path:
    """``tsctl config`` of ``root/model-store`` (unless ``root/config`` exists), then ``tsctl export
    kserve`` of it to ``root/out``: the tree KServe would mount."""
    from archiver.export import kserve

    config = root / "config" / "config.properties"
    if not config.exists():
        properties.write_config(root / "model-store", config)
    kserve.export(
        kserve.ExportOptions(
            out=str(root / out),
            name="demo",
            storage_uri="pvc://models/demo",
            config=str(config),
            model_store=str(root / "model-store"),
            **options,
        )
    )
    return root / out


def local_answers(store: Path, inputs: dict) -> dict:
    """{model: [in-process answer, ...]} of ``store/NAME.mar`` for each model's inputs (LocalModel)."""
    from serving.testing import LocalModel

    answers = {}
    for name, items in inputs.items():
        with LocalModel(store / f"{name}.mar") as model:
            answers[name] = [r.json() for r in model.predict(items)]
    return answers


class Transformer:
    """``python -m serving.kserve_transformer`` for ``archive`` in front of the predictor at
    ``predictor_host``, on free 127.0.0.1 ports, detached; ``url`` once it answers, or ``exit_code``
    and ``output`` if it exits first. ``stop()`` ends its process group."""

    def __init__(self, archive: Path, model: str, predictor_host: str, protocol: str, *extra: str, timeout=120):
        import os
        import subprocess

        port = server.free_port()
        self.home = short_tmp("tr-")
        self.log = self.home / "transformer.log"
        command = [sys.executable, "-m", "serving.kserve_transformer", "--model_name", model]
        command += ["--archive", str(archive), "--predictor_host", predictor_host, "--predictor_protocol", protocol]
        command += ["--http_port", str(port), "--grpc_port", str(server.free_port()), "--enable_grpc", "false", *extra]
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.exit_code = self.process.returncode
                return
            try:
                if server.request(f"http://127.0.0.1:{port}/v1/models/{model}", timeout=2)[0] == 200:
                    self.url = f"http://127.0.0.1:{port}"
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise AssertionError("transformer did not come up: " + self.output[-2000:])

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self):
        server.stop(server.Server(self.process.pid, str(self.home), "", "", "", []), grace=30)
        shutil.rmtree(self.home, ignore_errors=True)


def short_tmp(prefix: str) -> Path:
    """A short path: TorchServe's worker sockets live under TEMP and unix socket paths are short."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


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
        self.server = server.start(
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


@pytest.fixture(scope="session")
def text_samples(tmp_path_factory) -> Path:
    """minilm (the real all-MiniLM-L6-v2), classifier and tagger (small random BERTs)."""
    from samples import text_models

    return text_models.build(tmp_path_factory.mktemp("text"))


TEXT_BATCHING = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 8\nmaxBatchDelay: 100\nresponseTimeout: 120\n"


def package_text(samples: Path, store: Path, name: str, handler: str, directory: str, config_text=TEXT_BATCHING):
    config = store.parent / f"{name}-config.yaml"
    config.write_text(config_text)
    return mar.package(
        mar.PackageOptions(
            model_name=name,
            handler=handler,
            serialized_file=str(samples / directory),
            config_file=str(config),
            export_path=str(store),
            force=True,
        )
    )


# ---- worker memory: limited like a pod's, peak read from /proc -------------------------------------
class MemoryLimit:
    """Put a worker process under a memory limit, as a pod limit would: a memory cgroup (v2 or v1)
    where this machine lets us make one, else RLIMIT_AS (allocations beyond it fail instead of the
    process being killed). Either way an attack that balloons the worker shows as a failed or
    restarted worker, never as a machine swapping to death. ``kind`` says which was used.
    ``pid=None``: the cgroup alone (None where none can be made), for a process to ``join()`` as it
    starts."""

    def __init__(self, pid, limit: int):
        self.pid, self.limit, self.cgroup = pid, limit, None
        self.kind = self._cgroup() or (self._rlimit() if pid is not None else None)

    def _cgroup(self):
        import uuid

        name = f"tsctl-test-{uuid.uuid4().hex[:8]}"
        layouts = [
            (Path("/sys/fs/cgroup"), "memory.max", "cgroup v2"),
            (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes", "cgroup v1"),
        ]
        for root, limit_file, kind in layouts:
            if kind == "cgroup v2" and "memory" not in _read(root / "cgroup.subtree_control"):
                continue
            group = root / name
            try:
                group.mkdir()
                (group / limit_file).write_text(str(self.limit))
                if self.pid is not None:
                    (group / "cgroup.procs").write_text(str(self.pid))
            except OSError:
                if group.exists():
                    group.rmdir()
                continue
            self.cgroup = group
            return kind
        return None

    def join(self):
        """Put the calling process in the cgroup: a child's ``preexec_fn``, so that it starts (and
        reads its memory limit) inside it, its own children with it."""
        import os

        (self.cgroup / "cgroup.procs").write_text(str(os.getpid()))

    def _rlimit(self):
        import resource

        size = int(_read(Path(f"/proc/{self.pid}/status"), "VmSize:").split()[0]) * 1024
        resource.prlimit(self.pid, resource.RLIMIT_AS, (size + self.limit, size + self.limit))
        return "RLIMIT_AS"

    def release(self):
        """Remove the cgroup once its process is gone (the server was stopped)."""
        if self.cgroup is not None:
            for _ in range(50):
                try:
                    self.cgroup.rmdir()
                    return
                except OSError:
                    time.sleep(0.2)


def _read(path: Path, prefix: str = "") -> str:
    try:
        text = path.read_text()
    except OSError:
        return ""
    if not prefix:
        return text
    return next((line[len(prefix) :] for line in text.splitlines() if line.startswith(prefix)), "")


def peak_rss(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM), in bytes."""
    return int(_read(Path(f"/proc/{pid}/status"), "VmHWM:").split()[0]) * 1024


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
