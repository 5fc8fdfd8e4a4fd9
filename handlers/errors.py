"""Errors, in one place: the refusal of one request (``ClientError`` and its kinds), the status every
other failure gets (``STATUS``, ``error_for``), and the error bodies every part of tsctl sends.

**Statuses.** ``ClientError(message, status)`` is one request's refusal, answered with its status and
``{"code", "type", "message"}``. Any other exception gets its status from ``STATUS``, by where it
was raised (``error_for``): reading or decoding a request (400; 413 for input too deep or too big to
hold), the model failing on one request (500 ``InferenceError``; 507 out of memory), a handler's
entry point failing for a whole batch (TorchServe's 503 "Prediction failed", 507 "Out of
resources") or a worker dying (500 "Worker died.").

**Bodies**, one builder per wire format, used by the toolkit's handlers, the tsctl engine (HTTP,
its workers, TorchServe's wire), the KServe transformer and the MLServer runtime:

- ``error_body``: TorchServe's ``{"code", "type", "message"}``; on KServe's routes (``kserve``) it
  also carries KServe's own ``{"error": message}``, so that clients of either read it;
- ``frontend_error``: that body as TorchServe's frontend (Java) writes the errors it makes itself,
  indented by two spaces, a line break after: every error the tsctl engine makes itself;
- ``with_kserve_error``: a handler's error body given KServe's ``error`` key on KServe's routes;
- ``error_message``: the message in an error body, whichever of the two it is.

Standard library only: the serving side, the CLI and the toolkit's handlers import it.
"""

import json
from http import HTTPStatus
from typing import Any, Dict


class ClientError(Exception):
    """A problem with one request: answered with ``status`` and a JSON body, never a worker crash."""

    kind = "ClientError"
    headers: Dict[str, str] = {}  # sent with the answer (Busy: Retry-After)

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST):
        super().__init__(message)
        self.message = message
        self.status = int(status)  # an int wherever it goes: before Python 3.11, str() of an HTTPStatus is its name

    def body(self) -> dict:
        return error_body(self.status, self.kind, self.message)


class InferenceError(ClientError):
    """The model failed on one request's inputs (the 500 that request gets, not a client mistake)."""

    kind = "InferenceError"

    def __init__(self, message: str, status: int = HTTPStatus.INTERNAL_SERVER_ERROR):
        super().__init__(message, status)


class ServerError(ClientError):
    """A batch or a worker that failed as a whole, in the words of TorchServe's frontend."""

    kind = "InternalServerException"


class Busy(ClientError):
    """A request within its own limits that does not fit beside the rest of its batch (the batch's
    budget, handlers/base.py): 503 with ``Retry-After``; sent again, it is read in another batch."""

    kind = "ServiceUnavailable"
    headers = {"Retry-After": "1"}

    def __init__(self, message: str, status: int = HTTPStatus.SERVICE_UNAVAILABLE):
        super().__init__(message, status)


READ, INFERENCE, BATCH, WORKER = "read", "inference", "batch", "worker"

# Where an exception was raised -> (exception type, status, error class, message or None for the
# exception's own words); the first row whose type matches wins. A ClientError keeps its own status.
STATUS = {
    READ: (  # parsing a request or decoding one of its items: the input is at fault
        (RecursionError, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, ClientError, "it is nested too deeply"),
        (MemoryError, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, ClientError, "it needs more memory than the worker has"),
        (BaseException, HTTPStatus.BAD_REQUEST, ClientError, None),
    ),
    INFERENCE: (  # preprocess/inference/postprocess failed for one request run alone
        (MemoryError, HTTPStatus.INSUFFICIENT_STORAGE, InferenceError, "out of memory"),
        (BaseException, HTTPStatus.INTERNAL_SERVER_ERROR, InferenceError, None),
    ),
    BATCH: (  # a handler's entry point failed for a whole batch (TorchServe's Service.predict)
        (MemoryError, HTTPStatus.INSUFFICIENT_STORAGE, ServerError, "Out of resources"),
        (BaseException, HTTPStatus.SERVICE_UNAVAILABLE, ServerError, "Prediction failed"),
    ),
    WORKER: (  # what would end a worker process
        (BaseException, HTTPStatus.INTERNAL_SERVER_ERROR, ServerError, "Worker died."),
    ),
}


