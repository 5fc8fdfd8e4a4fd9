"""The tsctl engine's KServe v2 gRPC service (``inference.GRPCInferenceService``), bound where REST binds.

A ``ModelInfer`` call becomes the v2 REST request it stands for, always in the binary tensor
extension: ``raw_input_contents`` go on as they are, typed ``contents`` (``fp32_contents`` ...) as
their binary form read off the message's own wire bytes with numpy (never a Python number per
element, never JSON numbers), ``bytes_contents`` as a BYTES tensor; then it goes to the model's
workers like any request. The conversion runs in a thread, off the event loop.

Bounds, in the order a call meets them (one design: the message is counted before it is parsed):

- Every method reads its message itself, ``max_request_size`` (or the client's share, when less)
  counted in the client's share of the reads' budget while it arrives (serving/engine/grpc_reading.py):
  a message begun and never finished holds no more than that, and one past the bound is never asked for.
- ``ModelInfer`` is registered to receive the message's bytes unparsed (``start_grpc``): they count
  against the engine's bodies in flight (``body_limit.InFlight``, REST's counter) as the call
  begins, before protobuf builds anything of them; above ``--max_inflight_bytes`` the call gets
  UNAVAILABLE with REST's 503 message (so concurrent calls, each held by gRPC, stay within the
  bound with the REST bodies).
- ``weigh`` then walks the wire bytes (no Python object per element): more than ``MAX_PARTS``
  messages, strings and bytes elements (inputs, parameters, BYTES elements, map entries), a
  string (name, parameter) above ``MAX_TEXT``, or a
  request made of it above ``max_request_size`` (typed integers at 8 bytes an element: 4 M one-byte
  varints are 32 MB) is INVALID_ARGUMENT in one line; what the conversion will allocate
  (``conversion_cost``: the parsed message, the request, numpy's temporaries, each part's objects)
  is counted in flight before it is parsed, and given back when the call ends.

The handler's v2 answer (JSON or binary) is turned back into a ``ModelInferResponse`` with KServe's
own protocol types, also off the loop. The repository calls
(load, unload) are not served: ``UNIMPLEMENTED``, as is everything else that would change state.
With token authorization on (serving/engine/token_auth.py), every call needs the inference key in its
``authorization`` metadata, as TorchServe's GRPCInterceptor asks (``TokenInterceptor``).
"""

import asyncio
import json
import uuid

import grpc
from google.protobuf.descriptor import FieldDescriptor
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc
from kserve.protocol.infer_type import InferResponse, to_http_parameters

from handlers.json_body import numpy, to_json
from handlers.v2_binary import encode_tensor, header_length
from handlers.v2_tensors import HEADER, NUMERIC

from ..worker.ts_wire import RequestInput, Response
from .app import version_string
from .body_limit import client_of, too_large_message
from .grpc_reading import counted, refusal, server_options
from .protobuf_wire import wire_fields
from .token_auth import INFERENCE, MESSAGE

STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    507: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


