"""Reading a gRPC call's messages counted before they arrive, on every gRPC server of the engine
(KServe's v2, TorchServe's inference and management APIs).

gRPC receives a unary call's message whole before its handler runs, and opens the stream's window
to the size the message announces: a client that announces 60 MiB, sends 50 MiB and stops holds
50 MiB in gRPC core, counted nowhere, for as long as it keeps the connection (issue #43: 8 such calls,
+484 MiB against a 128 MiB ``--max_inflight_bytes``). So every method is served as a client-streaming
handler (the wire is the same: a unary call is a stream of one message) and reads its messages
itself: before each read, ``limit`` bytes (the server's ``max_receive_message_length``: the most the
message can be) are taken in the client's share of the engine's bodies in flight
(``body_limit.InFlight``), given back once the message is read; the handler then counts the message
it holds, as before. Past the budget the call ends UNAVAILABLE before a byte of its message is asked for.
Where ``limit`` is above a client's share (``max_request_size`` above a quarter of
``--max_inflight_bytes``) a read takes the share instead, or no client could read while another does:
then at most ``CLIENT_SHARE`` reads are under way, holding ``CLIENT_SHARE * limit`` bytes at the most.

A call not read yet holds what its stream's window lets the client send unasked: 64 KiB with gRPC's
bandwidth probe off (``OPTIONS``; with it on, windows grow to megabytes on streams nobody reads).
Measured, a bare grpc.aio server: 8 unread calls each sending 50 MiB, +403 MiB as unary handlers,
+33 MiB as streaming handlers, +1 MiB with the probe off; a 50 MiB message read in 337 ms against
350 ms with it on.

What a reservation costs the others: gRPC's Python API reads a whole message or nothing, so a call
holds its reservation from when its message is asked for, whether or not a byte of it comes (an
outsider's attack: 4 calls from 4 addresses sending nothing held a 64 MiB budget, REST answered 503
meanwhile). So the reads reserve from a budget of their own (``body_limit.reads_budget``: half of
``--max_inflight_bytes``, a client its share of it), never REST's bodies; and a unary call's message
must arrive whole within ``body_limit.READ_TIMEOUTS`` x --body_idle_timeout of being asked for
(DEADLINE_EXCEEDED after it). Left open
(docs/limits.md): clients of a few addresses that reopen calls sending nothing can keep other gRPC
clients' reads out, and a ``StreamPredictions2`` call waiting for its next request holds a
reservation with no deadline (idle streams are bounded by the reads' budget). Counting the bytes as
they arrive, as REST does, needs a gRPC server whose HTTP/2 layer shows each DATA frame.

Connections: each gRPC server takes at most ``connections()`` at once (gRPC core's
``grpc.max_allowed_incoming_connections``: one past it is closed as it opens), a quarter of the HTTP
listeners' ``max_connections()``. gRPC had no bound (an outsider's attack, #43: 3,000 HTTP/2 connections
on each of the three gRPC ports, each a HEADERS frame never ended, about 110 KB each, OOM-killed an engine
in a 1.5 GiB group in 30 s). gRPC counts them per server and not per client: one client can hold a
server's connections (its other clients then connect over REST), not the engine's memory.
"""

import asyncio
import inspect
from typing import Optional

import grpc

from .body_limit import READ_TIMEOUTS, Budget, client_of
from .http_server import max_connections

OPTIONS = [("grpc.http2.bdp_probe", 0)]  # a stream's window stays 64 KiB until its message is asked for


