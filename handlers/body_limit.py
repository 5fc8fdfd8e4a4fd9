"""Request bodies bounded, as the tsctl engine bounds them (``BodyLimit``, an ASGI middleware): the
engine's app (engine.py) and MLServer's REST app when tsctl starts it (mlserver_start.py) use it.
Standard library and Starlette only (MLServer's environment has no httptools for engine_http).
"""

import asyncio
import os

from starlette.responses import JSONResponse

BODY_IDLE_TIMEOUT = 30.0  # s without a byte of a request's body


def memory_limit() -> int:
    """The memory this process may use: its cgroup's limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) when one is set below the machine's memory, else the machine's."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as limit:
                text = limit.read().strip()
        except OSError:
            continue
        if text.isdigit():
            return min(total, int(text))
    return total


def max_inflight_bytes(max_request_size: int) -> int:
    """The default bound on request bodies in flight: a quarter of ``memory_limit()``, and at least
    one body of ``max_request_size``."""
    return max(max_request_size, memory_limit() // 4)


class BodyTooLarge(Exception):
    pass


class InFlight:
    """The bytes of request bodies the engine holds, all requests together (one event loop: no lock)."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0


class BodyLimit:
    """ASGI middleware bounding request bodies (``engine_http``'s docstring):

    - one body above ``max_request_size``: 413, by its Content-Length before anything is read, or,
      sent chunked, as soon as what has arrived passes the limit; the body is never held whole;
    - all bodies together: what has arrived of every request not answered yet (received, queued, at
      a worker) above ``inflight.limit`` (``--max_inflight_bytes``): the request whose bytes would
      pass it gets 503 with ``Retry-After``, as soon as they arrive (150 uploads of 32 MiB, sent or
      half sent, no longer exhaust the engine);
    - a body that stops arriving for ``BODY_IDLE_TIMEOUT`` seconds: 408."""

    def __init__(self, app, limit: int, inflight: InFlight):
        self.app, self.limit, self.inflight = app, limit, inflight

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit, inflight = self.limit, self.inflight
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            return await self.refuse(scope, send, 413, self.too_large(int(length)))
        seen, refusal, started = 0, None, False

        async def counted():
            nonlocal seen, refusal
            try:
                message = await asyncio.wait_for(receive(), BODY_IDLE_TIMEOUT)
            except asyncio.TimeoutError:
                refusal = (408, f"no byte of the request body came for {BODY_IDLE_TIMEOUT:.0f} s")
                raise BodyTooLarge() from None
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                if seen + size > limit:
                    refusal = (413, self.too_large(seen + size, "at least "))
                elif inflight.held + size > inflight.limit:
                    refusal = (503, self.busy(inflight.limit))
                if refusal:
                    raise BodyTooLarge()
                seen += size
                inflight.held += size
            return message

        async def tracked(message):
            nonlocal started
            if refusal and not started:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge:
            pass
        finally:
            inflight.held -= seen
        if refusal and not started:
            await self.refuse(scope, send, *refusal)

    def too_large(self, size: int, qualifier: str = "") -> str:
        return f"the request body is {qualifier}{size:,} bytes, above the limit of {self.limit:,} (max_request_size)"

    @staticmethod
    def busy(limit: int) -> str:
        return (
            f"the engine holds {limit:,} bytes of request bodies in flight, its limit (--max_inflight_bytes): "
            "send it again"
        )

    @staticmethod
    async def refuse(scope, send, status: int, message: str):
        kind = {408: "RequestTimeout", 413: "RequestEntityTooLarge", 503: "ServiceUnavailableException"}[status]
        body = {"code": status, "type": kind, "message": message, "error": message}
        headers = {"Retry-After": "1"} if status == 503 else None
        await JSONResponse(body, status_code=status, headers=headers)(scope, None, send)
