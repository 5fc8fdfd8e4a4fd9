"""The tsctl engine: a TorchServe model store and config served in Python, no Java, no wrapper.

    python -m serving.engine --model_store model-store --ts_config config/config.properties \\
        [--host 127.0.0.1] [--http_port 8080] [--grpc_port 8081] [--enable_grpc false] \\
        [--management_port 8082] [--metrics_port 8083] [--enable_model_api true] [--disable_token_auth]

It reads the same tree as TorchServe (``serving/ts_config.py``: the model_snapshot's models and
versions, workers, batching, timeouts; without one, load_models' archives; without a config file every
archive in the store with its model-config.yaml, one it cannot read left out with a warning naming
it), runs each model version's ``minWorkers`` as TorchServe's own worker processes
(``serving/engine/workers.py``), and answers:

- TorchServe's inference API: ``GET /ping``, ``POST /predictions/NAME[/VERSION[/PATH]]`` and
  ``/explanations/...`` (the handler's ``explain_handle``, as TorchServe's headers ask), with the status,
  content type, headers and body the handler set, exactly as TorchServe's frontend sends them (a
  streamed answer chunked, part by part: ``serving/engine/streams.py``);
- TorchServe's management API (``serving/engine/management.py``): list and describe, and, with
  ``enable_model_api=true``, register, unregister, scale and set-default;
- KServe v1 (``/v1/models/NAME:predict`` and ``:explain``) and v2 REST (``/v2/models/NAME[/versions/V]/infer``,
  ``/v2/models/NAME/explain``,
  JSON or the binary tensor extension) and v2 gRPC on ``--grpc_port``: the request's bytes go to the
  handler as they came (the toolkit handlers read both protocols, ``handlers/decoding.py``) and the
  handler's answer comes back as it made it: decoded once, encoded once;
- readiness (``/ping``, ``/v2/health/ready``, ``/v1/models/NAME``, ``/v2/models/NAME/ready``, gRPC
  ServerReady/ModelReady): true only while every worker of the model is up;
- ``GET /metrics``: Prometheus, under TorchServe's names (``serving/engine/metrics.py``).

Each listens where config.properties' addresses put it, as TorchServe binds them, the command line's ports
winning (``serving/engine/listeners.py``): the HTTP port (inference_address), the management API's and /metrics'
own listeners (management_address, metrics_address, when not inference_address; /metrics stays on the HTTP
port too), KServe's v2 gRPC (--grpc_port, 8081 by default) and TorchServe's own gRPC APIs
(``serving/engine/ts_grpc.py``: grpc_inference_address:grpc_inference_port, 127.0.0.1:7070, and the
management API's, 7071). Two on one port are refused in one line. TorchServe's token authorization
(``serving/engine/token_auth.py``) is on unless the config says ``disable_token_authorization=true`` (or
``--disable_token_auth``): every call but ``/metrics`` needs its key, over REST and gRPC. KServe's
repository API (load, unload) is absent.

Request bodies are bounded by ``serving/engine/body_limit.py`` (``max_request_size`` from config.properties,
TorchServe's 6.5 MB by default, a management call's 64 KiB: 413 before the body is read whole; bodies in
flight; slow bodies), request heads and connections by ``serving/engine/http_server.py``; an answer above
``max_response_size`` fails alone with TorchServe's 500 and is never held (``ts_wire.Stream.reply``).
Needs ``torchserve`` (its worker, not its frontend).
"""

import asyncio
import logging
import re
import shutil
import sys
from http import HTTPStatus
from pathlib import Path
from typing import List, Optional

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.responses import Response as HttpResponse
from starlette.routing import Route

from handlers.errors import frontend_error, with_kserve_error

from .. import frontend_settings, ts_config, v2_metadata
from ..tree_digests import Tree
from ..worker import sockets
from ..worker.ts_wire import RequestInput, Response
from . import form_bodies, http_server, listeners, snapshots, streams
from .body_limit import BODY_IDLE_TIMEOUT, BodyLimit, InFlight, max_inflight_bytes, reads_budget
from .management import NOT_ALLOWED, NOT_FOUND, management_routes, ts_error, ts_json
from .metrics import Metrics
from .token_auth import TokenCheck, Tokens, is_management
from .versions import ModelVersions
from .workers import ModelWorkers

logger = logging.getLogger("tsctl.engine")

# Headers describing the HTTP body as it came: the worker gets the body, not the transfer.
HOP_HEADERS = frozenset(("content-length", "transfer-encoding", "connection", "expect", "host"))
MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")  # a handler's import the venv lacks


