"""One HTTP call to a server (``request``), as ``tsctl`` makes them, and the bounds on what it reads of a
server it may not have started (``bench``, ``shadow``, ``predict``, ``verify --url``).

Each bound is defined here and enforced in one place:

- **time**: a call ends by its deadline, ``timeout`` seconds after it starts, whatever the server does:
  every wait on its socket (connect, send, an interim ``100 Continue``, each read of the answer) waits only
  for the time left (``DeadlineSocket``), so an answer dripped a byte at a time, a ``100 Continue`` that
  never ends and an endless chunked answer all end with it. ``bench`` makes its calls on the same
  ``Connection``, each with its own deadline.
- **bytes**: an answer is read up to ``MAX_ANSWER_BYTES`` (``read_body``; bench drops what it reads).
- **parsing**: an answer read as JSON holds at most ``MAX_ANSWER_VALUES`` values, counted on its text
  before it is parsed, and nests at most ``MAX_ANSWER_DEPTH`` levels (``parse``: handlers/limits.py's
  counting and depth walk, as for a request). What parsing may take is then bounded: about
  ``limits.VALUE_BYTES`` (160 bytes) a value, 640 MB, beside the answer's bytes and its text.

Past a bound, an ``AnswerError``: one sentence naming the server's URL and the bound.
"""

import http.client
import json
import re
import select
import socket
import time
import urllib.parse
from typing import Dict, Optional, Tuple

MAX_ANSWER_BYTES = 256 << 20  # an answer larger is refused unread: no model's answer a tsctl command reads is near
MAX_ANSWER_VALUES = 4_000_000  # JSON values (list items, object members): a 2000x2000 output of floats
MAX_ANSWER_DEPTH = 64  # levels of JSON: a tensor's nest a few; past about 1,000 Python's parser recurses out
CHUNK = 1 << 20
EXPECT_CONTINUE = 1 << 20  # a body larger is sent after the server's 100 Continue, as curl sends it
MAX_INTERIM = 64 << 10  # bytes of an interim 100 Continue's head, as http.client bounds a final one's


class AnswerError(OSError):
    """A server's answer past one of this module's bounds: the message is one sentence naming the server's
    URL and the bound. An OSError, as a server that cannot be reached is."""


class Late(AnswerError, TimeoutError):
    """A call that had not ended by its deadline."""


