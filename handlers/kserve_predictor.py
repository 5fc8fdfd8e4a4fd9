"""Any tsctl archive served by KServe's Python ModelServer: no Java, no TorchServe frontend.

    python -m handlers.kserve_predictor --model_store /mnt/models/model-store [--http_port 8080]
    python -m handlers.kserve_predictor --archive model-store/resnet18.mar --archive model-store/bert.mar

Each archive runs as a TorchServe worker would run it (``LocalModel``: TorchServe's own model
loader, the handler code the archive carries, its model-config.yaml), behind KServe's REST (and
gRPC) server under its model name:

- **Requests.** KServe v1 ``POST /v1/models/NAME:predict`` (a JSON body, or any other body such as
  a raw image, which KServe hands over untouched with its content type) and v2
  ``POST /v2/models/NAME/infer`` (JSON or the binary tensor extension; gRPC too) reach the handler
  as the same TorchServe request row those bodies would be on TorchServe, so the answer is the one
  TorchServe gives, instances of one request in one forward pass.
- **Batching across requests** as TorchServe does it: requests arriving within ``maxBatchDelay``
  ms of the first, up to ``batchSize`` (model-config.yaml; ``--batch_size``/``--max_batch_delay``
  override), run as one batch, in one thread per model.
- **Errors.** A request the handler refuses gets the handler's status and JSON body (the ``code``,
  ``type`` and ``message`` TorchServe would send, plus KServe's ``error`` key); the others in its
  batch are answered as usual. A body above its model's ``handler.max_body_bytes`` (by the URL's
  model name) is refused with 413, by its Content-Length or, sent chunked, once that much arrived.

Needs ``torchserve`` (the Python package: its model loader, not its Java frontend) and ``kserve``.
"""

import argparse
import asyncio
import json
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import yaml
from fastapi.responses import JSONResponse
from kserve import InferRequest, InferResponse, Model, ModelServer, model_server
from kserve.errors import InferenceError, InvalidInput
from kserve.protocol.rest import server as rest_server

from . import identity
from .archives import ArchiveError, read_manifest, read_member
from .testing import LocalModel
from .worker import Request, Response

logger = logging.getLogger("handlers.kserve_predictor")  # also when run as __main__

BINARY_LENGTH = "inference-header-content-length"  # KServe v2 binary tensor extension
# Headers describing the body as it came, which the request re-encoded for the handler no longer has.
BODY_HEADERS = ("content-type", "content-length", "transfer-encoding", "content-encoding", BINARY_LENGTH)
DEFAULT_BATCH_DELAY_MS = 100  # TorchServe's default maxBatchDelay
DEFAULT_MAX_BODY = 64 << 20  # a model without handler.max_body_bytes: tsctl config's max_request_size
MAX_CONFIG_BYTES = 1 << 20


class HandlerRefusal(InvalidInput):
    """A request the handler answered with a 4xx: its status and body go back as they are."""

    def __init__(self, status: int, body):
        super().__init__(message_of(body))
        self.status = status
        self.body = body


class HandlerFailure(InferenceError):
    """A request the handler answered with a 5xx (its model failed on it)."""

    def __init__(self, status: int, body):
        super().__init__(message_of(body))
        self.status = status
        self.body = body


def internal_error(message: str) -> HandlerFailure:
    """A 500 for a request the handler could not answer, in the body TorchServe's errors have."""
    return HandlerFailure(500, {"code": 500, "type": "InternalServerError", "message": message})


def message_of(body) -> str:
    return body.get("message", json.dumps(body)) if isinstance(body, dict) else str(body)


async def answer_error(_, error):
    body = dict(error.body) if isinstance(error.body, dict) else {"message": str(error.body)}
    body.setdefault("error", message_of(error.body))  # what KServe's own errors carry
    return JSONResponse(status_code=error.status, content=body)


