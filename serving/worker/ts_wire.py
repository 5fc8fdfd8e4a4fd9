"""TorchServe's frontend-worker wire protocol, both halves the frontend speaks, without torch.

- ``RequestInput``/``Response``: one HTTP request to ``/predictions/MODEL`` and what the frontend sends back.
- ``encode_load``/``encode_batch``: the load and inference commands the frontend writes to a worker's
  socket (``ts/protocol/otf_message_handler.py`` reads them).
- ``read_reply``/``read_answers``/``Stream``: the worker's reply (``create_predict_response``) read
  back as the frontend reads it: per request the status, content type, headers and body bytes.

Used by the tsctl engine's workers (``serving/worker/worker_process.py``), which ``LocalModel`` starts too
(``serving/local_model.py``); the engine's server process never imports torch.
"""

import json
import re
import socket
import struct
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Collection, Dict, List, Optional, Tuple

from handlers.errors import frontend_error

# A worker's log around a failed load: TorchServe re-raises the real error as "RuntimeError: 500 - ..."
# and then retries the handler as a built-in ("No module named 'ts.torch_handler.x'"): neither is the cause.
RERAISE = re.compile(r"^RuntimeError: \d{3} - ")
FALLBACK = re.compile(r"No module named 'ts\.torch_handler\.")


def cause_of(errors: List[str]) -> Optional[str]:
    """The worker's real error among the Python error lines of its log: the last that is neither
    TorchServe's re-raise nor its fallback import, else the last of them, else None."""
    real = [error for error in errors if not RERAISE.search(error) and not FALLBACK.search(error)]
    return (real or errors or [None])[-1]


@dataclass
class RequestInput:
    """One HTTP request to ``/predictions/MODEL``: its body and its headers (Content-Type among them);
    or, with ``inputs``, a request of TorchServe's gRPC API: each entry of its ``input`` map a
    parameter of its own, (name, MIME type, value), as TorchServe's frontend passes them. Named as
    the frontend names it (``org.pytorch.serve.util.messages.RequestInput``); a decoded request of
    the toolkit is ``handlers.decoding.Request``."""

    body: bytes
    headers: Dict[str, str] = field(default_factory=dict)
    inputs: Optional[List[Tuple[str, str, bytes]]] = None

    @property
    def content_type(self) -> str:
        return mime_type(self.headers)

    def parameters(self) -> List[Tuple[str, str, bytes]]:
        """What the frontend sends the worker for it: (name, MIME type, value) each; one ``body``, or
        the gRPC request's ``inputs``."""
        if self.inputs is not None:
            return self.inputs
        return [("body", self.content_type, self.body)]


def mime_type(headers: Dict[str, str]) -> str:
    """The Content-Type's MIME type, without parameters (``charset=``), as the frontend passes it on."""
    for name, value in headers.items():
        if name.lower() == "content-type":
            return value.split(";", 1)[0].strip()
    return ""


@dataclass
class Response:
    """What TorchServe's frontend sends back for one request."""

    status: int
    body: Any  # bytes, as a client receives them
    content_type: Optional[str] = None
    headers: dict = field(default_factory=dict)
    # Made by the frontend, not by the handler: the request failed (a worker that died or did not answer in
    # time, an answer above max_response_size, a batch the worker failed as a whole). TorchServe's gRPC API
    # sends these as the call's error status, a handler's answer as a prediction whatever its status.
    error: bool = False
    # The frontend did not take it in (no worker, its queue or sequence full: workers.refused);
    # TorchServe's gRPC API answers these INTERNAL, naming ``InternalServerException.()`` (InferenceImpl.prediction).
    refused: bool = False
    # A streamed answer's parts after this one (streams.Parts), for a handler that sends
    # intermediate responses (send_intermediate_predict_response); None: the answer is whole.
    rest: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.status = int(self.status)  # an HTTPStatus as its number: str() of one is its name before Python 3.11

    @property
    def streams(self) -> bool:
        """This part says more parts follow (TorchServe's ``ts_stream_next: true``)."""
        return self.headers.get(STREAM_NEXT) == "true"

    def json(self):
        body = self.body
        if isinstance(body, (bytes, bytearray)):
            body = body.decode("utf-8")
        return json.loads(body) if isinstance(body, str) else body

    def answer(self):
        """The body as JSON when it is JSON, else as text when it is UTF-8, else the bytes."""
        try:
            return self.json()
        except (UnicodeDecodeError, ValueError):
            try:
                return self.body.decode("utf-8")
            except (AttributeError, UnicodeDecodeError):
                return self.body


STREAM_NEXT = "ts_stream_next"  # the header a streamed answer's parts carry: "true" but on the last


def _field(data: bytes) -> bytes:
    return struct.pack("!i", len(data)) + data