def time_left(deadline: float) -> float:
    """Seconds until ``deadline`` (a ``time.monotonic()``); past it, ``TimeoutError``."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the call's deadline has passed")
    return left


class DeadlineSocket(socket.socket):
    """A socket whose every send and receive waits at most until ``deadline`` (a ``time.monotonic()``):
    the time left of the whole call, not a fresh timeout per wait. Past it, ``TimeoutError``."""

    deadline = 0.0

    def _time_left(self):
        self.settimeout(time_left(self.deadline))

    def recv(self, *args):
        self._time_left()
        return super().recv(*args)

    def recv_into(self, *args):
        self._time_left()
        return super().recv_into(*args)

    def send(self, *args):
        self._time_left()
        return super().send(*args)

    def sendall(self, *args):
        self._time_left()
        return super().sendall(*args)


class Connection(http.client.HTTPConnection):
    """An HTTP/1.1 connection (kept alive between calls) whose calls each end by a deadline of their own:
    ``until(seconds)`` before a call sets it, for its connect, its request and its whole answer."""

    def __init__(self, host: str, port: Optional[int]):
        super().__init__(host, port)
        self.deadline = 0.0

    def until(self, seconds: float):
        """The next call ends ``seconds`` from now."""
        self.deadline = time.monotonic() + seconds
        if self.sock is not None:
            self.sock.deadline = self.deadline

    def connect(self):
        plain = socket.create_connection((self.host, self.port), time_left(self.deadline))
        self.sock = DeadlineSocket(plain.family, plain.type, plain.proto, plain.detach())
        self.sock.deadline = self.deadline
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def request(
    url: str,
    data: Optional[bytes] = None,
    method: Optional[str] = None,
    headers: Optional[Dict[str, str]] = None,
    timeout: float = 60,
    binary: bool = False,
) -> Tuple[int, object]:
    """One HTTP call, ended by ``timeout`` seconds after it starts (the module docstring); returns (status,
    its body as ``answer(raw, binary, url)`` reads it). A server that cannot be reached raises OSError, an
    answer past a bound AnswerError.

    A body above 1 MiB is sent as curl sends it, with ``Expect: 100-continue``: the server may refuse
    it (TorchServe's 413 above max_request_size) before it is sent, and that answer is returned
    instead of a connection reset in the middle of the upload."""
    parts = urllib.parse.urlsplit(url)
    connection = Connection(parts.hostname, parts.port)
    connection.until(timeout)
    try:
        target = f"{parts.path}?{parts.query}" if parts.query else parts.path
        connection.putrequest(method or ("GET" if data is None else "POST"), target)
        for key, value in (headers or {}).items():
            connection.putheader(key, value)
        if data is not None:
            connection.putheader("Content-Length", str(len(data)))
            expect = len(data) > EXPECT_CONTINUE
            if expect:
                connection.putheader("Expect", "100-continue")
        connection.endheaders()
        if data is not None and (not expect or _may_continue(connection.sock)):
            connection.send(data)
        response = connection.getresponse()
        status, raw = response.status, read_body(response, url)
    except TimeoutError:
        raise late(url, timeout) from None
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer from {url}: {exc!r}") from None
    finally:
        connection.close()
    return status, answer(raw, binary, url)


def late(url: str, seconds: float) -> Late:
    """The error of a call to ``url`` that had not ended after its ``seconds``."""
    return Late(f"{url} did not answer within {seconds:g} s")


def read_body(response: http.client.HTTPResponse, url: str, keep: bool = True) -> bytearray:
    """The answer's body, refused past ``MAX_ANSWER_BYTES`` (by its Content-Length before a byte of it is
    read); ``keep=False`` reads it and drops it (bench: what it costs to read, not what it says)."""
    length = response.getheader("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > MAX_ANSWER_BYTES:
        raise AnswerError(f"{url} answered {int(length):,} bytes, more than tsctl reads ({MAX_ANSWER_BYTES:,})")
    body, size = bytearray(), 0
    while True:
        chunk = response.read(CHUNK)
        if not chunk:
            if response.length:  # what Content-Length promised and the connection's end cut short
                raise OSError(f"{url} closed the connection {response.length:,} bytes short of its answer")
            return body
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise AnswerError(f"{url} answered more than the {MAX_ANSWER_BYTES:,} bytes tsctl reads")
        if keep:
            body += chunk


def answer(raw, binary: bool = True, url: str = "the server"):
    """A response body (bytes) as JSON within the bounds (``parse``), else as text, else (not UTF-8) as bytes
    when ``binary``, else as text with the undecodable bytes replaced."""
    try:
        text = str(raw, "utf-8")
    except UnicodeDecodeError:
        if binary:
            return bytes(raw)
        text = str(raw, "utf-8", errors="replace")
    return parse(text, url)


LEADING_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace


def parse(text: str, url: str):
    """``text`` as JSON (text that is not JSON as it is) within the bounds: ``MAX_ANSWER_VALUES`` values,
    counted on the text before it is parsed (``limits.json_values``), and ``MAX_ANSWER_DEPTH`` levels,
    checked as it is parsed and after (``limits.check_json``); past them an AnswerError naming ``url``."""
    from handlers.errors import ClientError
    from handlers.limits import MAX_DIGITS, Limits, check_json, json_values

    start = LEADING_SPACE.match(text).end()
    if text[start : start + 1] not in ("[", "{"):  # a number, a string, a literal: nothing nests or counts
        try:
            return json.loads(text)
        except ValueError:
            return text
    limits = Limits(max_json_depth=MAX_ANSWER_DEPTH, max_json_values=MAX_ANSWER_VALUES)
    said = f"{url} answered JSON"
    try:
        values = json_values(text, limits)
    except ClientError:  # Python's parser takes quadratic time over such a number
        raise AnswerError(
            f"{said} with a number of more than {MAX_DIGITS:,} digits, which tsctl does not read"
        ) from None
    if values > MAX_ANSWER_VALUES:
        raise AnswerError(f"{said} of {values:,} values, more than the {MAX_ANSWER_VALUES:,} values tsctl parses")
    try:
        found = json.loads(text)
        check_json(found, limits)  # its depth: its values were counted above
    except (RecursionError, ClientError):
        raise AnswerError(f"{said} nested deeper than the {MAX_ANSWER_DEPTH} levels tsctl parses") from None
    except ValueError:
        return text
    return found


def _may_continue(sock: DeadlineSocket, wait: float = 1.0) -> bool:
    """After ``Expect: 100-continue``: True to send the body (the server said 100, or said nothing
    within ``wait`` seconds, as curl assumes); False when its final answer came first. A 100 whose head
    does not end is cut by the call's deadline, or by its close (``RemoteDisconnected``)."""
    if not select.select([sock], [], [], max(0.0, min(wait, sock.deadline - time.monotonic())))[0]:
        return True
    head = sock.recv(64, socket.MSG_PEEK)
    if not head.startswith((b"HTTP/1.1 100", b"HTTP/1.0 100")):
        return False
    interim = bytearray()
    while not interim.endswith(b"\r\n\r\n"):  # consume the interim answer, byte by byte
        byte = sock.recv(1)
        if not byte:
            raise http.client.RemoteDisconnected("the server closed the connection in the middle of its 100 Continue")
        if len(interim) >= MAX_INTERIM:
            raise http.client.HTTPException(f"a 100 Continue of more than {MAX_INTERIM:,} bytes")
        interim += byte
    return True