CONTENTS = {  # v2 datatype -> its InferTensorContents field
    "BOOL": "bool_contents",
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    "INT64": "int64_contents",
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


MAX_PARTS = 1 << 16  # messages, strings and bytes elements in one ModelInfer call (each costs Python/upb objects)
MAX_TEXT = 1 << 20  # bytes of one string (a name, a parameter's key or value): each goes into the JSON header
PART_COST = 256  # bytes a part costs once parsed and converted, counted in flight (conversion_cost)
VARINT_TYPES = frozenset(
    (
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_BOOL,
        FieldDescriptor.TYPE_ENUM,
    )
)


def weigh(data: bytes, limit: int):
    """(size, parts) of a serialized ModelInferRequest, read off its wire bytes with its descriptor
    before anything is parsed: ``size`` the bytes of the request made of it (the message, each packed
    integer at 8 bytes, each bytes element with its 4-byte length), ``parts`` its messages, strings,
    bytes elements and unpacked scalars. ValueError (one line) above ``MAX_PARTS`` parts or ``limit``
    (max_request_size) bytes."""
    np = numpy()
    parts = expansion = 0

    def walk(wire: memoryview, descriptor):  # depth first: the schema nests 4 deep at most
        nonlocal parts, expansion
        for number, payload in wire_fields(wire):
            field = descriptor.fields_by_number.get(number)
            if payload is None:  # a scalar
                pass
            elif field is not None and field.type == FieldDescriptor.TYPE_MESSAGE:
                walk(payload, field.message_type)
            elif field is not None and field.type in VARINT_TYPES:  # packed: one element per last byte
                expansion += 8 * int(np.count_nonzero(np.frombuffer(payload, np.uint8) < 0x80))
                continue
            elif field is not None and field.type == FieldDescriptor.TYPE_STRING:
                if len(payload) > MAX_TEXT:  # copied several times into the request's JSON header
                    raise ValueError(
                        f"{descriptor.name}.{field.name} is a string of {len(payload):,} bytes, above the limit "
                        f"of {MAX_TEXT:,} (MAX_TEXT)"
                    )
            elif field is not None and field.type != FieldDescriptor.TYPE_BYTES:
                continue  # packed floats: their binary form as they are
            else:
                expansion += 4  # a BYTES element's length in the binary form
            parts += 1
            if parts > MAX_PARTS:
                raise ValueError(
                    f"the request has more than {MAX_PARTS:,} parts (inputs, parameters, BYTES elements: "
                    "MAX_PARTS): send big tensors as raw_input_contents"
                )

    try:
        walk(memoryview(data), pb.ModelInferRequest.DESCRIPTOR)
    except IndexError:
        raise ValueError("the request is no protobuf message (it ends inside a field)") from None
    size = len(data) + expansion
    if size > limit:
        what, how = "the request made of this call would be", " (typed integers at 8 bytes each)"
        raise ValueError(too_large_message(what, size, limit, how))
    return size, parts


def conversion_cost(size: int, parts: int) -> int:
    """The bytes a call of ``weigh``'s size and parts makes the engine hold at its peak: the parsed
    message, the request made of it and numpy's temporaries (each at most ``size``), and each part's
    objects (``PART_COST``)."""
    return 3 * size + PART_COST * parts


def as_request(request: pb.ModelInferRequest) -> RequestInput:
    """The v2 REST request in the binary tensor extension for a gRPC ModelInferRequest (KServe's
    ``InferRequest.to_rest`` header: id, model_name, inputs, outputs, parameters). Slow for big
    tensors: run it off the event loop."""
    raws = list(request.raw_input_contents)
    if raws and len(raws) != len(request.inputs):
        raise ValueError(f"{len(raws)} raw_input_contents for {len(request.inputs)} inputs")
    inputs, datas = [], []
    for index, tensor in enumerate(request.inputs):
        if raws:
            raw = raws[index]
        elif tensor.datatype == "BYTES":
            raw = encode_tensor("BYTES", tensor.contents.bytes_contents)
        elif tensor.datatype in CONTENTS:
            raw = packed(tensor.contents, tensor.datatype)
        else:
            raise ValueError(f"input {tensor.name!r}: {tensor.datatype} tensors come as raw_input_contents only")
        parameters = to_http_parameters(tensor.parameters) if tensor.parameters else {}
        described = {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype}
        described["parameters"] = {**parameters, "binary_data_size": len(raw)}
        inputs.append(described)
        datas.append(raw)
    header = {"id": request.id or str(uuid.uuid4()), "model_name": request.model_name, "inputs": inputs}
    outputs = [
        {"name": o.name, **({"parameters": to_http_parameters(o.parameters)} if o.parameters else {})}
        for o in request.outputs
    ]
    if outputs:
        header["outputs"] = outputs
    if request.parameters:
        header["parameters"] = to_http_parameters(request.parameters)
    head = to_json(header)
    del header, outputs  # their strings (a parameter's may be as long as the message) gone before the join
    body = b"".join([head, *datas])
    return RequestInput(body, {"content-type": "application/octet-stream", HEADER.lower(): str(len(head))})


def packed(contents: pb.InferTensorContents, datatype: str) -> memoryview:
    """A typed ``contents`` field as the v2 binary form of ``datatype``, read off the message's wire
    bytes (a packed repeated field: floats as they are, integers as varints decoded with numpy)."""
    field = contents.DESCRIPTOR.fields_by_name[CONTENTS[datatype]]
    wire = memoryview(contents.SerializeToString())
    chunks = [payload for number, payload in wire_fields(wire) if number == field.number and payload is not None]
    data = chunks[0] if len(chunks) == 1 else memoryview(b"".join(chunks))
    if datatype in ("FP32", "FP64"):  # fixed32/fixed64, little-endian: already the binary form
        return data
    np = numpy()
    values = varints(np.frombuffer(data, np.uint8))
    return memoryview(values.view(np.int64).astype(NUMERIC[datatype]).tobytes())


def varints(data):
    """Protobuf varints (a numpy uint8 array of them, back to back) as uint64 values, with numpy."""
    np = numpy()
    ends = np.flatnonzero(data < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    values = np.zeros(len(ends), np.uint64)
    for k in range(10):  # a varint has at most 10 bytes
        at = starts + k
        live = at <= ends
        if not live.any():
            break
        values[live] |= (data[at[live]] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return values


def as_answer(response: Response, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    """The handler's v2 answer (JSON or binary) as a ModelInferResponse; slow for big tensors."""
    body = response.body or b""
    length = header_length(response.headers)
    if length is not None:
        answer = InferResponse.from_bytes(body, length)
    else:
        answer = InferResponse.from_rest(json.loads(body))
    answer.model_name = answer.model_name or request.model_name
    answer.id = answer.id or request.id
    return answer.to_grpc()


def version_label(request) -> str:
    """The model a call names, as REST's 404 names it: NAME, or NAME version V."""
    name = getattr(request, "model_name", "") or request.name
    version = getattr(request, "model_version", "") or getattr(request, "version", "")
    return f"{name} version {version}" if version else name


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, engine):
        self.engine = engine

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.engine.ready)

    async def ModelReady(self, request, context):
        model = self.engine.find(request.name, request.version or None)
        if model is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Model not found: {version_label(request)}")
        return pb.ModelReadyResponse(ready=model.ready)

    async def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="tsctl", version=version_string(), extensions=["binary_tensor_data"])

    async def ModelMetadata(self, request, context):
        model = self.engine.find(request.name, request.version or None)
        if model is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Model not found: {version_label(request)}")
        versions = sorted(self.engine.versions[request.name])
        declared = model.v2_metadata or {"inputs": [], "outputs": []}  # (no field to say it is not declared)
        tensors = {
            side: [pb.ModelMetadataResponse.TensorMetadata(**t) for t in declared[side]]
            for side in ("inputs", "outputs")
        }
        return pb.ModelMetadataResponse(name=request.name, versions=versions, platform="pytorch_torchserve", **tensors)

    async def ModelInfer(self, data: bytes, context):
        """``data``: the call's message unparsed (``start_grpc``), counted before it is parsed."""
        loop, inflight, held = asyncio.get_running_loop(), self.engine.inflight, 0
        client = client_of(context.peer())
        try:
            if not inflight.take(len(data), client):  # the message gRPC holds for as long as the call lasts
                await context.abort(grpc.StatusCode.UNAVAILABLE, inflight.busy(len(data), client))
            held = len(data)
            try:
                size, parts = await loop.run_in_executor(None, weigh, data, self.engine.frontend.max_request_size)
            except ValueError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            cost = conversion_cost(size, parts)
            if not inflight.take(cost, client):  # what parsing and converting it will hold, counted before either
                await context.abort(grpc.StatusCode.UNAVAILABLE, inflight.busy(cost, client))
            held += cost
            try:
                request = await loop.run_in_executor(None, pb.ModelInferRequest.FromString, data)
            except Exception as exc:  # noqa: BLE001 - not a ModelInferRequest
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request could not be read: {exc}")
            model = self.engine.find(request.model_name, request.model_version or None)
            if model is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"Model not found: {version_label(request)}")
            try:
                http = await loop.run_in_executor(None, as_request, request)
            except Exception as exc:  # noqa: BLE001 - a request that cannot be read
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request could not be read: {exc}")
            response = await model.submit(http, request.model_version or None)
        finally:
            inflight.give(held, client)
        if response.status >= 400:
            body = response.body or b""
            try:
                message = json.loads(body).get("message", "")
            except (ValueError, AttributeError):
                message = body.decode("utf-8", errors="replace")
            await context.abort(STATUS.get(response.status, grpc.StatusCode.INTERNAL), message)
        try:
            return await loop.run_in_executor(None, as_answer, response, request)
        except Exception as exc:  # noqa: BLE001 - the handler's answer is not a v2 response
            await context.abort(grpc.StatusCode.INTERNAL, f"the model's answer is not a KServe v2 response: {exc}")


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """TorchServe's token check of a gRPC call (its GRPCInterceptor): the inference key in the call's
    ``authorization`` metadata (``Bearer KEY``), else ``PERMISSION_DENIED`` with TorchServe's message."""

    def __init__(self, tokens):
        self.tokens = tokens

    async def intercept_service(self, continuation, details):
        header = next((value for key, value in details.invocation_metadata or () if key == "authorization"), None)
        if isinstance(header, bytes):
            header = header.decode("latin-1")
        if self.tokens.check(INFERENCE, header):
            return await continuation(details)
        return refusal(grpc.StatusCode.PERMISSION_DENIED, MESSAGE)  # its message never read


