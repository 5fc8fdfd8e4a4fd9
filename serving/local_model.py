"""Run a .mar (or an unpacked model directory) as TorchServe runs it, without Java and without HTTP.

    from serving.local_model import LocalModel

    with LocalModel("model-store/resnet18.mar") as model:
        [answer] = model.predict([open("kitten.jpg", "rb").read()])
        assert answer.status == 200, answer.json()

There are two ways here, for two different needs:

- **``LocalModel``: the archive, as a worker runs it.** What ``tsctl run``, in-process ``tsctl
  verify``, ``package --golden`` and ``tsctl init``'s generated test use. The archive runs in
  TorchServe's own worker process (``ts/model_service_worker.py``), started and spoken to exactly as
  the tsctl engine starts its workers (``worker_process.start_worker``, the frontend's wire protocol
  of ``ts_wire``): in the unpacked archive's directory, that directory first on its ``PYTHONPATH``
  (so ``handlers.image:handle`` and a handler file of yours that imports ``handlers`` run the copy the
  archive carries), ``TS_DECODE_INPUT_REQUEST`` as asked. TorchServe's worker decodes each request
  and encodes each answer: nothing of either is copied here. Each input is one HTTP request of the
  batch (``bytes`` a raw body, ``str`` a text, ``dict``/``list`` a JSON body, a ``Path`` the file with
  the content type of its suffix, or a ``RequestInput`` with headers of its own); each answer is what
  TorchServe's frontend would send (status, content type, headers, body bytes). The worker's log lines
  are kept (``log``), and so are the lines of its metrics logger (``metrics``), never printed; a
  thread reads each as it comes, so both are complete once the LocalModel is closed. With
  ``continuous=True`` (a ``continuousBatching: true`` archive) each batch runs step by step to its end,
  as TorchServe's ContinuousBatching drives it, each answer's parts joined. A
  worker costs a process and a torch import: share a LocalModel across tests (a module-scoped
  fixture) where the tests allow.
- **``InProcessHandler``: your handler class, in this process, to unit-test it.** TorchServe's own
  model loader makes the ``Context`` (manifest, model-config.yaml, system properties, metrics) and
  the handler instance in this process, with this process's modules: ``handlers.image:handle`` is the
  installed ``handlers`` package, a handler file of yours must be importable here as your tests import
  it. Nothing is isolated and no HTTP request is decoded: use it to look at the instance
  (``handler.settings``, ``handler.preprocess(...)``) or to hand it rows as a worker hands them
  (``predict_rows``). Answers that must equal a server's come from ``LocalModel``.
"""

import collections
import json
import os
import shutil
import tempfile
import threading
from http import HTTPStatus
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple, Union

from handlers import fit, identity, signing
from handlers.archives import Archive, opened
from handlers.requests import content_type

from .frontend_settings import Frontend
from .ts_config import ModelSpec
from .worker import fork_server, sockets
from .worker.ts_wire import BrokenReply, RequestInput, Response, WorkerDied, batch_error, mime_type, read_reply
from .worker.worker_process import METRICS_YAML, NotSent, start_worker

__all__ = ["InProcessHandler", "LoadError", "LocalModel", "RequestInput", "Response", "as_request"]

UNLIMITED = (1 << 31) - 1  # max_response_size: LocalModel hands back whatever the handler answered
KEPT_LINES = 20_000  # worker log and metrics lines kept, the latest


def as_request(value: Any) -> RequestInput:
    """An input of ``LocalModel.predict`` as a request: ``bytes`` a raw body
    (``application/octet-stream``), ``str`` a text (``text/plain``), ``dict``/``list`` a JSON body,
    a ``Path`` the file with the content type of its suffix."""
    if isinstance(value, RequestInput):
        return value
    if isinstance(value, Path):
        return RequestInput(value.read_bytes(), {"Content-Type": content_type(value)})
    if isinstance(value, (bytes, bytearray)):
        return RequestInput(bytes(value), {"Content-Type": "application/octet-stream"})
    if isinstance(value, str):
        return RequestInput(value.encode("utf-8"), {"Content-Type": "text/plain"})
    return RequestInput(json.dumps(value).encode("utf-8"), {"Content-Type": "application/json"})


class RowRequest(RequestInput):
    """A request whose parameters are given one by one (``LocalModel.predict_rows``): each field of a
    row a parameter of its own, as the frontend sends a multipart form's fields."""

    def __init__(self, fields: List[Tuple[str, str, bytes]], headers: Dict[str, str]):
        super().__init__(b"", headers)
        self.fields = fields

    def parameters(self) -> List[Tuple[str, str, bytes]]:
        return self.fields


def row_request(row: dict, headers: Dict[str, str]) -> RowRequest:
    """A row as the parameters a worker decodes back into it: bytes as they are, with the request's
    MIME type (as the frontend sends a body); any other value as JSON (``application/json``), which a
    worker that decodes requests parses back into that value."""
    mime = RequestInput(b"", headers).content_type
    fields = []
    for name, value in row.items():
        if isinstance(value, (bytes, bytearray)):
            fields.append((name, mime, bytes(value)))
        else:
            fields.append((name, "application/json", json.dumps(value).encode("utf-8")))
    return RowRequest(fields, headers)