def refusal(code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """A handler ending the call with ``code`` before a byte of its message is read (an interceptor's
    answer, a call without its key: a unary handler would run only once gRPC had the message whole)."""

    async def refuse(requests, context):
        await context.abort(code, details)

    return grpc.stream_unary_rpc_method_handler(refuse)


def connections() -> int:
    """The connections one gRPC server of the engine takes at once (module docstring)."""
    return max(16, max_connections() // 4)


def server_options(max_message: int) -> list:
    """The options of a gRPC server whose messages are read through ``Counted``, its connections bounded."""
    return [
        ("grpc.max_receive_message_length", max_message),
        ("grpc.max_allowed_incoming_connections", connections()),
        *OPTIONS,
    ]


def counted(engine, limit: int) -> "Counted":
    """How one of the engine's gRPC servers, whose messages are at most ``limit`` bytes, reads them: from
    the engine's reads' budget, a unary call's message within READ_TIMEOUTS x --body_idle_timeout."""
    return Counted(engine.grpc_reads, limit, READ_TIMEOUTS * engine.body_idle_timeout)


class Counted:
    """Reads a call's messages with ``limit`` bytes taken in its client's share of ``reads`` (a
    ``reads_budget``) while each arrives (this module's docstring); ``handlers`` makes any method
    handler read that way."""

    def __init__(self, reads: Budget, limit: int, timeout: float):
        self.reads, self.limit, self.timeout = reads, limit, timeout  # timeout: s for a unary call's message

    async def read(self, context, timeout: Optional[float] = None):
        """The call's next message as bytes, None when the client has sent its last; UNAVAILABLE (the
        call ended) when the reads' budget, or its client's share of it, cannot take ``limit``;
        DEADLINE_EXCEEDED when ``timeout`` s pass before the message is whole."""
        client, size = client_of(context.peer()), min(self.limit, self.reads.share)
        if not self.reads.take(size, client):
            held = self.reads.why(size, client)
            message = f"the gRPC messages being read would pass their budget: {held} (READS_SHARE): send it again"
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        try:
            reading = asyncio.ensure_future(context.read())  # not cancelled on time: gRPC's read does not end so
            done, _ = await asyncio.wait({reading}, timeout=timeout)
            if not done:  # ending the call ends the read
                reading.add_done_callback(lambda ended: ended.cancelled() or ended.exception())
                message = f"the request message did not arrive whole within {timeout:g} s (twice --body_idle_timeout)"
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, message)
            data = reading.result()
        finally:
            self.reads.give(size, client)
        return None if data is grpc.aio.EOF else data

    async def one(self, context, parse):
        """A unary call's message, parsed by ``parse`` (None: its bytes), within ``timeout``."""
        data = await self.read(context, self.timeout)
        if data is None:
            await context.abort(grpc.StatusCode.INTERNAL, "the call ended without its request message")
        return await parsed(data, parse, context)

    async def messages(self, context, parse):
        while True:
            data = await self.read(context)
            if data is None:
                return
            yield await parsed(data, parse, context)

    def handler(self, method: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``method``'s behaviour, served as a client-streaming handler reading through ``read``."""
        parse, serialize = method.request_deserializer, method.response_serializer
        behaviour = method.unary_unary or method.unary_stream or method.stream_unary or method.stream_stream

        async def request(context):
            """What ``behaviour`` takes: the call's messages, or its one message."""
            return self.messages(context, parse) if method.request_streaming else await self.one(context, parse)

        if method.response_streaming:

            async def streamed(requests, context):
                answers = behaviour(await request(context), context)
                try:
                    async for answer in answers:
                        yield answer
                finally:  # the call ended early: the method's own finally blocks run now
                    await answers.aclose()

            return grpc.stream_stream_rpc_method_handler(streamed, response_serializer=serialize)

        async def unary(requests, context):
            return await answered(behaviour(await request(context), context))

        return grpc.stream_unary_rpc_method_handler(unary, response_serializer=serialize)

    def handlers(self, methods: dict) -> dict:
        """{name: handler} with each handler reading through ``read``."""
        return {name: self.handler(method) for name, method in methods.items()}


async def parsed(data: bytes, parse, context):
    """``data`` parsed by the method's deserializer (None: kept as bytes); a message it cannot read
    ends the call as gRPC ends it."""
    if parse is None:
        return data
    try:
        return parse(data)
    except Exception:  # noqa: BLE001 - whatever the deserializer raises
        await context.abort(grpc.StatusCode.INTERNAL, "Exception deserializing request!")


async def answered(answer):
    """A unary method's answer, awaited when it is a coroutine (KServe's generated servicer methods,
    never overridden, are plain functions)."""
    return await answer if inspect.isawaitable(answer) else answer