def batch_settings(archive: Path) -> Tuple[int, int]:
    """(batchSize, maxBatchDelay ms) from the archive's model-config.yaml, TorchServe's defaults else."""
    config_file = read_manifest(archive)["model"].get("configFile")
    data = read_member(archive, config_file, MAX_CONFIG_BYTES) if config_file else None
    try:
        config = yaml.safe_load(data) if data else {}
    except yaml.YAMLError as exc:
        raise ArchiveError(f"{archive}: {config_file} is not valid YAML ({exc}): package it again") from None
    config = config if isinstance(config, dict) else {}
    return int(config.get("batchSize") or 1), int(config.get("maxBatchDelay", DEFAULT_BATCH_DELAY_MS))


class Batcher:
    """Gathers concurrent requests into batches the way TorchServe's frontend does and runs each
    batch on one thread: ``run(requests)`` returns one Response per request."""

    def __init__(self, run, batch_size: int, max_delay_ms: int, name: str):
        self.run = run
        self.batch_size = max(1, batch_size)
        self.max_delay = max(0, max_delay_ms) / 1000
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"model-{name}")
        self.queue: Optional[asyncio.Queue] = None
        self.loop_task = None

    async def submit(self, request: Request) -> Response:
        if self.loop_task is None:
            self.queue = asyncio.Queue()
            self.loop_task = asyncio.get_running_loop().create_task(self._serve())
        done = asyncio.get_running_loop().create_future()
        await self.queue.put((request, done))
        return await done

    async def _serve(self):
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            deadline = loop.time() + self.max_delay
            while len(batch) < self.batch_size:
                wait = deadline - loop.time()
                try:
                    entry = self.queue.get_nowait() if wait <= 0 else await asyncio.wait_for(self.queue.get(), wait)
                    batch.append(entry)
                except (asyncio.QueueEmpty, asyncio.TimeoutError):
                    break
            batch = [entry for entry in batch if not entry[1].done()]  # clients that gave up
            if not batch:
                continue
            try:
                responses = await loop.run_in_executor(self.thread, self._guarded, [entry[0] for entry in batch])
            except Exception as exc:  # noqa: BLE001 - the handler broke its contract: every request hears it
                logger.exception("tsctl: the batch failed as a whole")
                responses = [exc] * len(batch)
            for (_, done), response in zip(batch, responses):
                if done.done():
                    continue
                if isinstance(response, Exception):
                    done.set_exception(internal_error(f"{type(response).__name__}: {response}"))
                else:
                    done.set_result(response)

    def _guarded(self, requests: List[Request]) -> list:
        """``run`` in the model's thread; what it raises, even SystemExit or CancelledError, becomes
        every request's error instead of leaving the thread (which would stop the server or this
        model's loop)."""
        try:
            return self.run(requests)
        except BaseException as exc:  # noqa: BLE001 - see the docstring
            logger.error("tsctl: %s failed as a whole", self.thread._thread_name_prefix, exc_info=True)
            return [RuntimeError(f"{type(exc).__name__}: {exc}")] * len(requests)

    def close(self):
        if self.loop_task is not None:
            self.loop_task.cancel()
        self.thread.shutdown(wait=False)