def encode_load(
    name: str,
    model_dir: Path,
    handler: str,
    batch_size: int,
    envelope: Optional[str],
    limit_max_image_pixels: bool = True,
    gpu: int = -1,
) -> bytes:
    """The load command (``otf_message_handler._retrieve_load_msg`` reads it): ``gpu`` the worker's GPU id
    (serving/gpus.py places it), -1 on the CPU; the worker hands a GPU's id to the handler as
    ``context.system_properties["gpu_id"]``, and None on the CPU."""
    return b"".join(
        [
            b"L",
            _field(name.encode()),
            _field(str(model_dir).encode()),
            struct.pack("!i", batch_size),
            _field(handler.encode()),
            struct.pack("!i", gpu),
            _field((envelope or "").encode()),
            struct.pack("!?", limit_max_image_pixels),
        ]
    )


def encode_batch(requests: List[RequestInput], ids: List[str]) -> List[bytes]:
    """The inference command for one batch (``_retrieve_inference_msg`` reads it): per request its
    id, its HTTP headers, and its parameters (``RequestInput.parameters``: one ``body`` with the request's
    MIME type). Returned as the pieces to send in order, each body as it is (not copied into one message)."""
    pieces, head = [], [b"I"]
    for request, request_id in zip(requests, ids):
        head.append(_field(request_id.encode()))
        for name, value in request.headers.items():
            head.append(_field(name.encode("utf-8")) + _field(value.encode("utf-8")))
        head.append(struct.pack("!i", -1))
        for name, kind, value in request.parameters():
            head.append(_field(name.encode("utf-8")) + _field(kind.encode("utf-8")))
            pieces += [b"".join(head) + struct.pack("!i", len(value)), value]
            head = []
        head.append(struct.pack("!i", -1))  # the end of this request's parameters
    head.append(struct.pack("!i", -1))
    return pieces + [b"".join(head)]


class WorkerDied(Exception):
    """The worker's process ended (or its socket closed) with requests of ours inside it."""


class BrokenReply(Exception):
    """The worker's reply is not TorchServe's protocol (a handler wrote to ``context.cl_socket``): a
    code or status outside 100-599, a negative length, a count below 0, text that is not UTF-8. What
    follows on the socket cannot be read: the worker must be replaced."""


ID_LENGTH = 256  # bytes of a request id read to compare with the batch's (ours: 36); a longer one is not ours


class Stream:
    """Reads the worker's replies off its socket: length-prefixed fields, big-endian."""

    def __init__(self, sock: socket.socket):
        self.file = sock.makefile("rb")

    def exactly(self, length: int) -> bytes:
        data = self.file.read(length)
        if data is None or len(data) < length:
            raise WorkerDied("the worker closed its socket")
        return data

    def int(self) -> int:
        return struct.unpack("!i", self.exactly(4))[0]

    def field(self) -> bytes:
        length = self.int()
        return b"" if length < 0 else self.exactly(length)

    def length(self, what: str) -> int:
        """A field's length: -1 (no field) reads as 0; below -1 the reply is broken."""
        length = self.int()
        if length < -1:
            raise BrokenReply(f"its reply gives {what} a length of {length}")
        return max(length, 0)

    def reply(self, limit: int, sizes: Dict[str, int], ids: Collection[str]) -> Tuple[int, str, Dict[str, Response]]:
        """One reply (``create_predict_response``) read off the socket as TorchServe's frontend decodes
        it (``ModelResponseDecoder``): its code, message and answers by request id, each field read
        once, where it lands (no whole-reply buffer, no copy). Every field's length is read before
        the field, and nothing is held that the limit does not allow:

        - an answer counts its content type, reason phrase, header names and values and body against
          ``limit`` (``max_response_size``), with what came of it in earlier replies (``sizes``, by
          request id: a streamed answer's chunks add up; updated here, -1 once it passed): what would
          take it above is read and dropped a MiB at a time, so the reply is read to its end and the
          worker goes on serving, and that request's answer is ``too_large()``;
        - an answer to a request id not in ``ids`` (the batch's) is read and dropped whole;
        - a reply that does not parse raises ``BrokenReply`` (the code or a status outside 100-599, a
          negative length or header count, text that is not UTF-8: a real worker writes none of
          them)."""
        code = self.int()
        if not 100 <= code <= 599:
            raise BrokenReply(f"its reply's code is {code}")
        length = self.length("the message")
        if length > limit:
            self.drop(length)
            message = ""
        else:
            message = text(self.exactly(length), "the message")
        answers: Dict[str, Response] = {}
        while True:
            length = self.int()
            if length == -1:
                return code, message, answers
            if length < -1:
                raise BrokenReply(f"its reply gives a request id a length of {length}")
            request_id = None
            if length <= ID_LENGTH:
                request_id = text(self.exactly(length), "a request id")
            else:
                self.drop(length)
            used = sizes.get(request_id, 0) if request_id in ids else -1
            room = limit - used if used >= 0 else -1  # -1: keep nothing of this answer
            status, kind, headers, body, size = self.answer(room)
            if request_id not in ids:
                continue  # no request of this batch: nothing of it kept
            if body is None:  # above the limit: dropped
                sizes[request_id] = -1
                stream = {k: v for k, v in headers.items() if k == "ts_stream_next"}  # where the stream ends
                answers[request_id] = too_large(max(used, 0) + size, stream)
                continue
            sizes[request_id] = used + size
            answers[request_id] = Response(status, body, kind or None, headers)

    def answer(self, room: int) -> Tuple[int, str, Dict[str, str], Optional[bytes], int]:
        """One answer's status, content type, headers and body, and its size (every field's bytes);
        the body None once the size passed ``room``: from there every field is dropped as it comes
        but ``ts_stream_next``."""
        size, over = 0, room < 0

        def field(what: str, small: int = 0) -> Optional[bytes]:
            nonlocal size, over
            length = self.length(what)
            size += length
            over = over or size > room
            if over and length > small:
                self.drop(length)
                return None
            return self.exactly(length)

        kind = field("a content type")
        status = self.int()
        if not 100 <= status <= 599:
            raise BrokenReply(f"its reply gives an answer the status {status}")
        field("a reason phrase")
        count = self.int()
        if count < 0:
            raise BrokenReply(f"its reply gives an answer {count} headers")
        headers: Dict[str, str] = {}
        for _ in range(count):
            name = field("a header name", len(b"ts_stream_next"))
            value = field("a header value", len(b"false"))
            if name is not None and value is not None and (not over or name == b"ts_stream_next"):
                headers[text(name, "a header name")] = text(value, "a header value")
        body = field("a body")
        if over:
            return status, "", headers, None, size
        return status, text(kind, "a content type"), headers, body, size

    def drop(self, length: int, chunk: int = 1 << 20):
        """Read ``length`` bytes and keep none of them."""
        while length > 0:
            length -= len(self.exactly(min(length, chunk)))


