"""TorchServe's own gRPC API on the tsctl engine: pytorch/serve's ``inference.proto`` and
``management.proto`` (``serving/engine/protos/``, built by ``serving/engine/ts_protos.py``), each on its own listener
as TorchServe binds them: ``grpc_inference_address:grpc_inference_port`` (127.0.0.1:7070) and
``grpc_management_address:grpc_management_port`` (127.0.0.1:7071) from config.properties, or the
engine's ``--grpc_inference_port`` ... arguments; beside KServe's v2 gRPC (``kserve_grpc.py``). A client
generated from pytorch/serve's protos (its ``ts_scripts/torchserve_grpc_client.py`` too) works unchanged.

Answers are TorchServe 0.12's (``grpcimpl/InferenceImpl.java``, ``ManagementImpl.java``, ``GRPCJob.java``),
errors with its status codes and its details (the message, a line break, the Java exception's name):

- ``Ping``: ``{"status": "Healthy"}`` (or ``Unhealthy``) as TorchServe's pretty JSON, always OK.
- ``Predictions``: each entry of the request's ``input`` map is one parameter of the worker's request,
  in the order they came (no headers, as TorchServe sends none); the handler's answer is the
  ``prediction``, whatever status it set (TorchServe's gRPC API drops it). A request that fails (the
  handler raised, a worker died or passed responseTimeout, an answer above max_response_size) is the
  call's error: its HTTP status as TorchServe maps it (``GRPC_STATUS``). A streaming handler's first
  part answers it, the rest is dropped (TorchServe 0.12 answers the first part, then its worker hangs).
- ``StreamPredictions``: each part of a streamed answer one message as it comes (streams.py); a
  whole answer one message, then the call ends OK (TorchServe 0.12 sends it, then fails the call with
  ``Worker died.`` and restarts its worker); a failure midway ends the call with its status.
- ``StreamPredictions2``: each request as it comes, its answer's parts one message each; a request with
  no ``sequence_id`` is answered with ``status`` INTERNAL ``Parameter sequenceId is required.`` and the
  stream goes on, as any failure (``PredictionResponse.status``, a ``google.rpc.Status`` whose details
  hold an ``ErrorInfo`` with the exception's name). The worker gets TorchServe's
  ``ts_request_sequence_id`` header (and ``ts_request_sequence_end: true`` when the input map says so).
  A stateful model's requests go by their sequence, each sequence on one worker (sequences.py);
  another model's are answered in order, any worker taking each.
- Management: ``ListModels`` (TorchServe's paging, its quirks included: ``limit`` 0 lists none) and
  ``DescribeModel`` (``customized``: the handler's ``describe_handle`` asked through a worker) answer
  from the engine's models; ``RegisterModel``, ``UnregisterModel``, ``ScaleWorker`` and
  ``SetDefault`` as TorchServe with the model API disabled: PERMISSION_DENIED ``Model API disabled``,
  after the NOT_FOUND of an unknown model.

The management RPCs ask ``engine.grpc_management``: ``ModelApi`` with ``enable_model_api=true`` (the REST
management API's calls, serving/engine/management.py), else ``ReadOnlyModels``; every call first asks
``engine.authorize(api, authorization)`` (``api`` is ``"inference"`` or ``"management"``,
``authorization`` the call's ``authorization`` metadata or None; False: PERMISSION_DENIED with
TorchServe's message: serving/engine/token_auth.py).

Bounds: a message above ``max_request_size`` (on the management API, ``body_limit.management_body_limit``:
64 KiB) is refused by gRPC itself before it is parsed (RESOURCE_EXHAUSTED, as TorchServe's
``maxInboundMessageSize``); each message is read by the method itself, that size (or the client's share,
when less) counted in the client's share of the reads' budget while it arrives (serving/engine/grpc_reading.py:
a ``StreamPredictions2`` call waiting for its next request holds it too); each message is counted against
the engine's bodies in flight before it is parsed (REST's and KServe gRPC's counter: UNAVAILABLE above it), and at most
``MAX_INPUTS`` entries (INVALID_ARGUMENT). A streamed answer's parts held for its client count in flight
too (streams.Parts: past it the stream ends UNAVAILABLE). At most ``MAX_OPEN_STREAMS``
``StreamPredictions2`` calls are open at once, a client address its share of them
(``body_limit.CLIENT_SHARE``); one past either ends RESOURCE_EXHAUSTED as it opens. TorchServe sets no
such bound (``ModelServer.startGRPCServer``: NettyServerBuilder with no ``maxConcurrentCallsPerConnection``);
RESOURCE_EXHAUSTED is its code for 429 (``GRPCUtils.getGRPCStatusCode``, lines 35-37).
"""

