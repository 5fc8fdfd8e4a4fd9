"""One HTTP call to a local server (``request``), as ``tsctl`` makes them: to a runtime's APIs, to a model."""

import http.client
import json
import select
import socket
import threading
import urllib.parse
from typing import Dict, Optional, Tuple

MAX_ANSWER_BYTES = 256 << 20  # an answer larger is refused unread: no model's answer a tsctl command reads is near
CHUNK = 1 << 20


def request(
    url: str,
    data: Optional[bytes] = None,
    method: Optional[str] = None,
    headers: Optional[Dict[str, str]] = None,
    timeout: float = 60,
    binary: bool = False,
    whole: bool = False,
) -> Tuple[int, object]:
    """One HTTP call; returns (status, its body as ``answer(raw, binary)`` reads it). Network errors, and
    an answer above ``MAX_ANSWER_BYTES``, raise OSError. ``timeout`` bounds each wait on the socket; with
    ``whole`` it bounds the whole call (a server dripping its answer a byte at a time is cut off at it:
    a thread of its own closes the socket, so not for load generators).

    A body above 1 MiB is sent as curl sends it, with ``Expect: 100-continue``: the server may refuse
    it (TorchServe's 413 above max_request_size) before it is sent, and that answer is returned
    instead of a connection reset in the middle of the upload."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    cut, sockets = threading.Event(), []
    watchdog = threading.Timer(timeout, _cut, (sockets, cut)) if whole else None
    if watchdog is not None:
        watchdog.daemon = True
        watchdog.start()
    try:
        connection.connect()
        sockets.append(connection.sock)  # kept: the connection forgets it once an answer says it closes
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
        status, raw = response.status, _body(response, url)
    except (http.client.HTTPException, OSError) as exc:
        if cut.is_set():
            raise OSError(f"{url} did not answer within {timeout:g} s") from None
        if isinstance(exc, OSError):
            raise
        raise OSError(f"bad HTTP answer from {url}: {exc!r}") from None
    finally:
        if watchdog is not None:
            watchdog.cancel()
        connection.close()
    return status, answer(raw, binary)


def _body(response: http.client.HTTPResponse, url: str) -> bytes:
    """The answer's body, refused past ``MAX_ANSWER_BYTES`` (by its Content-Length before reading)."""
    length = response.getheader("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > MAX_ANSWER_BYTES:
        raise OSError(f"{url} answered {int(length):,} bytes, more than tsctl reads ({MAX_ANSWER_BYTES:,})")
    chunks, size = [], 0
    while True:
        chunk = response.read(CHUNK)
        if not chunk:
            if response.length:  # what Content-Length promised and the connection's end cut short
                raise OSError(f"{url} closed the connection {response.length:,} bytes short of its answer")
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise OSError(f"{url} answered more than the {MAX_ANSWER_BYTES:,} bytes tsctl reads")
        chunks.append(chunk)


def _cut(sockets: list, cut: threading.Event):
    """The whole call's time is up: shut its socket, so that the read waiting on it returns."""
    cut.set()
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def answer(raw: bytes, binary: bool = True):
    """A response body as JSON, else as text, else (not UTF-8) as bytes when ``binary``, else as text
    with the undecodable bytes replaced."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        if binary:
            return raw
        text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


EXPECT_CONTINUE = 1 << 20


def _may_continue(sock, wait: float = 1.0) -> bool:
    """After ``Expect: 100-continue``: True to send the body (the server said 100, or said nothing
    within ``wait`` seconds, as curl assumes); False when its final answer came first."""
    if not select.select([sock], [], [], wait)[0]:
        return True
    head = sock.recv(64, socket.MSG_PEEK)
    if not head.startswith((b"HTTP/1.1 100", b"HTTP/1.0 100")):
        return False
    interim = b""
    while not interim.endswith(b"\r\n\r\n"):  # consume the interim answer, byte by byte
        interim += sock.recv(1)
    return True