def text(data: bytes, what: str) -> str:
    """A reply's text field: UTF-8, as TorchServe's worker encodes every one; else the reply is broken."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BrokenReply(f"{what} in its reply is not UTF-8") from None


def too_large(size: int, headers: Optional[dict] = None) -> Response:
    """The answer to a request whose answer is above ``max_response_size``: 500 and the message of
    TorchServe's ``CodecUtils.readLength`` (TorchServe then closes the worker's channel, the worker
    dies and the client gets 500 "Worker died."; here the reply is read to its end and the worker
    stays)."""
    message = (
        f"Message size exceed limit: {size}\nConsider increasing the 'max_response_size' in 'config.properties' to fix."
    )
    body = frontend_error(HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerException", message)
    return Response(HTTPStatus.INTERNAL_SERVER_ERROR, body, "application/json", dict(headers or {}), error=True)


def read_reply(reply: bytes, request_ids: List[str]) -> List[Response]:
    """The worker's reply (``create_predict_response``) as the frontend turns it into HTTP answers."""
    code, message, answers = read_answers(reply)
    if code != 200:
        return batch_error(code, message, len(request_ids))
    return [answers[i] for i in request_ids]


def batch_error(code: int, message: str, count: int) -> List[Response]:
    """BatchAggregator.sendResponse for a batch that failed as a whole: every job gets the error."""
    status = HTTPStatus.INSUFFICIENT_STORAGE if code == HTTPStatus.REQUEST_ENTITY_TOO_LARGE else code
    body = frontend_error(status, "InternalServerException", message)
    return [Response(status, body, "application/json", error=True) for _ in range(count)]


def read_answers(reply: bytes) -> Tuple[int, str, Dict[str, Response]]:
    """A reply's code, message and answers by request id (a streamed reply holds some of a batch's)."""
    reader = _Reader(reply)
    code, message = reader.int(), reader.text()
    answers = {}
    while True:
        request_id = reader.text()
        if request_id is None:
            break
        kind = reader.text()
        status, _phrase = reader.int(), reader.text()
        headers = {reader.text(): reader.text() for _ in range(reader.int())}
        answers[request_id] = Response(status, reader.bytes(), kind or None, headers)
    return code, message, answers


class _Reader:
    """Big-endian length-prefixed fields, as ``otf_message_handler`` writes them."""

    def __init__(self, data: bytes):
        self.data, self.at = bytes(data), 0

    def int(self) -> int:
        (value,) = struct.unpack_from("!i", self.data, self.at)
        self.at += 4
        return value

    def bytes(self) -> Optional[bytes]:
        length = self.int()
        if length < 0:
            return None
        value = self.data[self.at : self.at + length]
        self.at += length
        return value

    def text(self) -> Optional[str]:
        value = self.bytes()
        return None if value is None else value.decode("utf-8")