import asyncio
import json
import logging
from typing import List, Optional, Tuple

import grpc

from ..worker.ts_wire import Request, Response
from . import management as management_api
from . import ts_protos as pb
from .body_limit import Budget, client_of, management_body_limit
from .grpc_reading import counted, refusal, server_options
from .management import model_url
from .protobuf_wire import wire_fields
from .sequences import SEQUENCE_END, SEQUENCE_ID

logger = logging.getLogger("tsctl.engine")

MAX_INPUTS = 1 << 16  # entries of one request's input map (each a parameter the worker reads)
MAX_OPEN_STREAMS = 2048  # StreamPredictions2 calls open at once (about 22 KB each), a client its share of them
INPUT_COST = 256  # bytes an entry costs once read, counted in flight with the message
MODEL_NOT_FOUND = "org.pytorch.serve.archive.model.ModelNotFoundException"
VERSION_NOT_FOUND = "org.pytorch.serve.archive.model.ModelVersionNotFoundException"
MODEL_EXCEPTION = "org.pytorch.serve.archive.model.ModelException"
INTERNAL_SERVER = "org.pytorch.serve.http.InternalServerException"
NOT_ADDED = "InternalServerException.()"  # InferenceImpl.prediction's description when ModelManager.addJob fails
BAD_REQUEST = "BadRequestException.()"
TOKEN_DENIED = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
GRPC_STATUS = {  # TorchServe's GRPCUtils.getGRPCStatusCode
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    416: grpc.StatusCode.OUT_OF_RANGE,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_status(status: int) -> grpc.StatusCode:
    if status in GRPC_STATUS:
        return GRPC_STATUS[status]
    if 200 <= status < 300:
        return grpc.StatusCode.OK
    if 400 <= status < 500:
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL if 500 <= status < 600 else grpc.StatusCode.UNKNOWN


class ApiError(Exception):
    """A call's failure as TorchServe words it: its status code, its message and the name of the Java
    exception it comes from (its details are the two on two lines, as grpc-java's augmentDescription)."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str = INTERNAL_SERVER):
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason

    @property
    def details(self) -> str:
        return f"{self.message}\n{self.reason}"

    @classmethod
    def of(cls, response: Response) -> "ApiError":
        """The failure a frontend-made answer (``Response.error``) stands for."""
        try:
            message = json.loads(response.body).get("message", "")
        except (ValueError, AttributeError, TypeError):
            message = (response.body or b"").decode("utf-8", errors="replace")
        if response.refused:  # not taken in: as TorchServe's prediction() answers a job it could not add
            return cls(grpc.StatusCode.INTERNAL, message, NOT_ADDED)
        return cls(grpc_status(response.status), message)

    def keys_noted(self, inputs) -> "ApiError":
        """A failed prediction whose input map has neither ``data`` nor ``body``, the keys TorchServe's
        handlers read a request from (BaseHandler, the toolkit): its message names the keys it has."""
        keys = [name for name, _, _ in inputs or []]
        if keys and not {"data", "body"} & set(keys):
            named = ", ".join(repr(key) for key in keys[:5])
            self.message += f" (the input map holds {named}; handlers read the input under 'data' or 'body')"
        return self

    @classmethod
    def streams(cls, streams: Budget, client: str) -> "ApiError":
        """A StreamPredictions2 call refused: the engine's open streams, or this client's share, are all held."""
        held = streams.why(1, client)
        message = f"too many open StreamPredictions2 streams: {held} (MAX_OPEN_STREAMS, {streams.limit:,}): end one"
        return cls(grpc.StatusCode.RESOURCE_EXHAUSTED, message)

    def status(self) -> "pb.Status":
        """As StreamPredictions2 sends it: a google.rpc.Status with an ErrorInfo naming the exception."""
        info = b"\n" + varint(len(self.reason.encode())) + self.reason.encode()  # ErrorInfo.reason (field 1)
        detail = pb.Any(type_url="type.googleapis.com/google.rpc.ErrorInfo", value=info)
        return pb.Status(code=self.code.value[0], message=self.message, details=[detail])


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def pretty(value) -> str:
    """JSON as TorchServe's GSON_PRETTY writes it: two-space indents, no HTML or non-ASCII escaping."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def find(engine, name: str, version: Optional[str], code: grpc.StatusCode):
    """The model version a call names (an empty version: the default), else ``ApiError(code)`` in
    TorchServe's words."""
    model = engine.find(name, version or None)
    if model is not None:
        return model
    if version and name in engine.versions:
        raise ApiError(code, f"Model version: {version} does not exist for model: {name}", VERSION_NOT_FOUND)
    raise ApiError(code, f"Model not found: {name}", MODEL_NOT_FOUND)


def read_inputs(data: bytes) -> Tuple["pb.PredictionsRequest", List[Tuple[str, str, bytes]]]:
    """A PredictionsRequest's message and its input map's entries in the order they came, each as the
    worker's parameter (name, no content type, value); ValueError (one line) when it is not one or has
    more than ``MAX_INPUTS`` entries. Slow for many entries: run it off the event loop."""
    try:
        request = pb.PredictionsRequest.FromString(data)
    except Exception as exc:  # noqa: BLE001 - not a PredictionsRequest
        raise ValueError(f"the request could not be read: {exc}") from None
    entries = {}
    for number, payload in wire_fields(memoryview(data)):
        if number != 3 or payload is None:  # 3: the input map
            continue
        key, value = "", b""
        for field, content in wire_fields(payload):
            if field == 1 and content is not None:
                key = bytes(content).decode("utf-8")
            elif field == 2 and content is not None:
                value = bytes(content)
        entries[key] = value  # a key given twice keeps its first place and its last value, as Java's map
        if len(entries) > MAX_INPUTS:
            raise ValueError(f"the request has more than {MAX_INPUTS:,} inputs (MAX_INPUTS)")
    return request, [(key, "", value) for key, value in entries.items()]


class Inference:
    """``InferenceAPIsService``: Ping, Predictions, StreamPredictions, StreamPredictions2."""

    def __init__(self, engine):
        self.engine = engine
        self.streams = Budget(MAX_OPEN_STREAMS)  # StreamPredictions2 calls open, in all and per client

    async def Ping(self, request, context):
        return pb.TorchServeHealthResponse(health=pretty({"status": "Healthy" if self.engine.ready else "Unhealthy"}))

    async def admit(self, data: bytes, client: str, sequence: bool = False):
        """(model, worker request, bytes held in flight) for one PredictionsRequest's bytes, or ApiError."""
        loop, inflight = asyncio.get_running_loop(), self.engine.inflight
        if not inflight.take(len(data), client):
            raise ApiError(grpc.StatusCode.UNAVAILABLE, inflight.busy(len(data), client))
        held = len(data)
        try:
            try:
                request, inputs = await loop.run_in_executor(None, read_inputs, data)
            except ValueError as exc:
                raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, str(exc), BAD_REQUEST) from None
            cost = len(data) + INPUT_COST * len(inputs)
            if not inflight.take(cost, client):  # the values, copied out of the message
                raise ApiError(grpc.StatusCode.UNAVAILABLE, inflight.busy(cost, client))
            held += cost
            if sequence and not request.sequence_id:  # TorchServe 0.12 never reads its start input as true
                raise ApiError(grpc.StatusCode.INTERNAL, "Parameter sequenceId is required.", BAD_REQUEST)
            if not request.model_name:
                raise ApiError(grpc.StatusCode.INTERNAL, "Parameter model_name is required.", BAD_REQUEST)
            model = find(self.engine, request.model_name, request.model_version, grpc.StatusCode.INTERNAL)
        except BaseException:
            inflight.give(held, client)
            raise
        headers = {}
        if sequence:
            headers[SEQUENCE_ID] = request.sequence_id
            ends = {name: value for name, _, value in inputs}.get(SEQUENCE_END, b"")
            if ends.decode("utf-8", "replace").strip().lower() == "true":  # (TorchServe 0.12: every request, docs)
                headers[SEQUENCE_END] = "true"
        return model, Request(b"", headers, inputs), held

    async def answer(self, data: bytes, client: str, sequence: bool = False) -> Response:
        """The first part of the answer to one PredictionsRequest (its ``rest`` the others), or ApiError;
        the parts after it held count in flight, in ``client``'s share (streams.Parts.count)."""
        model, request, held = await self.admit(data, client, sequence)
        try:
            first = await model.submit_streaming(request)
        finally:
            self.engine.inflight.give(held, client)
        if first.error:
            if first.rest is not None:
                first.rest.close()
            raise ApiError.of(first).keys_noted(request.inputs)
        if first.rest is not None:
            first.rest.count(self.engine.inflight, client)
        return first

    async def Predictions(self, data: bytes, context):
        try:
            first = await self.answer(data, client_of(context.peer()))
        except ApiError as exc:
            await context.abort(exc.code, exc.details)
        if first.rest is not None:  # a streamed answer: its first part, as TorchServe answers (the rest dropped)
            first.rest.close()
        return pb.PredictionResponse(prediction=first.body or b"")

    async def StreamPredictions(self, data: bytes, context):
        try:
            async for part in parts_of(await self.answer(data, client_of(context.peer()))):
                yield pb.PredictionResponse(prediction=part.body or b"")
        except ApiError as exc:  # before the first part, or midway
            await context.abort(exc.code, exc.details)

    async def StreamPredictions2(self, requests, context):
        client = client_of(context.peer())
        if not self.streams.take(1, client):  # TorchServe has no bound: its 429's code (GRPCUtils.getGRPCStatusCode)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, ApiError.streams(self.streams, client).details)
        try:
            async for data in requests:
                try:
                    first = await self.answer(data, client, sequence=True)
                    async for part in parts_of(first):
                        yield pb.PredictionResponse(prediction=part.body or b"")
                except ApiError as exc:
                    yield pb.PredictionResponse(status=exc.status())
        finally:
            self.streams.give(1, client)