class Engine(ModelVersions):
    """Every model version of the store, its workers and its metrics (``ModelVersions``: the versions a
    management call registers or unregisters while it runs, serving/engine/management.py)."""

    def __init__(
        self,
        specs: List[ts_config.ModelSpec],
        frontend: frontend_settings.Frontend,
        decode_default=None,
        model_store: Optional[Path] = None,
        tree: Optional[Tree] = None,
    ):
        self.model_store = Path(model_store) if model_store is not None else None
        self.metrics = Metrics(frontend.metrics_config, frontend.metrics_auto_detect)
        super().__init__(frontend, sockets.run_dir(sockets.ENGINE), decode_default, self.metrics, tree)
        bound, why = max_inflight_bytes(frontend.max_request_size, frontend.max_inflight_bytes)
        logger.info("bodies in flight: at most %s bytes (%s)", f"{bound:,}", why)
        self.inflight = InFlight(bound)  # REST's and gRPC's bodies together
        self.grpc_reads = reads_budget(bound)  # gRPC messages while they arrive (serving/engine/grpc_reading.py)
        self.changing = asyncio.Lock()  # management calls that change state, one at a time
        self.tokens: Optional[Tokens] = None  # made when it serves (``serve``), as TorchServe makes its keys
        self.snapshots: Optional[snapshots.Snapshots] = None  # where its config snapshots go (--snapshot_dir)
        try:
            for spec in specs:
                self.add(self.open(spec))
        except BaseException:
            self.close()
            raise
        self.metrics.engine = self

    def authorize(self, api: str, authorization: Optional[str]) -> bool:
        """Whether a call to ``api`` (inference, management) with this ``Authorization`` value may go on."""
        return self.tokens is None or self.tokens.check(api, authorization)

    @property
    def grpc_management(self):
        """What TorchServe's gRPC management API answers from (serving/engine/ts_grpc.py, loaded with it)."""
        from .ts_grpc_management import ModelApi, ReadOnlyModels

        return (ModelApi if self.frontend.enable_model_api else ReadOnlyModels)(self)

    @property
    def ready(self) -> bool:
        """Every model version up, but one being registered and one scaled to no worker (TorchServe's /ping
        counts neither)."""
        return all(model.ready for model in self.all() if model.serving and model.workers)

    @property
    def body_idle_timeout(self) -> float:
        """Seconds a request body may pause while it arrives, and a client not read its answer (body_limit.py)."""
        return self.frontend.body_idle_timeout or BODY_IDLE_TIMEOUT

    async def start(self):
        """Start every model's workers at once; RuntimeError naming the model when one cannot load."""
        models = self.all()
        results = await asyncio.gather(*(m.start() for m in models), return_exceptions=True)
        for model, result in zip(models, results):
            if isinstance(result, BaseException):
                missing = MISSING_MODULE.search(str(result))
                fix = (
                    (
                        f": install '{missing.group(1)}' in the engine's Python ({sys.executable}), from the archive's "
                        "requirements.txt where it has one (useVenv and install_py_dep_per_model are TorchServe's; "
                        "tsctl serve --engine torchserve --install-deps does them)"
                    )
                    if missing
                    else ""
                )
                raise RuntimeError(f"model {model.label} ({model.spec.archive.name}) could not load: {result}{fix}")

    def begin_stop(self):
        """No worker starts or restarts from now on, and no request waits (the engine is stopping)."""
        for model in self.all() + list(self.leaving):
            model.begin_stop()

    def close(self):
        for model in self.all() + list(self.leaving):
            model.stop()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if self.tokens is not None:
            self.tokens.remove()


# ---- HTTP ---------------------------------------------------------------------------------------
def error(status: int, kind: str, message: str, kserve: bool = False) -> HttpResponse:
    """An error the engine makes itself, as TorchServe's frontend sends its own (``frontend_error``)."""
    return HttpResponse(frontend_error(status, kind, message, kserve), int(status), media_type="application/json")


def not_found(
    name: str, version: Optional[str], kserve: bool = False, engine: Optional["Engine"] = None
) -> HttpResponse:
    """404 for a model (version) not served; on TorchServe's routes (``engine`` given) in TorchServe's words: a
    version of a model it serves is ModelVersionNotFoundException."""
    if engine is not None and version and name in engine.versions:
        message = f"Model version: {version} does not exist for model: {name}"
        return error(HTTPStatus.NOT_FOUND, "ModelVersionNotFoundException", message)
    what = f"{name} version {version}" if version else name
    return error(HTTPStatus.NOT_FOUND, "ModelNotFoundException", f"Model not found: {what}", kserve)