def out_of_memory(exc: BaseException) -> bool:
    """MemoryError, or torch's (CUDA) OutOfMemoryError, which TorchServe answers 507 as well."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or "CUDA out of memory" in str(exc)


def error_for(exc: BaseException, stage: str = READ, what: str = "") -> ClientError:
    """The error a request gets for ``exc`` raised at ``stage`` (``STATUS``); ``what`` prefixes the
    message (``"the request could not be read"``)."""
    if isinstance(exc, ClientError):
        return forget(exc)
    kind = MemoryError if out_of_memory(exc) else type(exc)
    _, status, error_class, words = next(row for row in STATUS[stage] if issubclass(kind, row[0]))
    message = words or f"{type(exc).__name__}: {exc}"
    return error_class(f"{what}: {message}" if what else message, status)


def forget(error: BaseException) -> BaseException:
    """``error`` without its traceback and chained exceptions: a refusal kept until its batch is
    answered must not keep the frames that read the request, and with them its parsed body (770 MB
    for a 32 MiB ``[[],[],...]``)."""
    error.__traceback__ = error.__context__ = error.__cause__ = None
    return error


def too_large(subject: str, value: int, unit: str, setting: str, limit: int, why: str = "") -> ClientError:
    """The 413 for a request above one of its limits, naming the ``handler:`` setting that sets it (or ``why``,
    when something else set it): ``too_large("the text is", 200000, "characters", ...)``."""
    message = f"{subject} {value:,} {unit}, above the limit of {limit:,} ({why or 'handler.' + setting})"
    return ClientError(message, HTTPStatus.REQUEST_ENTITY_TOO_LARGE)


def too_deep(limit: int) -> ClientError:
    message = f"the JSON body is nested deeper than the limit of {limit} levels (handler.max_json_depth)"
    return ClientError(message, HTTPStatus.REQUEST_ENTITY_TOO_LARGE)


# ---- the bodies --------------------------------------------------------------------------------------
def error_body(status: int, kind: str, message: str, kserve: bool = False) -> Dict[str, Any]:
    """TorchServe's error body; ``kserve``: with KServe's ``error`` key too (what KServe's errors carry)."""
    body: Dict[str, Any] = {"code": int(status), "type": kind, "message": message}
    if kserve:
        body["error"] = message
    return body


def frontend_error(status: int, kind: str, message: str, kserve: bool = False) -> bytes:
    """An error TorchServe's frontend makes itself (an unknown model or path, a worker died, a queue is
    full, an answer too large, a missing token), byte for byte as it sends it: ``error_body`` indented by
    two spaces and a line break (NettyUtils.sendJsonResponse). Every error the tsctl engine makes itself is
    this body, on TorchServe's routes and on KServe's (``kserve``: with KServe's ``error`` key too)."""
    return json.dumps(error_body(status, kind, message, kserve), indent=2).encode() + b"\n"


def with_kserve_error(body: bytes) -> bytes:
    """A handler's or worker's error body as KServe's routes send it: a JSON object without an
    ``error`` key gets one (its ``message``, else the body's text); anything else is left as it is."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if not isinstance(parsed, dict) or "error" in parsed:
        return body
    parsed["error"] = parsed.get("message", body.decode("utf-8", errors="replace"))
    return json.dumps(parsed).encode()


def error_message(body: Any) -> str:
    """The message of an error body (``message``, else KServe's ``error``), else its text (at most
    2,000 characters of a body that is no JSON). ``body``: the bytes, or the JSON already parsed."""
    if isinstance(body, (bytes, bytearray)):
        try:
            body = json.loads(bytes(body).decode("utf-8"))
        except ValueError:  # UnicodeDecodeError among them
            return bytes(body).decode("utf-8", errors="replace")[:2000]
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or body)
    return str(body)