async def parts_of(first: Response):
    """The parts of an answer, the first included; ApiError at a failure midway. The parts are closed
    when the caller stops (the client went away): the worker's later parts are dropped."""
    try:
        yield first
        if first.rest is not None:
            async for part in first.rest:
                if part.error:
                    raise ApiError.of(part)
                yield part
    finally:
        if first.rest is not None:
            first.rest.close()


class ReadOnlyModels:
    """What the management RPCs answer from while the engine has no management module: its models as
    they are, and TorchServe's answers with the model API disabled to every call that would change
    them. The seam: a management module gives the engine a ``grpc_management`` with these methods."""

    def __init__(self, engine):
        self.engine = engine

    def list_models(self, limit: int, page_token: int) -> dict:
        """TorchServe's ``ApiUtils.getModelList``: names sorted, ``limit`` above 100 or below 0 is 100
        (0 stays 0), ``nextPageToken`` whenever the page ends at or before the last model."""
        limit = 100 if limit > 100 or limit < 0 else limit
        page_token = max(page_token, 0)
        names = sorted(self.engine.defaults)
        answer, last = {}, page_token + limit
        if last > len(names):
            last = len(names)
        else:
            answer["nextPageToken"] = str(last)
        answer["models"] = [
            {"modelName": name, "modelUrl": model_url(self.engine.defaults[name])} for name in names[page_token:last]
        ]
        return answer

    async def describe(self, name: str, version: Optional[str], customized: bool) -> list:
        from .management import describe_model

        if version == "all":
            found = list(self.engine.versions.get(name, {}).values())
            if not found:
                raise ApiError(grpc.StatusCode.NOT_FOUND, f"Model not found: {name}", MODEL_NOT_FOUND)
            return [describe_model(model) for model in found]
        model = find(self.engine, name, version, grpc.StatusCode.NOT_FOUND)
        described = describe_model(model)
        if customized:
            described.update(await self.customized(model))
        return [described]

    @staticmethod
    async def customized(model) -> dict:
        """The handler's own metadata (``describe_handle``), as TorchServe asks for it: a request with
        the header ``describe: True`` and no input; a JSON object is kept, anything else is ``{}``."""
        answer = await model.submit(Request(b"", {"describe": "True"}, []))
        if answer.error:
            raise ApiError.of(answer)
        try:
            metadata = json.loads(answer.body or b"null")
        except ValueError:
            return {"customizedMetadata": {}}
        if metadata is None:
            return {}
        return {"customizedMetadata": metadata if isinstance(metadata, dict) else {}}

    async def register(self, request) -> str:
        raise ApiError(grpc.StatusCode.PERMISSION_DENIED, "Model API disabled", MODEL_EXCEPTION)

    async def unregister(self, request) -> str:
        raise ApiError(grpc.StatusCode.PERMISSION_DENIED, "Model API disabled", MODEL_EXCEPTION)

    async def scale(self, request) -> str:
        find(self.engine, request.model_name, request.model_version, grpc.StatusCode.NOT_FOUND)
        raise ApiError(grpc.StatusCode.PERMISSION_DENIED, "Model API disabled", MODEL_EXCEPTION)

    async def set_default(self, request) -> str:
        if request.model_name not in self.engine.versions:
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"Model not found: {request.model_name}", MODEL_NOT_FOUND)
        if request.model_version not in self.engine.versions[request.model_name]:
            message = f"Model version {request.model_version} does not exist for model {request.model_name}"
            raise ApiError(grpc.StatusCode.NOT_FOUND, message, VERSION_NOT_FOUND)
        raise ApiError(grpc.StatusCode.PERMISSION_DENIED, "Model API disabled", MODEL_EXCEPTION)


