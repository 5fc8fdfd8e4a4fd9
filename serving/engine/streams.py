"""Streamed answers on the tsctl engine: a handler that calls ``send_intermediate_predict_response``
(pytorch/serve's streaming examples) reaches its client part by part, as TorchServe sends it.

The worker's reader hands each part on as it is read (``worker_process.Replies``); the request's
``Job`` resolves with the first part, whose ``rest`` is a ``Parts``: the parts after it, as they come.

- ``POST /predictions/NAME``: HTTP chunked transfer, each part one chunk written as it arrives, the
  status, content type and headers of the first part (``ts_stream_next: true`` among them, as
  TorchServe sends it). A request that fails once its answer has begun (its worker died or passed
  responseTimeout, the parts passed ``max_response_size``) has its connection cut without the last
  chunk, so the client sees a broken answer, as TorchServe's client does (TorchServe resets it).
- TorchServe's gRPC ``StreamPredictions``/``StreamPredictions2``: each part one message
  (``serving/engine/ts_grpc.py``). KServe's routes and a unary call take the parts joined (``collect``).

Bounds. The worker never waits for a client: its parts go into ``Parts`` as the worker's reader gets
them, and a streamed answer's parts together stay within ``max_response_size`` (the reader counts
them, ``ts_wire.Stream.reply``). The parts held for a client count in flight
(``body_limit.InFlight``, in that client's share too) from the moment its reader takes the answer
(``Parts.count``) until they are sent, then as ``BodyLimit`` counts any answer waiting for its client;
a part that would pass the budget while earlier parts still wait for that client ends its stream
there (``Parts.cut``: HTTP cuts the connection, gRPC ends the call UNAVAILABLE), so 60 clients not
reading 60 MiB streams hold the budget, not 3.6 GB. A part arriving with none waiting, or while its
client holds no more than its share with it, is counted whatever the budget: a reader slower than its
handler sends is not cut because others filled the budget; the budget's overshoot is then at most a
part per stream and a share per client address. A client that reads nothing for
``--body_idle_timeout`` seconds is disconnected (``http_server.BoundedHttp``). A client that leaves
mid-stream closes its ``Parts``: what the handler sends after is read and dropped, the worker goes
on. ``responseTimeout`` bounds the whole batch, every part of a streamed answer within it, as for any
answer (TorchServe counts it for each of the worker's replies: a stream there may last longer; a
handler that streams for ever holds its worker for ever).
"""

import asyncio
import collections
from http import HTTPStatus
from typing import Callable, Deque, Optional

from handlers.errors import frontend_error

from ..worker.ts_wire import STREAM_NEXT, Response
from .body_limit import InFlight, client_of

ABORT = "tsctl.cut"  # in an HTTP request's scope: ends its connection once what was written is sent (http_server)
CUT_TIMEOUT = 60.0  # s at most that a streamed answer cut midway waits for its connection to close


class Parts:
    """The parts of a streamed answer after its first, in order: ``put`` on the worker's side (on the
    event loop), ``async for`` on the client's. The parts end with the last (``put(..., last=True)``) or
    with a part that is a failure (``Response.error``: the request failed there); ``close`` when the
    client is gone: what comes after is dropped. ``on_end`` is called once, when the last part is in.
    ``count``: the parts held count in flight from then on (this module's docstring)."""

    def __init__(self, on_end: Optional[Callable[[], None]] = None):
        self.queue: Deque[Response] = collections.deque()
        self.ended = self.closed = False
        self.changed = asyncio.Event()
        self.on_end = on_end
        self.budget: Optional[InFlight] = None
        self.client, self.held = "", 0

    def count(self, budget: InFlight, client: str):
        """From now on the parts held count against ``budget``, in ``client``'s share (those held already too)."""
        self.budget, self.client = budget, client
        for part in self.queue:
            self.held += size_of(part)
            budget.hold(size_of(part), client)

    def put(self, part: Response, last: bool = False):
        if self.ended:
            return  # after the last part, or after the failure (a worker's late part)
        if not self.closed:
            if self.budget is not None and not part.error:
                size = size_of(part)
                if self.keeps_up(size):  # counted whatever the budget
                    self.budget.hold(size, self.client)
                elif not self.budget.take(size, self.client):
                    return self.cut(size)
                self.held += size
            self.queue.append(part)
            self.changed.set()
        if last or part.error:
            self.end()

    def keeps_up(self, size: int) -> bool:
        """Whether this part is held whatever the budget: none waits for the client, or the client holds no
        more than its share with it. A handler may send faster than any client reads: parts then wait for
        a client that reads; the cut falls on a client above its share, not on the others."""
        return not self.queue or self.budget.within_share(size, self.client)

    def cut(self, size: int):
        """The client reads slower than its parts come and the next would pass the budget: what is held is
        dropped, and the stream ends with a failure (503)."""
        message = (
            f"the streamed answer was cut: its client read it slower than it came, and {self.held + size:,} "
            f"bytes held for it would pass {self.budget.over(size, self.client)}"
        )
        self.drop()
        body = frontend_error(HTTPStatus.SERVICE_UNAVAILABLE, "ServiceUnavailableException", message)
        self.queue.append(Response(HTTPStatus.SERVICE_UNAVAILABLE, body, "application/json", error=True))
        self.changed.set()
        self.end()

    def end(self):
        if not self.ended:
            self.ended = True
            self.changed.set()
            if self.on_end is not None:
                self.on_end()

    def close(self):
        """The client is gone: drop what is held and whatever comes."""
        self.closed = True
        self.drop()

    def drop(self):
        self.queue.clear()
        if self.budget is not None:
            self.budget.give(self.held, self.client)
        self.held = 0

    def __aiter__(self):
        return self

    async def __anext__(self) -> Response:
        while not self.queue:
            if self.ended or self.closed:
                raise StopAsyncIteration
            self.changed.clear()
            await self.changed.wait()
        part = self.queue.popleft()
        if self.budget is not None and not part.error:
            self.held -= size_of(part)
            self.budget.give(size_of(part), self.client)
        return part