def http_answer(response: Response, kserve: bool = False) -> HttpResponse:
    """The worker's answer as TorchServe's frontend sends it; on KServe's routes an error body also
    carries KServe's ``error`` key."""
    body = response.body or b""
    if kserve and response.status >= 400:
        body = with_kserve_error(body)
    headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "ts_stream_next")}
    fields = [*headers.items(), ("content-type", response.content_type or "")]
    if not 200 <= response.status <= 599 or not all(map(header_safe, (part for field in fields for part in field))):
        message = f"the handler answered what HTTP cannot carry (status {response.status}, headers {fields!r})"
        return error(HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerException", message[:2000], kserve)
    if response.status in (204, 304):
        body = b""  # HTTP has no body for these
    return HttpResponse(body, response.status, headers, media_type=response.content_type)


def readiness(body: dict) -> JSONResponse:
    """A KServe readiness answer: 200 when ``body["ready"]``, else 503."""
    status = HTTPStatus.OK if body["ready"] else HTTPStatus.SERVICE_UNAVAILABLE
    return JSONResponse(body, status_code=int(status))


def header_safe(text: str) -> bool:
    """A header name or value HTTP/1.1 can carry: latin-1, no line breaks."""
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return "\r" not in text and "\n" not in text


async def disconnected(http: HttpRequest):
    """Returns when the client has closed the connection (its body was read already)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def forward(
    http: HttpRequest, model: Optional[ModelWorkers], kserve: bool, engine=None, explain: bool = False
) -> HttpResponse:
    """One inference request to its model's workers, and their answer back (499, nothing run, when the
    client leaves first: its request is dropped from the queue). The headers TorchServe's frontend adds
    (``InferenceRequestHandler``), over the client's: ``explain`` (``True`` on /explanations and KServe's
    explain: BaseHandler.handle then calls its ``explain_handle``), and on TorchServe's own paths
    ``url_path`` (what follows NAME/VERSION, "" when nothing does)."""
    if model is None:
        return not_found(http.path_params["name"], http.path_params.get("version"), kserve, engine)
    body = await http.body()
    names = http.scope.get(http_server.HEADER_NAMES, {})  # as the client spelled them, as TorchServe passes them
    headers = {names.get(k, k): v for k, v in http.headers.items() if k not in HOP_HEADERS}
    headers = {k: v for k, v in headers.items() if k.lower() not in ("explain", "url_path")}
    headers["explain"] = "True" if explain else "False"
    if not kserve:
        headers["url_path"] = http.path_params.get("url_path", "")
    try:
        inputs = form_bodies.parameters(http.headers.get("content-type", ""), body)  # a form: a parameter a field
    except form_bodies.FormError as exc:
        return error(HTTPStatus.BAD_REQUEST, "BadRequestException", str(exc), kserve)
    request = RequestInput(body, headers, inputs=inputs)
    answer = asyncio.ensure_future(model.submit_streaming(request, http.path_params.get("version")))
    gone = asyncio.ensure_future(disconnected(http))
    await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not answer.done():  # the client left: its request is dropped from the queue, not run
        answer.cancel()
        return HttpResponse(status_code=499)
    gone.cancel()
    if answer.result().rest is not None:  # a streamed answer: chunked, part by part (streams.py)
        return await streams.http_reply(answer.result(), kserve, http_answer, engine.inflight)
    return http_answer(answer.result(), kserve)


def metrics_route(engine: Engine) -> Route:
    async def metrics(_):  # rendered off the event loop: requests go on while a large exposition is made
        text, kind = await asyncio.get_running_loop().run_in_executor(None, engine.metrics.render)
        return HttpResponse(text, media_type=kind)

    return Route("/metrics", metrics, methods=["GET"])


def torchserve_routes(engine: Engine) -> List[Route]:
    """TorchServe's inference API, and its metrics."""

    async def predictions(http: HttpRequest):
        name, version = http.path_params["name"], http.path_params.get("version")
        return await forward(http, engine.find(name, version), kserve=False, engine=engine)

    async def explanations(http: HttpRequest):
        name, version = http.path_params["name"], http.path_params.get("version")
        return await forward(http, engine.find(name, version), kserve=False, engine=engine, explain=True)

    async def ping(_):
        healthy = engine.ready
        status = HTTPStatus.OK if healthy else HTTPStatus.INTERNAL_SERVER_ERROR  # as TorchServe
        return ts_json({"status": "Healthy" if healthy else "Unhealthy"}, status)

    return [
        Route("/ping", ping, methods=["GET", "POST"]),
        Route("/predictions/{name}", predictions, methods=["POST", "PUT"]),
        Route("/predictions/{name}/{version}", predictions, methods=["POST", "PUT"]),
        Route("/predictions/{name}/{version}/{url_path:path}", predictions, methods=["POST", "PUT"]),
        Route("/explanations/{name}", explanations, methods=["POST", "PUT"]),
        Route("/explanations/{name}/{version}", explanations, methods=["POST", "PUT"]),
        Route("/explanations/{name}/{version}/{url_path:path}", explanations, methods=["POST", "PUT"]),
        metrics_route(engine),
    ]