class LoadError(RuntimeError):
    """The handler failed to load in its worker. The exception crossed no process boundary:
    ``error_type`` is its qualified name as the worker logged it (``handlers.settings.SettingsError``,
    ``ValueError``), the message its own."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type

    @classmethod
    def from_worker(cls, said: str) -> "LoadError":
        """From the worker's last error line (``Type: message``; anything else: a RuntimeError's message)."""
        name, colon, message = said.strip().partition(": ")
        if colon and name.replace(".", "").replace("_", "").isalnum():
            return cls(name if "." in name else f"builtins.{name}", message)
        return cls("builtins.RuntimeError", said)


class LocalModel:
    """An archive in a TorchServe worker process of its own (see the module docstring). The archive
    is checked first (names, sizes, manifest paths inside it: ``handlers/archives.py``; its signature
    with ``public_key``, before any of its code runs); whatever fails, nothing is left behind: no
    temporary files, no process. A load the handler fails raises ``LoadError`` with its own error."""

    def __init__(
        self,
        archive: Union[str, Path, Archive],
        batch_size: int = 8,
        envelope: Optional[str] = None,
        gpu: Optional[int] = None,
        decode_input_request: bool = True,
        limit_max_image_pixels: bool = True,
        metrics_config: Optional[str] = None,
        public_key: Optional[str] = None,
        expected: Tuple[Optional[str], Optional[str]] = (None, None),
        continuous: bool = False,
    ):
        if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0):
            raise ValueError(f"gpu={gpu!r}: give a GPU's id (0 for the first visible one), or None for the CPU")
        self.gpu = -1 if gpu is None else gpu  # the load command's gpu (serving/gpus.py), as TorchServe sends it
        self.decode_input_request = decode_input_request
        self.continuous = continuous  # continuousBatching: each batch run step by step to its end (``steps``)
        self.log: Deque[str] = collections.deque(maxlen=KEPT_LINES)  # the worker's log lines, as it wrote them
        self.logged = 0  # lines the worker has logged so far (``log`` keeps the latest KEPT_LINES)
        self.metrics: Deque[str] = collections.deque(maxlen=KEPT_LINES)  # its metrics logger's lines
        self.worker = None
        self._spec = None  # what the worker is started with; None once closed
        self._lock = threading.Lock()  # one batch at a time on the worker's socket
        self._tmp = tempfile.mkdtemp(prefix="tsctl-run-")
        self._socket_dir = tempfile.mkdtemp(prefix="tsctl-", dir="/tmp" if os.path.isdir("/tmp") else None)
        self._socket = sockets.socket_path(self._socket_dir, 9000)  # the worker reads a port from its name
        try:
            with opened(archive) as found:  # a path is opened here; an Archive given is read once for all
                self.manifest = found.manifest
                self.record = identity.read(found)  # MAR-INF/tsctl.json: which class is the handler
                self.model_dir = found.model_dir(os.path.join(self._tmp, "model"))
                archive, version = found.path, found.version
            sockets.check(self._socket, "set TMPDIR to a shorter directory (e.g. TMPDIR=/tmp)")
            if public_key:  # before any of the archive's code can run
                signing.verify(self.model_dir, public_key, archive.name, *expected)
            model = self.manifest["model"]
            self.model_name = model["modelName"]
            self._spec = ModelSpec(self.model_name, version, archive, batch_size=batch_size)
            self._frontend = Frontend(
                max_response_size=UNLIMITED,
                envelope=envelope,
                decode_input_request=decode_input_request,
                limit_max_image_pixels=limit_max_image_pixels,
                metrics_config=metrics_config,
            )
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self):
        """Start the worker and load the model in it; LoadError with the handler's own error."""
        env = self._environment()
        try:
            self.worker = start_worker(
                self._spec,
                self.model_dir,
                self.manifest["model"]["handler"],
                self._frontend,
                self._socket,
                env,
                self._log_line,
                on_metric=self.metrics.append,
                fork_server=fork_server.shared(env),
                gpu=self.gpu,
            )
        except RuntimeError as exc:
            why = fit.unloaded_state_dict(str(self.model_dir), self.manifest["model"])  # torch says "corrupted"
            if why is not None:
                raise LoadError("handlers.loading.ModelLoadError", why) from None
            raise LoadError.from_worker(str(exc)) from None

    def _log_line(self, line: str):
        self.log.append(line)
        self.logged += 1

    def _environment(self) -> dict:
        """The worker's environment as TorchServe's frontend makes it (``model_opening.open_model``):
        the model directory first on ``PYTHONPATH``, ``TS_DECODE_INPUT_REQUEST``; no bytecode written
        into the model directory, and its temporary files in the LocalModel's temporary directory."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.model_dir), os.environ.get("PYTHONPATH")) if p)
        env["TS_DECODE_INPUT_REQUEST"] = "true" if self.decode_input_request else "false"
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["TMPDIR"] = os.path.join(self._tmp, "tmp")  # its libraries' files, removed with the LocalModel's
        os.makedirs(env["TMPDIR"], exist_ok=True)
        return env

    @property
    def pid(self) -> Optional[int]:
        """The worker's process id (None once closed)."""
        return None if self.worker is None else self.worker.pid

    def serve(self, requests: List[RequestInput]) -> List[Response]:
        """Run one batch of HTTP requests on the worker: one Response per request, in order, as
        TorchServe's frontend would answer it. A worker that dies holding the batch (a handler calling
        ``sys.exit``, an answer TorchServe cannot encode) gives each of its requests the frontend's
        ``500 Worker died.``; the next batch starts a new worker, as TorchServe does."""
        with self._lock:
            if self._spec is None:
                raise RuntimeError(f"LocalModel {self.model_name!r} is closed")
            if self.worker is None or not self.worker.alive():
                self._stop_worker()
                self._start()
            try:
                run = self.worker.steps if self.continuous else self.worker.predict
                return run(list(requests))
            except (NotSent, WorkerDied, BrokenReply):
                self._stop_worker()
                return batch_error(HTTPStatus.INTERNAL_SERVER_ERROR, "Worker died.", len(requests))

    def _stop_worker(self):
        """End the worker and read what it wrote to its end (``log``, ``metrics`` complete)."""
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.kill()
            for reader in worker.readers:
                reader.join(5)

    def predict_rows(self, rows: List[dict], headers: Optional[List[Dict[str, str]]] = None) -> List[Response]:
        """Run one batch of rows (a mapping of parameter name to value each: ``{"body": value}``, or form
        fields ``{"data": ..., "file": ...}``), each with its HTTP ``headers``; how a value travels:
        ``row_request``."""
        headers = headers or [{} for _ in rows]
        return self.serve([row_request(row, h) for row, h in zip(rows, headers)])

    def predict(self, inputs: Sequence[Any]) -> List[Response]:
        """Run one batch: each input is one request (``bytes`` a raw body, ``str`` a text, ``dict``
        or ``list`` a JSON body, a ``Path`` the file with the content type of its suffix, or a
        ``RequestInput``)."""
        return self.serve([as_request(i) for i in inputs])

    def close(self):
        """End the worker (and whatever it forked) and remove the temporary directories; safe to call twice."""
        self._spec = None
        self._stop_worker()
        for attribute in ("_tmp", "_socket_dir"):
            if getattr(self, attribute, None):
                shutil.rmtree(getattr(self, attribute), ignore_errors=True)
                setattr(self, attribute, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class InProcessHandler:
    """A handler instance in this process, to unit-test its class (see the module docstring): the
    archive's (or model directory's) manifest handler loaded by TorchServe's own model loader with
    this process's modules, its ``initialize`` run on the worker's ``Context``."""

    def __init__(self, archive: Union[str, Path, Archive], batch_size: int = 1, metrics_config: Optional[str] = None):
        from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
        from ts.model_loader import TsModelLoader

        self._tmp = None
        self.service = None
        try:
            with opened(archive) as found:
                self.manifest = found.manifest
                if found.kind != "dir":
                    self._tmp = tempfile.mkdtemp(prefix="tsctl-unit-")
                self.model_dir = found.model_dir(self._tmp)
            model = self.manifest["model"]
            metrics = MetricsCacheYamlImpl(config_file_path=metrics_config or METRICS_YAML)
            metrics.initialize_cache()
            metrics.model_name = model["modelName"]
            self.service = TsModelLoader().load(
                model["modelName"], str(self.model_dir), model["handler"], None, batch_size, None, True, metrics
            )
            self.service.set_cl_socket(None)
        except BaseException:
            self.close()
            raise

    @property
    def context(self):
        """The TorchServe ``Context`` the handler was initialised with."""
        return self.service.context

    @property
    def handler(self):
        """The handler instance TorchServe's loader made (a toolkit ``entry_point``'s, or the class
        TorchServe instantiated itself)."""
        entry = self.service._entry_point
        return entry.handler_for(self.context) if hasattr(entry, "handler_for") else getattr(entry, "__self__", None)

    def predict_rows(self, rows: List[dict], headers: Optional[List[Dict[str, str]]] = None) -> List[Response]:
        """Run one batch of rows, each already as a worker hands it to the handler (``{"body": value}``,
        form fields), with its HTTP ``headers``, through TorchServe's ``Service.predict``."""
        headers = headers or [{} for _ in rows]
        batch = [
            {
                "requestId": f"request-{i}".encode(),
                "headers": [{"name": k.encode(), "value": v.encode()} for k, v in h.items()],
                "parameters": [{"name": n, "contentType": mime_type(h), "value": v} for n, v in row.items()],
            }
            for i, (row, h) in enumerate(zip(rows, headers))
        ]
        return read_reply(self.service.predict(batch), [f"request-{i}" for i in range(len(rows))])

    def close(self):
        """Let go of the handler (its decode threads) and the temporary directory; safe to call twice."""
        if self.service is not None:
            pool = getattr(self.handler, "pool", None)
            if pool is not None:
                pool.shutdown(wait=False)
        self.service = None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