class ArchivePredictor(Model):
    """One tsctl archive as a KServe predictor (see the module docstring)."""

    def __init__(
        self,
        archive,
        batch_size: Optional[int] = None,
        max_batch_delay: Optional[int] = None,
        metrics_config: Optional[str] = None,
    ):
        archive = Path(archive)
        configured_batch, configured_delay = batch_settings(archive)
        batch_size = batch_size or configured_batch
        # A toolkit handler reads raw bodies within its own limits (as tsctl config's
        # decode_input_request=false gives it on TorchServe); others get TorchServe's default.
        toolkit = identity.read(archive) is not None
        self.local = LocalModel(
            archive, batch_size=batch_size, decode_input_request=not toolkit, metrics_config=metrics_config
        )
        super().__init__(self.local.model_name)
        self.archive = archive
        self.max_body_bytes = getattr(getattr(self.local.handler, "settings", None), "max_body_bytes", 0)
        delay = configured_delay if max_batch_delay is None else max_batch_delay
        self.batcher = Batcher(self.local.serve, batch_size, delay, self.name)
        self.ready = True
        logger.info("tsctl: %s serves %s (batchSize %d, maxBatchDelay %d ms)", self.name, archive, batch_size, delay)

    async def predict(self, payload, headers: Optional[Dict[str, str]] = None, response_headers=None):
        v2 = isinstance(payload, InferRequest)
        try:
            request = as_request(payload, headers or {})
        except Exception as exc:  # noqa: BLE001 - a v2 request KServe decoded but that cannot be re-encoded
            message = f"the request could not be read: {exc}"
            raise HandlerRefusal(400, {"code": 400, "type": "ClientError", "message": message}) from None
        response = await self.batcher.submit(request)
        body = response.answer()
        if isinstance(body, (bytes, bytearray)):  # not JSON, not text: KServe's JSON protocols cannot carry it
            kind = response.content_type or "no content type"
            raise internal_error(f"the handler answered {len(body):,} bytes of {kind}")
        if not 100 <= response.status <= 599:
            raise internal_error(f"the handler answered with status {response.status}, which HTTP does not have")
        if response.status >= 500:
            raise HandlerFailure(response.status, body)
        if response.status >= 400:
            raise HandlerRefusal(response.status, body)
        if not v2:
            return body  # JSON, or a text answer as a JSON string
        return InferResponse(
            response_id=body.get("id", payload.id),
            model_name=self.name,
            model_version=body.get("model_version"),
            infer_outputs=InferResponse.from_rest(body).outputs,
            requested_outputs=payload.request_outputs,
            use_binary_outputs=payload.use_binary_outputs,
        )

    def stop(self):
        self.batcher.close()
        self.local.close()


def as_request(payload, headers: Dict[str, str]) -> Request:
    """The HTTP request TorchServe would have been sent for a request KServe decoded, with the
    client's headers (a handler may read them: ``context.get_request_header``): a v1 dict as its
    JSON, a raw body as it came; a v2 InferRequest as its JSON (answered in JSON: KServe encodes
    binary outputs itself) or, when its inputs came as binary, in the binary tensor extension."""
    kept = {k: v for k, v in headers.items() if k.lower() not in BODY_HEADERS}
    if not isinstance(payload, InferRequest):
        if isinstance(payload, (bytes, bytearray)):
            kind = {k: v for k, v in headers.items() if k.lower() == "content-type"}
            return Request(bytes(payload), {**kept, **kind})
        return Request(json.dumps(payload).encode("utf-8"), {**kept, "Content-Type": "application/json"})
    outputs = payload.request_outputs
    payload.request_outputs = [type(o)(o.name) for o in outputs] if outputs else outputs
    for infer_input in payload.inputs:  # decoded from the binary extension: send it on the same way
        if isinstance(infer_input.data, np.ndarray):
            infer_input.set_data_from_numpy(infer_input.data, binary_data=True)
    parameters = payload.parameters
    if parameters:
        payload.parameters = {k: v for k, v in dict(parameters).items() if k != "binary_data_output"} or None
    try:
        body, json_length = payload.to_rest()
    finally:
        payload.request_outputs, payload.parameters = outputs, parameters
    if json_length is None:  # a dict
        return Request(json.dumps(body).encode("utf-8"), {**kept, "Content-Type": "application/json"})
    binary = {"Content-Type": "application/octet-stream", BINARY_LENGTH: str(json_length)}
    return Request(body, {**kept, **binary})


class BodyTooLarge(Exception):
    pass


MODEL_PATH = re.compile(r"^/v[12]/models/([^/:]+)")


