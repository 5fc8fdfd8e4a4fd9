"""TorchServe's frontend-worker wire protocol, both halves the frontend speaks, without torch.

- ``Request``/``Response``: one HTTP request to ``/predictions/MODEL`` and what the frontend sends back.
- ``encode_load``/``encode_batch``: the load and inference commands the frontend writes to a worker's
  socket (``ts/protocol/otf_message_handler.py`` reads them).
- ``read_reply``/``read_answers``/``Stream``: the worker's reply (``create_predict_response``) read
  back as the frontend reads it: per request the status, content type, headers and body bytes.

Used in-process by ``handlers/worker.py`` (LocalModel) and across processes by the tsctl engine
(``handlers/engine_workers.py``); the engine's server process never imports torch.
"""

import json
import re
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

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
class Request:
    """One HTTP request to ``/predictions/MODEL``: its body and its headers (Content-Type among them)."""

    body: bytes
    headers: Dict[str, str] = field(default_factory=dict)

    @property
    def content_type(self) -> str:
        return mime_type(self.headers)


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


def _field(data: bytes) -> bytes:
    return struct.pack("!i", len(data)) + data


def encode_load(name: str, model_dir: Path, handler: str, batch_size: int, envelope: Optional[str],
                limit_max_image_pixels: bool = True) -> bytes:  # fmt: skip
    """The load command (``otf_message_handler._retrieve_load_msg`` reads it); no gpu."""
    return b"".join(
        [
            b"L",
            _field(name.encode()),
            _field(str(model_dir).encode()),
            struct.pack("!i", batch_size),
            _field(handler.encode()),
            struct.pack("!i", -1),
            _field((envelope or "").encode()),
            struct.pack("!?", limit_max_image_pixels),
        ]
    )


def encode_batch(requests: List[Request], ids: List[str]) -> List[bytes]:
    """The inference command for one batch (``_retrieve_inference_msg`` reads it): per request its
    id, its HTTP headers, and one ``body`` parameter with the request's MIME type. Returned as the
    pieces to send in order, each body as it is (not copied into one message)."""
    pieces, head = [], [b"I"]
    for request, request_id in zip(requests, ids):
        head.append(_field(request_id.encode()))
        for name, value in request.headers.items():
            head.append(_field(name.encode("utf-8")) + _field(value.encode("utf-8")))
        head.append(struct.pack("!i", -1))
        head.append(_field(b"body") + _field(mime_type(request.headers).encode("utf-8")))
        pieces += [b"".join(head) + struct.pack("!i", len(request.body)), request.body]
        head = [struct.pack("!i", -1)]
    head.append(struct.pack("!i", -1))
    return pieces + [b"".join(head)]


class WorkerDied(Exception):
    """The worker's process ended (or its socket closed) with requests of ours inside it."""


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

    def reply(self, limit: int, sizes: Dict[str, int]) -> Tuple[int, str, Dict[str, Response]]:
        """One reply (``create_predict_response``) read off the socket as TorchServe's frontend decodes
        it (``ModelResponseDecoder``): its code, message and answers by request id, each field read
        once, where it lands (no whole-reply buffer, no copy). Every field's length is read before
        the field: a field above ``limit`` (``max_response_size``), or an answer's body that would
        take the answer above it (``sizes``: what came of each request's answer in earlier replies,
        as a streamed answer's chunks add up; updated here, -1 once it passed), is never held: its
        bytes are read and dropped a MiB at a time, so the reply is read to its end and the worker
        goes on serving, and that request's answer is ``too_large()``."""
        over = False

        def text() -> Optional[str]:
            nonlocal over
            length = self.int()
            if length > limit:
                self.drop(length)
                over = True
                return ""
            return None if length < 0 else self.exactly(length).decode("utf-8")

        code, message = self.int(), text()
        answers: Dict[str, Response] = {}
        while True:
            over = False
            request_id = text()
            if request_id is None:
                return code, message or "", answers
            kind = text()
            status, _phrase = self.int(), text()
            headers = {text(): text() for _ in range(self.int())}
            length, used = self.int(), sizes.get(request_id, 0)
            if over or used < 0 or used + length > limit:
                self.drop(length)
                sizes[request_id] = -1
                stream = {k: v for k, v in headers.items() if k == "ts_stream_next"}  # where the stream ends
                answers[request_id] = too_large(max(used, 0) + max(length, 0), stream)
                continue
            sizes[request_id] = used + max(length, 0)
            body = b"" if length < 0 else self.exactly(length)
            answers[request_id] = Response(status, body, kind or None, headers)

    def drop(self, length: int, chunk: int = 1 << 20):
        """Read ``length`` bytes and keep none of them."""
        while length > 0:
            length -= len(self.exactly(min(length, chunk)))


def too_large(size: int, headers: Optional[dict] = None) -> Response:
    """The answer to a request whose answer is above ``max_response_size``: 500 and the message of
    TorchServe's ``CodecUtils.readLength`` (TorchServe then closes the worker's channel, the worker
    dies and the client gets 500 "Worker died."; here the reply is read to its end and the worker
    stays)."""
    message = (
        f"Message size exceed limit: {size}\nConsider increasing the 'max_response_size' in 'config.properties' to fix."
    )
    body = json.dumps({"code": 500, "type": "InternalServerException", "message": message}, indent=2)
    return Response(500, body.encode(), "application/json", dict(headers or {}))


def read_reply(reply: bytes, request_ids: List[str]) -> List[Response]:
    """The worker's reply (``create_predict_response``) as the frontend turns it into HTTP answers."""
    code, message, answers = read_answers(reply)
    if code != 200:
        return batch_error(code, message, len(request_ids))
    return [answers[i] for i in request_ids]


def batch_error(code: int, message: str, count: int) -> List[Response]:
    """BatchAggregator.sendResponse for a batch that failed as a whole: every job gets the error."""
    status = 507 if code == 413 else code
    body = json.dumps({"code": status, "type": "InternalServerException", "message": message}, indent=2)
    return [Response(status, body.encode(), "application/json") for _ in range(count)]


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