class ModelApi(ReadOnlyModels):
    """The management RPCs that change state, with ``enable_model_api=true`` (the engine's
    ``grpc_management`` then): the REST API's calls (serving/engine/management.py), one at a time with
    them, their answers as TorchServe's ManagementImpl gives them (the status message; an error's status
    code from its HTTP status, its details the message and the Java exception's name). A field of the
    request left at its default (0, "") is absent, as TorchServe's GRPCUtils.getRegisterParam reads it."""

    async def change(self, work):
        try:
            async with self.engine.changing:
                message, _ = await work()
        except management_api.ApiError as exc:
            raise ApiError(grpc_status(exc.status), exc.message, JAVA_EXCEPTIONS.get(exc.kind, INTERNAL_SERVER))
        return message

    async def register(self, request) -> str:
        fields = ("url", "model_name", "batch_size", "max_batch_delay", "initial_workers", "response_timeout")
        params = {key: str(getattr(request, key)) for key in fields if getattr(request, key)}
        params["synchronous"] = "true" if request.synchronous else "false"  # proto3: false unless sent
        return await self.change(lambda: management_api.register(self.engine, params))

    async def unregister(self, request) -> str:
        version = request.model_version or None
        return await self.change(lambda: management_api.unregister(self.engine, request.model_name, version))

    async def scale(self, request) -> str:
        params = {key: str(getattr(request, key)) for key in ("min_worker", "max_worker") if getattr(request, key)}
        params["synchronous"] = "true" if request.synchronous else "false"
        version = request.model_version or None
        return await self.change(lambda: management_api.scale(self.engine, request.model_name, version, params))

    async def set_default(self, request) -> str:
        return await self.change(
            lambda: settled(management_api.set_default(self.engine, request.model_name, request.model_version))
        )