class BodyLimit:
    """ASGI middleware refusing, with 413, a request body above its model's ``handler.max_body_bytes``
    (``limits`` by model name; a model without one, and other paths: ``DEFAULT_MAX_BODY``, the
    ``max_request_size`` TorchServe gets from tsctl config): by its Content-Length before anything is
    read, or, for a body sent without one (chunked), as soon as what has arrived passes the limit,
    whatever the route would have answered; either way the body is never held whole."""

    def __init__(self, app, limits: Dict[str, int]):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        model = MODEL_PATH.match(scope.get("path", ""))
        limit = (self.limits.get(model.group(1)) if model else None) or DEFAULT_MAX_BODY
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            return await self.refuse(send, int(length), limit)
        seen, over, started = 0, False, False

        async def counted():
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    over = True
                    raise BodyTooLarge()
            return message

        async def tracked(message):
            nonlocal started
            if over and not started:
                return  # whatever the app makes of a body cut off at the limit (FastAPI: 400), the answer is 413
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge:
            pass
        if over and not started:
            await self.refuse(send, seen, limit, "at least ")

    async def refuse(self, send, size: int, limit: int, qualifier: str = ""):
        message = f"the request body is {qualifier}{size:,} bytes, above the limit of {limit:,}"
        message += " (handler.max_body_bytes)"
        body = {"code": 413, "type": "ClientError", "message": message, "error": message}
        await JSONResponse(status_code=413, content=body)({"type": "http"}, None, send)


def archives_in(model_store: Path) -> List[Path]:
    found = sorted(p for p in model_store.iterdir() if p.suffix in (".mar", ".gz", ".tgz") or p.is_dir())
    if not found:
        raise ArchiveError(f"{model_store} holds no model archives (.mar): build them with 'tsctl package'")
    return found


def bind_rest_server_to(host: str):
    """KServe's REST server listens on 0.0.0.0 (right in a pod); a local run asks for 127.0.0.1."""

    class RESTServer(rest_server.RESTServer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.config.host = host

    model_server.RESTServer = RESTServer


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        parents=[model_server.parser],
        conflict_handler="resolve",
        description="Serve tsctl archives on KServe's ModelServer.",
    )
    parser.add_argument("--archive", action="append", default=[], help="A .mar to serve; repeat for several.")
    parser.add_argument("--model_store", help="Serve every archive in this directory.")
    parser.add_argument("--batch_size", type=int, help="Override every archive's batchSize.")
    parser.add_argument("--max_batch_delay", type=int, help="Override every archive's maxBatchDelay (ms).")
    parser.add_argument("--metrics_config", help="The workers' metrics.yaml (TorchServe's metrics_config).")
    parser.add_argument("--host", default="0.0.0.0", help="Address the REST server listens on.")
    args, _ = parser.parse_known_args(argv)
    if not args.archive and not args.model_store:
        parser.error("give --archive FILE (repeatable) or --model_store DIR")
    return args


def log_to_stderr():
    """The handlers' and TorchServe loader's log lines (``tsctl batch ...``) on stderr, as a worker's
    are in model_log.log; KServe configures only its own loggers."""
    output = logging.StreamHandler()
    output.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("handlers", "ts"):
        named = logging.getLogger(name)
        named.setLevel(logging.INFO)
        named.addHandler(output)
        named.propagate = False
    logging.getLogger("ts.torch_handler.base_handler").setLevel(logging.ERROR)  # optional-backend notices


def keep_torch_threads():
    """One process serves every archive here, each on one model thread: a model's minWorkers (which
    divides a TorchServe worker's intra-op threads among its workers) must not shrink them. Fixing
    OMP_NUM_THREADS at torch's count keeps it (an archive's ``torch_threads`` still sets it, for
    the whole process)."""
    import torch

    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


def main(argv=None):
    args = parse_args(argv)
    log_to_stderr()
    keep_torch_threads()
    archives = [Path(a) for a in args.archive]
    if args.model_store:
        archives += archives_in(Path(args.model_store))
    models = [ArchivePredictor(a, args.batch_size, args.max_batch_delay, args.metrics_config) for a in archives]
    app = model_server.app
    app.add_exception_handler(HandlerRefusal, answer_error)
    app.add_exception_handler(HandlerFailure, answer_error)
    limits = {m.name: m.max_body_bytes for m in models if m.max_body_bytes}
    app.add_middleware(BodyLimit, limits=limits)
    if args.host != "0.0.0.0":
        bind_rest_server_to(args.host)
    logger.info("tsctl: serving %s on port %s", ", ".join(m.name for m in models), args.http_port)
    server = ModelServer(http_port=args.http_port, grpc_port=args.grpc_port, enable_grpc=args.enable_grpc, workers=1)
    server.start(models)


if __name__ == "__main__":
    main()
