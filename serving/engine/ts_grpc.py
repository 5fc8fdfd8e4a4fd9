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
import logging
from typing import List, Tuple

import grpc

from ..worker.ts_wire import RequestInput, Response
from . import ts_protos as pb
from .body_limit import Budget, client_of, management_body_limit
from .grpc_reading import counted, refusal, server_options
from .protobuf_wire import wire_fields
from .sequences import SEQUENCE_END, SEQUENCE_ID
from .ts_grpc_errors import BAD_REQUEST, ApiError, find, pretty
from .ts_grpc_management import Management

logger = logging.getLogger("tsctl.engine")

MAX_INPUTS = 1 << 16  # entries of one request's input map (each a parameter the worker reads)
MAX_OPEN_STREAMS = 2048  # StreamPredictions2 calls open at once (about 22 KB each), a client its share of them
INPUT_COST = 256  # bytes an entry costs once read, counted in flight with the message
TOKEN_DENIED = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"


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
        return model, RequestInput(b"", headers, inputs), held

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