def kserve_routes(engine: Engine) -> List[Route]:
    """KServe v1 and v2 REST: inference, health, model metadata and readiness."""

    async def v1_predict(http: HttpRequest):
        return await forward(http, engine.find(http.path_params["name"]), kserve=True)

    async def v2_infer(http: HttpRequest):
        name, version = http.path_params["name"], http.path_params.get("version")
        return await forward(http, engine.find(name, version), kserve=True)

    async def explain(http: HttpRequest):  # v1 and v2: TorchServe routes both to the model's default version
        return await forward(http, engine.find(http.path_params["name"]), kserve=True, explain=True)

    async def v1_models(_):
        return JSONResponse({"models": sorted(engine.defaults)})

    async def v1_model(http: HttpRequest):
        name = http.path_params["name"]
        model = engine.find(name)
        if model is None:
            return not_found(name, None, kserve=True)
        return readiness({"name": name, "ready": model.ready})

    async def v2_server(_):
        return JSONResponse({"name": "tsctl", "version": version_string(), "extensions": ["binary_tensor_data"]})

    async def v2_live(_):
        return JSONResponse({"live": True})

    async def v2_ready(_):
        ready = engine.ready
        return readiness({"ready": ready})

    async def v2_model(http: HttpRequest):
        name, version = http.path_params["name"], http.path_params.get("version")
        model = engine.find(name, version)
        if model is None:
            return not_found(name, version, kserve=True)
        return JSONResponse(v2_metadata.rest_body(name, sorted(engine.versions[name]), model.v2_metadata))

    async def v2_model_ready(http: HttpRequest):
        name, version = http.path_params["name"], http.path_params.get("version")
        model = engine.find(name, version)
        if model is None:
            return not_found(name, version, kserve=True)
        return readiness({"name": name, "ready": model.ready})

    infer = ["POST"]
    return [
        Route("/v1/models", v1_models, methods=["GET"]),
        Route("/v1/models/{name}", v1_model, methods=["GET"]),
        Route("/v1/models/{name}:predict", v1_predict, methods=infer),
        Route("/v1/models/{name}:explain", explain, methods=infer),
        Route("/v2", v2_server, methods=["GET"]),
        Route("/v2/health/live", v2_live, methods=["GET"]),
        Route("/v2/health/ready", v2_ready, methods=["GET"]),
        Route("/v2/models/{name}", v2_model, methods=["GET"]),
        Route("/v2/models/{name}/ready", v2_model_ready, methods=["GET"]),
        Route("/v2/models/{name}/infer", v2_infer, methods=infer),
        Route("/v2/models/{name}/explain", explain, methods=infer),
        Route("/v2/models/{name}/versions/{version}", v2_model, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}/ready", v2_model_ready, methods=["GET"]),
        Route("/v2/models/{name}/versions/{version}/infer", v2_infer, methods=infer),
    ]


def build_app(engine: Engine, listener: str = "both", where: Optional[listeners.Bindings] = None) -> Starlette:
    """A listener's REST app: ``inference`` (TorchServe's inference API, KServe's, /metrics), ``management``
    (TorchServe's management API), ``both``, or ``metrics`` (/metrics alone, no key, as TorchServe's metrics
    listener); every request's key checked first when token authorization is on (``TokenCheck``), every
    request body bounded (``BodyLimit``); an unknown path or method is TorchServe's 404 or 405 (a path of the
    other API's: saying which API this is and where the other is, ``listeners.other_api`` of ``where``)."""
    routes = [metrics_route(engine)] if listener == "metrics" else []
    if listener in ("inference", "both"):
        routes += torchserve_routes(engine) + kserve_routes(engine)
    if listener in ("management", "both"):
        routes += management_routes(engine)

    def other_api(path: str) -> str:
        return listeners.other_api(where, listener, is_management(path)) if where is not None else ""

    async def unknown(http, exc):
        if exc.status_code == 405:
            return ts_error(HTTPStatus.METHOD_NOT_ALLOWED, "MethodNotAllowedException", NOT_ALLOWED)
        return ts_error(HTTPStatus.NOT_FOUND, "ResourceNotFoundException", NOT_FOUND + other_api(http.url.path))

    app = Starlette(routes=routes, exception_handlers={404: unknown, 405: unknown})
    if engine.tokens is not None and listener != "metrics":
        app.add_middleware(TokenCheck, tokens=engine.tokens, listener=listener, other_api=other_api)
    management = "/models" if listener in ("management", "both") else None  # its bodies: MAX_MANAGEMENT_BODY
    app.add_middleware(
        BodyLimit,
        limit=engine.frontend.max_request_size,
        inflight=engine.inflight,
        idle=engine.body_idle_timeout,
        management=management,
    )
    return app


def version_string() -> str:
    from importlib import metadata

    try:
        return metadata.version("tsctl")
    except metadata.PackageNotFoundError:
        return "unknown"
