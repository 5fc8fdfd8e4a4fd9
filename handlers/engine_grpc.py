"""The tsctl engine's KServe v2 gRPC service (``inference.GRPCInferenceService``), bound where REST binds.

A ``ModelInfer`` call becomes the v2 REST request it stands for, always in the binary tensor
extension: ``raw_input_contents`` go on as they are, typed ``contents`` (``fp32_contents`` ...) as
their binary form read off the message's own wire bytes with numpy (never a Python number per
element, never JSON numbers), ``bytes_contents`` as a BYTES tensor; then it goes to the model's
workers like any request. The conversion runs in a thread, off the event loop, and the call's
bytes (the message and the request made of it) count against the engine's bodies in flight
(``body_limit.InFlight``, REST's counter): above ``--max_inflight_bytes`` a call gets UNAVAILABLE
with REST's 503 message. The handler's v2 answer (JSON or binary) is turned back into a
``ModelInferResponse`` with KServe's own protocol types, also off the loop. The repository calls
(load, unload) are not served: ``UNIMPLEMENTED``, as is everything else that would change state.
"""

import asyncio
import json
import uuid

import grpc
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc
from kserve.protocol.infer_type import InferResponse, to_http_parameters

from .protocol import HEADER, NUMERIC, encode_tensor, header_length, numpy, to_json
from .ts_wire import Request, Response

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


def as_request(request: pb.ModelInferRequest) -> Request:
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
    body = b"".join([head, *datas])
    return Request(body, {"content-type": "application/octet-stream", HEADER.lower(): str(len(head))})


def packed(contents: pb.InferTensorContents, datatype: str) -> memoryview:
    """A typed ``contents`` field as the v2 binary form of ``datatype``, read off the message's wire
    bytes (a packed repeated field: floats as they are, integers as varints decoded with numpy)."""
    field = contents.DESCRIPTOR.fields_by_name[CONTENTS[datatype]]
    wire = memoryview(contents.SerializeToString())
    chunks = [payload for number, payload in wire_fields(wire) if number == field.number]
    data = chunks[0] if len(chunks) == 1 else memoryview(b"".join(chunks))
    if datatype in ("FP32", "FP64"):  # fixed32/fixed64, little-endian: already the binary form
        return data
    np = numpy()
    values = varints(np.frombuffer(data, np.uint8))
    return memoryview(values.view(np.int64).astype(NUMERIC[datatype]).tobytes())


def wire_fields(wire: memoryview):
    """(field number, payload) of each length-delimited field of a protobuf message's wire bytes."""
    at = 0
    while at < len(wire):
        key, at = varint_at(wire, at)
        kind = key & 7
        if kind == 2:
            length, at = varint_at(wire, at)
            yield key >> 3, wire[at : at + length]
            at += length
        elif kind == 0:
            _, at = varint_at(wire, at)
        elif kind in (1, 5):
            at += 8 if kind == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {kind} in the tensor's contents")


def varint_at(wire: memoryview, at: int):
    value = shift = 0
    while True:
        byte = wire[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


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
        from .engine import version_string

        return pb.ServerMetadataResponse(name="tsctl", version=version_string(), extensions=["binary_tensor_data"])

    async def ModelMetadata(self, request, context):
        model = self.engine.find(request.name, request.version or None)
        if model is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Model not found: {version_label(request)}")
        versions = sorted(self.engine.versions[request.name])
        return pb.ModelMetadataResponse(name=request.name, versions=versions, platform="pytorch_torchserve")

    async def ModelInfer(self, request, context):
        model = self.engine.find(request.model_name, request.model_version or None)
        if model is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Model not found: {version_label(request)}")
        loop, inflight, held = asyncio.get_running_loop(), self.engine.inflight, 0
        try:
            size = request.ByteSize()  # the message gRPC holds for as long as the call lasts
            if not inflight.take(size):
                await context.abort(grpc.StatusCode.UNAVAILABLE, inflight.busy())
            held = size
            try:
                http = await loop.run_in_executor(None, as_request, request)
            except Exception as exc:  # noqa: BLE001 - a request that cannot be read
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request could not be read: {exc}")
            if not inflight.take(len(http.body)):  # the request made of it, held beside it until answered
                await context.abort(grpc.StatusCode.UNAVAILABLE, inflight.busy())
            held += len(http.body)
            response = await model.submit(http)
        finally:
            inflight.give(held)
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


async def start_grpc(engine, host: str, port: int):
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", engine.frontend.max_request_size)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(engine), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise RuntimeError(f"the gRPC port {host}:{port} could not be bound")
    await server.start()
    return server
