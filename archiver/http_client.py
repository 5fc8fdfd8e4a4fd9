"""One HTTP call to a local server (``request``), as ``tsctl`` makes them: to a runtime's APIs, to a model."""

import http.client
import json
import select
import socket
import urllib.parse
from typing import Dict, Optional, Tuple


def request(
    url: str,
    data: Optional[bytes] = None,
    method: Optional[str] = None,
    headers: Optional[Dict[str, str]] = None,
    timeout: float = 60,
    binary: bool = False,
) -> Tuple[int, object]:
    """One HTTP call; returns (status, its body as ``answer(raw, binary)`` reads it). Network errors
    raise OSError.

    A body above 1 MiB is sent as curl sends it, with ``Expect: 100-continue``: the server may refuse
    it (TorchServe's 413 above max_request_size) before it is sent, and that answer is returned
    instead of a connection reset in the middle of the upload."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
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
        status, raw = response.status, response.read()
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer from {url}: {exc!r}") from None
    finally:
        connection.close()
    return status, answer(raw, binary)


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