async def settled(value):
    return value


JAVA_EXCEPTIONS = {  # the canonical names of the exceptions TorchServe's management API raises
    "ModelNotFoundException": MODEL_NOT_FOUND,
    "ModelVersionNotFoundException": VERSION_NOT_FOUND,
    "InvalidModelException": "org.pytorch.serve.archive.model.InvalidModelException",
    "DownloadArchiveException": "org.pytorch.serve.archive.DownloadArchiveException",
    "BadRequestException": "org.pytorch.serve.http.BadRequestException",
    "ConflictStatusException": "org.pytorch.serve.http.ConflictStatusException",
    "InvalidModelVersionException": "org.pytorch.serve.http.InvalidModelVersionException",
    "InternalServerException": INTERNAL_SERVER,
}


class Management:
    """``ManagementAPIsService``, each call answered by the engine's ``grpc_management`` (``ReadOnlyModels``)."""

    def __init__(self, engine):
        self.engine = engine

    @property
    def models(self):
        return getattr(self.engine, "grpc_management", None) or ReadOnlyModels(self.engine)

    async def call(self, context, answer) -> "pb.ManagementResponse":
        try:
            message = await answer
        except ApiError as exc:
            await context.abort(exc.code, exc.details)
        return pb.ManagementResponse(msg=message)

    async def DescribeModel(self, request, context):
        async def described():
            return pretty(await self.models.describe(request.model_name, request.model_version, request.customized))

        return await self.call(context, described())

    async def ListModels(self, request, context):
        async def listed():
            return pretty(self.models.list_models(request.limit, request.next_page_token))

        return await self.call(context, listed())

    async def RegisterModel(self, request, context):
        return await self.call(context, self.models.register(request))

    async def UnregisterModel(self, request, context):
        return await self.call(context, self.models.unregister(request))

    async def ScaleWorker(self, request, context):
        return await self.call(context, self.models.scale(request))

    async def SetDefault(self, request, context):
        return await self.call(context, self.models.set_default(request))


