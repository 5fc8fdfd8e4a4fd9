"""The tsctl engine's KServe v2 gRPC service (``inference.GRPCInferenceService``), bound where REST binds.

A ``ModelInfer`` call becomes the v2 REST request it stands for, in the binary tensor extension
(tensors stay the bytes they came as: ``raw_input_contents`` go on as they are), and goes to the
model's workers like any request; the handler's v2 answer (JSON or binary) is turned back into a
``ModelInferResponse`` with KServe's own protocol types. The repository calls (load, unload) are
not served: ``UNIMPLEMENTED``, as is everything else that would change state.
"""

import json

import grpc
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc
from kserve.protocol.infer_type import InferRequest, InferResponse, to_http_parameters

from .protocol import HEADER, encode_tensor, header_length
from .ts_wire import Request

STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    507: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def as_request(request: pb.ModelInferRequest) -> Request:
    """The v2 REST request (binary extension when any tensor came raw) for a gRPC ModelInferRequest."""
    infer = InferRequest.from_grpc(request)
    for tensor in infer.inputs:
        raw = tensor._raw_data  # raw_input_contents, kept as bytes by KServe: they follow the JSON header
        if raw is None and tensor.datatype == "BYTES" and tensor.data:  # contents.bytes_contents: bytes, not JSON
            raw = tensor._raw_data = encode_tensor("BYTES", tensor.data)
            tensor._data = None
        if raw is not None:
            parameters = to_http_parameters(tensor.parameters or {})
            tensor.parameters = {**parameters, "binary_data_size": len(raw)}
    body, json_length = infer.to_rest()
    if json_length is None:
        return Request(json.dumps(body).encode("utf-8"), {"content-type": "application/json"})
    return Request(body, {"content-type": "application/octet-stream", HEADER.lower(): str(json_length)})


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
        try:
            http = as_request(request)
        except Exception as exc:  # noqa: BLE001 - a request KServe's types cannot read
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request could not be read: {exc}")
        response = await model.submit(http)
        body = response.body or b""
        if response.status >= 400:
            try:
                message = json.loads(body).get("message", "")
            except (ValueError, AttributeError):
                message = body.decode("utf-8", errors="replace")
            await context.abort(STATUS.get(response.status, grpc.StatusCode.INTERNAL), message)
        try:
            length = header_length(response.headers)
            if length is not None:
                answer = InferResponse.from_bytes(body, length)
            else:
                answer = InferResponse.from_rest(json.loads(body))
            answer.model_name = answer.model_name or request.model_name
            answer.id = answer.id or request.id
            return answer.to_grpc()
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
