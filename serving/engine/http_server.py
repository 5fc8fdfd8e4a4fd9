"""The tsctl engine's HTTP server: uvicorn (httptools), with the bounds it does not set itself.

- **The request head** (request line and headers) may be at most ``MAX_HEAD_BYTES``: above that
  the connection gets 431 and is closed before the rest is read (uvicorn's httptools protocol has no
  limit: a 100 MB header was parsed whole). TorchServe's Netty allows 8 KiB; this allows more for
  long tokens and tracing headers.
- **Headers**: at most ``MAX_HEADERS`` header lines a request (431 past it): each is a tuple of two
  bytes objects, about 80 bytes where the wire has 5 (``a:b``), so a 63 KiB head of 12,900 headers
  held about 1 MB while its body was awaited (100 connections: +102 MiB). TorchServe's Netty bounds
  the head at 8 KiB, which holds about 1,600.
- **Pipelining**: at most ``MAX_PIPELINED`` requests of a connection wait behind the one being
  answered; past that the rest of what it sent is dropped and the connection is closed once those
  are answered (RFC 9112 section 9.3.2). uvicorn parsed every request of each read (256 KiB: 8,456
  ``GET /ping``) and queued them all, reading more as each was answered: 20 connections grew the
  engine by 455 MiB and kept a neighbour waiting 18 s.
- **Slow clients**: a request head must arrive within ``HEAD_TIMEOUT`` seconds of its first byte
  (or of the connection's opening); a client trickling headers (slowloris) is disconnected.
- **Request bodies** (their size, all of them in flight, a body that stops arriving) are bounded by
  ``body_limit.py``, where each of those limits is defined and enforced (``BodyLimit``).
- **Clients that do not read their answer**: an answer's bytes waiting for the client count
  against the bound on bodies in flight while the server waits to send them (``BodyLimit``), and a
  connection whose client reads nothing (the send buffer not drained from its high to its low
  water mark, 48 KiB) for ``--body_idle_timeout`` seconds is aborted, its buffered answer dropped
  (``BoundedHttp.pause_writing``); memory freed goes back to the system (``return_freed_memory`` in
  engine.py): 12 clients not reading 15 MB answers no longer hold 180 MB for as long as they keep
  their sockets open.
- **Connections** at once: at most ``max_connections()`` on all the engine's HTTP listeners together
  (below the process's open-file limit, which they share, so that the workers can always be restarted),
  a client address its share of them (``body_limit.CLIENT_SHARE``: above a quarter only while a quarter
  stays free); a connection past either is answered 503 and closed as it opens
  (``BoundedHttp.connection_made``), so one client holding a thousand slow connections cannot keep the
  others out. Each listener had a budget of its own: 3,072 connections from one address on each of three
  listeners, each sending a 62 KiB head slowly, OOM-killed an engine in a 1.5 GiB group in 22 s.
- **Request heads in flight**: the bytes of the heads not yet complete, on every connection of every
  listener together, at most ``HEAD_BYTES_IN_FLIGHT`` (a client its share); a head that would go past
  it is answered 503 and its connection closed (``BoundedHttp.data_received``). ``MAX_HEAD_BYTES``
  bounds one head; this bounds them all (``Shared``: one of each budget for the listeners of an engine).
- **Stopping**: no signal handling of uvicorn's own (the engine stops on SIGTERM/SIGINT itself and
  ends its workers; uvicorn would re-raise the signal once stopped), and at most
  ``SHUTDOWN_GRACE`` seconds for the requests in flight.
"""

import contextlib
import resource
from http import HTTPStatus
from typing import Dict

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from handlers.errors import frontend_error

from .body_limit import BODY_IDLE_TIMEOUT, Budget, client_of
from .streams import ABORT

MAX_HEAD_BYTES = 64 << 10
HEAD_BYTES_IN_FLIGHT = 32 << 20  # every unfinished head of every connection together (about 512 of the largest)
MAX_HEADERS = 256  # header lines a request
MAX_PIPELINED = 16  # requests a connection may send ahead, waiting behind the one being answered
HEAD_TIMEOUT = 30.0  # s
SHUTDOWN_GRACE = 30  # s
END_OF_HEAD = b"\r\n\r\n"
HEADER_NAMES = "tsctl.header_names"  # in a request's scope: lower-cased name -> the name as the client spelled it


class Shared:
    """What the HTTP listeners of one engine count together (one event loop: no lock): its connections
    and the bytes of its unfinished request heads."""

    def __init__(self, connections: int, head_bytes: int = HEAD_BYTES_IN_FLIGHT):
        self.connections, self.head_bytes = Budget(connections), Budget(head_bytes)


class TooMany(Exception):
    """Raised from a parser callback to stop parsing what the connection sent (httptools wraps it in
    ``HttpParserCallbackError``, which uvicorn answers with ``send_400_response``)."""


class BoundedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with a size and a time limit on each request's head, and a time
    limit (``send_timeout``) on a client that reads nothing of its answer."""

    send_timeout = BODY_IDLE_TIMEOUT  # s (server() sets the engine's --body_idle_timeout)
    send_timer = None
    shared = Shared(4096)  # the engine's connections and head bytes (server() gives them; uvicorn has ``connections``)
    head_held = 0  # bytes of this connection's unfinished head counted in ``shared.head_bytes``
    client_address, counted = "", False  # uvicorn has ``client``: the (host, port) in the scope
    refusal = None  # (status, kind, message) of a request stopped in a parser callback
    dropping = False  # the rest of what the connection sends is dropped (it sent too many requests ahead)

    def connection_made(self, transport):
        super().connection_made(transport)
        self.client_address = client_of(transport.get_extra_info("peername"))
        self.counted = self.shared.connections.take(1, self.client_address)
        if not self.counted:
            return self._refuse_connection()
        self._begin_head()

    def _begin_head(self):
        self.head_bytes, self.head_tail, self.in_head = 0, b"", True
        self._cancel_head_timer()
        self.head_timer = self.loop.call_later(HEAD_TIMEOUT, self._head_too_slow)

    def _cancel_head_timer(self):
        timer = getattr(self, "head_timer", None)
        if timer is not None:
            timer.cancel()
        self.head_timer = None

    def data_received(self, data: bytes) -> None:
        if self.dropping:
            return
        if self.in_head:
            room = MAX_HEAD_BYTES - self.head_bytes
            if len(data) > room and END_OF_HEAD not in self.head_tail + data[: max(room, 0) + len(END_OF_HEAD)]:
                return self._refuse_head()
            counted = min(len(data), max(room, 0))
            if not self.shared.head_bytes.take(counted, self.client_address):
                return self._refuse_heads_in_flight(counted)
            self.head_held += counted
            self.head_bytes += len(data)
            self.head_tail = data[-(len(END_OF_HEAD) - 1) :]
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.names: Dict[bytes, bytes] = {}
        self.header_count = 0
        if not self.in_head:  # the next request on a kept-alive connection
            self._begin_head()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_count += 1
        if self.header_count > MAX_HEADERS:
            message = f"the request has more than {MAX_HEADERS:,} headers"
            self.refusal = (HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "RequestHeaderFieldsTooLarge", message)
            raise TooMany()
        self.names.setdefault(name.lower(), name)  # ASGI lower-cases names: TorchServe's handlers see them as sent
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if len(self.pipeline) >= MAX_PIPELINED:
            raise TooMany()  # the requests queued are answered, then the connection closes (send_400_response)
        self.in_head = False
        self._cancel_head_timer()
        self._give_head()
        self.scope[HEADER_NAMES] = {low.decode("latin-1"): name.decode("latin-1") for low, name in self.names.items()}
        self.scope[ABORT] = self.transport.close  # a streamed answer that fails midway ends so (streams.cut)
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        if self.counted:
            self.shared.connections.give(1, self.client_address)
            self.counted = False
        self._give_head()
        self._cancel_head_timer()
        self._cancel_send_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request the parser stopped at: a refusal of ours (``TooMany``), or too many
        requests sent ahead: those waiting are answered, the connection then closed, the rest dropped."""
        refusal, self.refusal = self.refusal, None
        if not self.pipeline and (self.cycle is None or self.cycle.response_complete):  # nothing being answered
            return self._refuse(*refusal) if refusal else super().send_400_response(msg)
        self.dropping = True
        self.flow.pause_reading()
        last = self.pipeline[0][0] if self.pipeline else self.cycle
        last.keep_alive = False  # uvicorn closes the connection once it is answered

    def pause_writing(self) -> None:
        """The client does not read as fast as the answer is written: it has ``send_timeout`` seconds to
        drain the buffer to its low water mark, or the connection is aborted (``close`` would keep the
        buffered answer until it is sent: for ever to a client that never reads)."""
        super().pause_writing()
        self._cancel_send_timer()
        self.send_timer = self.loop.call_later(self.send_timeout, self.transport.abort)

    def resume_writing(self) -> None:
        self._cancel_send_timer()
        super().resume_writing()

    def _cancel_send_timer(self):
        if self.send_timer is not None:
            self.send_timer.cancel()
        self.send_timer = None

    def _give_head(self):
        if self.head_held:
            self.shared.head_bytes.give(self.head_held, self.client_address)
            self.head_held = 0

    def _head_too_slow(self):
        self.head_timer = None
        if self.in_head and not self.transport.is_closing():
            self.transport.close()

    def _refuse_head(self):
        message = f"the request line and headers are above {MAX_HEAD_BYTES:,} bytes"
        self._refuse(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "RequestHeaderFieldsTooLarge", message)

    def _refuse_heads_in_flight(self, size: int):
        held = self.shared.head_bytes.why(size, self.client_address)
        message = f"too many request heads in flight: {held} bytes (HEAD_BYTES_IN_FLIGHT): retry later"
        self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, "ServiceUnavailableException", message)

    def _refuse_connection(self):
        held = self.shared.connections.why(1, self.client_address)
        message = f"too many connections: {held} (max_connections(), from the open-file limit): close one first"
        self._refuse(HTTPStatus.SERVICE_UNAVAILABLE, "ServiceUnavailableException", message)

    def _refuse(self, status: HTTPStatus, kind: str, message: str):
        """Answer ``status`` before any request is read, and close the connection."""
        body = frontend_error(status, kind, message, kserve=True).decode("utf-8")
        head = (
            f"HTTP/1.1 {status.value} {status.phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.in_head = False
        self._cancel_head_timer()
        self._give_head()
        self.transport.write(head.encode("ascii") + body.encode("utf-8"))
        self.transport.close()


def max_connections() -> int:
    """Connections served at once: the open-file limit, less what the workers and the engine need."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, min(4096, soft - 128))


def server(app, host: str, port: int, shared: Shared, send_timeout: float = BODY_IDLE_TIMEOUT) -> uvicorn.Server:
    """A listener of the engine; ``shared``: what it counts with the engine's other listeners."""

    class Protocol(BoundedHttp):
        pass

    Protocol.send_timeout = send_timeout
    Protocol.shared = shared

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=Protocol,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
    )
    return Server(config)