def method_handlers(servicer, service: str, raw: Tuple[str, ...] = ()) -> dict:
    """gRPC method handlers of ``servicer``'s methods for ``service``'s RPCs, each of its kind (unary or
    streaming); the methods in ``raw`` get the request's bytes unparsed (counted before they are parsed)."""
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    handlers = {}
    for method in pb.service(service).methods:
        kind = kinds[(method.client_streaming, method.server_streaming)]
        parse = None if method.name in raw else pb.message(method.input_type.full_name).FromString
        serialize = pb.message(method.output_type.full_name).SerializeToString
        handlers[method.name] = kind(
            getattr(servicer, method.name), request_deserializer=parse, response_serializer=serialize
        )
    return handlers


class Authorization(grpc.aio.ServerInterceptor):
    """Every call of one API (``inference``/``management``) through ``engine.authorize`` when the engine
    has it (this module's docstring): PERMISSION_DENIED with TorchServe's message when it says no."""

    def __init__(self, engine, api: str):
        self.engine, self.api = engine, api

    async def intercept_service(self, continuation, details):
        authorize = getattr(self.engine, "authorize", None)
        if authorize is not None:
            token = dict(details.invocation_metadata or ()).get("authorization")
            if not authorize(self.api, token):
                return refusal(grpc.StatusCode.PERMISSION_DENIED, TOKEN_DENIED)  # its message never read
        return await continuation(details)


def addresses(frontend, args) -> dict:
    """{api: (host, port)} of both listeners: the engine's arguments, else config.properties' keys."""
    found = {}
    for api in ("inference", "management"):
        host = getattr(args, f"grpc_{api}_address", None) or getattr(frontend, f"grpc_{api}_address")
        port = getattr(args, f"grpc_{api}_port", None)
        found[api] = (host, port if port is not None else getattr(frontend, f"grpc_{api}_port"))
    return found


async def start(engine, args) -> list:
    """Both listeners started (RuntimeError naming the address one cannot bind): the servers, to stop."""
    raw = ("Predictions", "StreamPredictions", "StreamPredictions2")  # their bytes counted before they are parsed
    services = {
        "inference": (pb.INFERENCE_SERVICE, Inference(engine), raw),
        "management": (pb.MANAGEMENT_SERVICE, Management(engine), ()),
    }
    servers = []
    try:
        for api, (host, port) in addresses(engine.frontend, args).items():
            service, servicer, raw = services[api]
            limit = engine.frontend.max_request_size
            limit = management_body_limit(limit) if api == "management" else limit
            server = grpc.aio.server(options=server_options(limit), interceptors=[Authorization(engine, api)])
            handlers = counted(engine, limit).handlers(method_handlers(servicer, service, raw))
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
            if not server.add_insecure_port(f"{host}:{port}"):
                raise RuntimeError(f"TorchServe's gRPC {api} port {host}:{port} could not be bound")
            servers.append(server)
            await server.start()
            logger.info("TorchServe's gRPC %s API on %s:%d", api, host, port)
    except BaseException:
        for server in servers:
            await server.stop(0)
        raise
    return servers