async def start_grpc(engine, host: str, port: int):
    interceptors = [TokenInterceptor(engine.tokens)] if engine.tokens is not None else []
    limit = engine.frontend.max_request_size
    server = grpc.aio.server(options=server_options(limit), interceptors=interceptors)
    servicer, methods = Servicer(engine), _Methods()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, methods)  # KServe's handlers, taken as made
    infer = methods.handlers["ModelInfer"]
    methods.handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer, request_deserializer=None, response_serializer=infer.response_serializer
    )  # the message's bytes as they came: counted before they are parsed (this module's docstring)
    methods.handlers = counted(engine, limit).handlers(methods.handlers)  # counted while they arrive
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods.handlers),))
    server.add_registered_method_handlers(SERVICE, methods.handlers)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise RuntimeError(f"the gRPC port {host}:{port} could not be bound")
    await server.start()
    return server


SERVICE = "inference.GRPCInferenceService"


class _Methods:
    """Stands for the server in KServe's ``add_GRPCInferenceServiceServicer_to_server``: keeps the
    method handlers it makes, so that ``start_grpc`` registers them with ModelInfer's replaced."""

    handlers: dict = {}

    def add_generic_rpc_handlers(self, handlers):
        pass

    def add_registered_method_handlers(self, service, handlers):
        self.handlers = dict(handlers)
