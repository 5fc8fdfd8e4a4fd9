"""Streamed answers read as a client reads them, with the time each part arrives: HTTP chunked transfer off
a raw socket (each chunk as the server framed it), and TorchServe's gRPC StreamPredictions."""

import socket
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple


@dataclass
class Streamed:
    """An answer as it arrived: status, headers (names lower-cased, in order), each chunk's bytes and the
    seconds from the request's last byte to its arrival; ``complete`` when it ended as HTTP ends it
    (the last chunk, or a whole body of its length), False when the connection was cut first."""

    status: int = 0
    headers: List[Tuple[str, str]] = field(default_factory=list)
    chunks: List[bytes] = field(default_factory=list)
    times: List[float] = field(default_factory=list)
    complete: bool = False
    head_time: Optional[float] = None

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def header(self, name: str) -> Optional[str]:
        return next((v for k, v in self.headers if k == name), None)


class Reader:
    """A socket's bytes read as they come (``pause`` s before each read of ``size`` bytes at most)."""

    def __init__(self, sock: socket.socket, pause: float = 0.0, size: int = 65536):
        self.sock, self.buffer, self.at, self.pause, self.size = sock, bytearray(), 0, pause, size

    def more(self) -> bool:
        if self.pause:
            time.sleep(self.pause)
        data = self.sock.recv(self.size)
        if self.at > 1 << 20:  # drop what was read, now and then (not on every read: that copies)
            del self.buffer[: self.at]
            self.at = 0
        self.buffer += data
        return bool(data)

    def line(self) -> Optional[bytes]:
        while True:
            end = self.buffer.find(b"\r\n", self.at)
            if end >= 0:
                line, self.at = bytes(self.buffer[self.at : end]), end + 2
                return line
            if not self.more():
                return None

    def exactly(self, length: int) -> Optional[bytes]:
        while len(self.buffer) - self.at < length:
            if not self.more():
                return None
        data, self.at = bytes(self.buffer[self.at : self.at + length]), self.at + length
        return data


def post(
    port: int,
    path: str,
    body: bytes,
    content_type: str = "text/plain",
    timeout: float = 60,
    pause: float = 0.0,
    size: int = 65536,
    leave_after: Optional[int] = None,
    source: str = "",
) -> Streamed:
    """POST ``body`` and read the answer chunk by chunk (``pause`` s before each read of ``size`` bytes at
    most: a slow client); ``leave_after``: close the connection once that many chunks have come;
    ``source``: the client's address (another loopback address is another client to the server)."""
    answer = Streamed()
    where = (source, 0) if source else None
    with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=where) as sock:
        if pause:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)
        started, reader = time.perf_counter(), Reader(sock, pause, size)
        try:
            read_answer(reader, answer, started, leave_after)
        except (ConnectionResetError, socket.timeout):
            answer.complete = False
    return answer


def read_answer(reader: Reader, answer: Streamed, started: float, leave_after: Optional[int]):
    line = reader.line()
    if line is None:
        return
    answer.head_time = time.perf_counter() - started
    answer.status = int(line.split()[1])
    while True:
        line = reader.line()
        if not line:
            break
        name, _, value = line.decode("latin-1").partition(":")
        answer.headers.append((name.strip().lower(), value.strip()))
    if answer.header("transfer-encoding") != "chunked":
        body = reader.exactly(int(answer.header("content-length") or 0))
        answer.chunks, answer.times, answer.complete = [body or b""], [time.perf_counter() - started], body is not None
        return
    while leave_after is None or len(answer.chunks) < leave_after:
        line = reader.line()
        if line is None:
            return
        length = int(line.split(b";")[0], 16)
        data = reader.exactly(length + 2)
        if data is None:
            return
        if length == 0:
            answer.complete = True
            return
        answer.chunks.append(data[:-2])
        answer.times.append(time.perf_counter() - started)


def grpc_stream(stub_call, request, timeout: float = 60, leave_after: Optional[int] = None):
    """(messages, their arrival times, the error's code and details or None) of a server-streaming call
    made with ``stub_call`` (a multi-callable); ``leave_after``: cancel it once that many have come."""
    import grpc

    messages, times, error = [], [], None
    started = time.perf_counter()
    call = stub_call(request, timeout=timeout)
    try:
        for message in call:
            messages.append(message)
            times.append(time.perf_counter() - started)
            if leave_after is not None and len(messages) >= leave_after:
                call.cancel()
                break
    except grpc.RpcError as exc:
        error = (exc.code(), exc.details())
    return messages, times, error
