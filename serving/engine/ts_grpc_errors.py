"""TorchServe's gRPC failures as TorchServe 0.12 words them (``grpcimpl/``, ``GRPCUtils.java``): the status code
each HTTP status maps to (``GRPC_STATUS``), the Java exception each names, and ``ApiError``, the one error both
of its services (ts_grpc.py, ts_grpc_management.py) raise; ``find``, the model version a call names."""

import json
from typing import Optional

import grpc

from ..worker.ts_wire import Response
from . import ts_protos as pb
from .body_limit import Budget

MODEL_NOT_FOUND = "org.pytorch.serve.archive.model.ModelNotFoundException"
VERSION_NOT_FOUND = "org.pytorch.serve.archive.model.ModelVersionNotFoundException"
MODEL_EXCEPTION = "org.pytorch.serve.archive.model.ModelException"
INTERNAL_SERVER = "org.pytorch.serve.http.InternalServerException"
NOT_ADDED = "InternalServerException.()"  # InferenceImpl.prediction's description when ModelManager.addJob fails
BAD_REQUEST = "BadRequestException.()"
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