def size_of(part: Response) -> int:
    return len(part.body or b"")


async def collect(first: Response) -> Response:
    """A streamed answer joined into one (its first part's status and content type, every part's
    headers, the bodies in order), or the failure that ended it; ``first`` itself when it is whole."""
    if first.rest is None:
        return first
    if first.error:
        first.rest.close()
        return first
    bodies, headers = [first.body or b""], dict(first.headers)
    async for part in first.rest:
        if part.error:
            return part
        bodies.append(part.body or b"")
        headers.update(part.headers)
    headers[STREAM_NEXT] = "false"
    return Response(first.status, b"".join(bodies), first.content_type, headers)


async def http_reply(first: Response, kserve: bool, whole_answer: Callable, budget: InFlight):
    """The HTTP answer to a request whose answer is streamed (``first.rest``): chunked on TorchServe's
    routes (``StreamedAnswer``), joined on KServe's (``collect``); ``whole_answer`` is engine.http_answer,
    which makes a whole answer and checks what the handler set (a status or header HTTP cannot carry is
    its 500, sent whole); ``budget``: the engine's ``InFlight``, where the parts held count."""
    if kserve or first.error or first.status in (204, 304):  # 204 and 304 have no body to stream
        return whole_answer(await collect(first), kserve)
    whole = whole_answer(first, kserve)
    if whole.status_code != first.status:
        first.rest.close()
        return whole
    fields = [(name, value) for name, value in whole.raw_headers if name != b"content-length"]
    start = {
        "type": "http.response.start",
        "status": first.status,
        "headers": [(STREAM_NEXT.encode(), b"true"), *fields],
    }
    return StreamedAnswer(first, start, budget)


class StreamedAnswer:
    """An ASGI response writing a streamed answer as HTTP chunks, part by part (this module's docstring).
    ``start``: the ASGI start message of its first part (``http_reply``)."""

    def __init__(self, first: Response, start: dict, budget: InFlight):
        self.first, self.start, self.budget = first, start, budget

    async def __call__(self, scope, receive, send):
        parts: Parts = self.first.rest
        parts.count(self.budget, client_of(scope.get("client")))
        gone = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await send(self.start)
            await send({"type": "http.response.body", "body": self.first.body or b"", "more_body": True})
            async for part in parts:
                if gone.done():
                    break
                if part.error:  # the request failed mid-answer: no last chunk, the client sees it broken
                    await cut(scope, gone)
                    return
                if part.body:
                    await send({"type": "http.response.body", "body": part.body, "more_body": True})
            if not gone.done():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away while its answer was written
            pass
        finally:
            parts.close()
            gone.cancel()


async def wait_disconnect(receive):
    """Returns when the client has closed the connection (its request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def cut(scope, gone: asyncio.Future):
    """End the connection once what was written has gone out, without the last chunk (``http_server.BoundedHttp``
    puts ``ABORT`` in the scope: its transport's ``close``); returns once the server has seen it closed
    (``gone``), so that it does not take the answer for one the app forgot to finish. A client that reads
    nothing more is cut off by the server's own send timeout."""
    close = scope.get(ABORT)
    if close is not None:
        close()
        await asyncio.wait({gone}, timeout=CUT_TIMEOUT)
