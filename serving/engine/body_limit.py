"""Request bodies bounded: each limit on them defined here, by its name, and enforced once per protocol.

- **max_request_size** (``MAX_REQUEST_SIZE``): one request's body, TorchServe's setting of that name
  and default (``DEFAULT_MAX_REQUEST_SIZE``, 6,553,500 bytes). The engine reads it from
  config.properties (``frontend_settings.frontend_of``); MLServer started by tsctl from
  ``TSCTL_MAX_REQUEST_SIZE`` (``max_request_size_from_environment``, mlserver_start.py). Enforced over
  REST by ``BodyLimit`` (413) and over gRPC by ``kserve_grpc.weigh`` (INVALID_ARGUMENT).
- **MAX_MANAGEMENT_BODY** (64 KiB): one call's body on TorchServe's management API (``/models...``: a
  register's parameters as JSON, a few short values; in the query they are bounded by the request head's
  64 KiB), or ``max_request_size`` when that is smaller (``management_body_limit``). Enforced over REST
  by ``BodyLimit`` (``management``: 413 by Content-Length before a byte of the body is read) and over
  TorchServe's gRPC management API by ``grpc.max_receive_message_length`` (ts_grpc.start:
  RESOURCE_EXHAUSTED). TorchServe bounds these bodies by max_request_size alone (ServerInitializer.java
  lines 58-63, one ``HttpObjectAggregator(maxRequestSize)`` for every listener; ModelServer's gRPC
  ``maxInboundMessageSize``), which is sized for inference: raised to 64 MiB, a 60 MiB JSON register
  body was parsed whole into Python objects, 36.6 s and 1.7 GB of the engine's memory (Gson reads the
  same body into a few fields).
- **--max_inflight_bytes** (``max_inflight_bytes``): what all requests' bodies hold together
  (being received, queued, at a worker), REST and gRPC alike; default a quarter of the memory the
  process may use (``memory_limit``: the smallest limit of its memory cgroup and the groups above
  it, read through ``/proc/self/cgroup``, or the machine's memory), logged at start. Counted by
  ``InFlight``, the one counter both use: a REST request whose body would pass it gets 503 with
  ``Retry-After`` (``BodyLimit``), a gRPC call UNAVAILABLE, with the same message.
- **A client's share** (``CLIENT_SHARE``): every budget clients hold together (``Budget``: the bytes
  in flight here, ``http_server``'s connections, ``ts_grpc``'s open streams) keeps its last
  quarter for the clients holding less than a quarter of it: a client address (``client_of``, the
  socket's peer) holding more may take more only while a quarter stays free. One client with
  970 half-sent uploads no longer refuses everybody else's requests (its own get 503; behind a proxy
  every client is one address, and may still use three quarters of each budget).
- **Streamed answers** (``streams.Parts``): the parts held for a client that reads them slower
  than the worker sends them count in flight (and in that client's share); a part that would pass
  either while parts already wait ends that client's stream there (``max_response_size`` bounds each
  stream's parts together, ``ts_wire.Stream.reply``).
- **gRPC messages while they arrive** (``READS_SHARE``, ``reads_budget``, ``READ_TIMEOUTS``): each read of a
  gRPC message reserves the most it can be (or a client's share) from a budget of its own, half of
  --max_inflight_bytes; a unary call's message must arrive whole within twice --body_idle_timeout (60 s;
  DEADLINE_EXCEEDED after it) (serving/engine/grpc_reading.py).
- **--body_idle_timeout** (``BODY_IDLE_TIMEOUT``): seconds a body may pause while it arrives before
  its request ends with 408 (``BodyLimit``); once the body is whole, only the model's
  ``responseTimeout`` bounds the answer. The engine's HTTP server gives up on a client that reads
  nothing of its answer for as long (``http_server.BoundedHttp``).

``BodyLimit`` (an ASGI middleware) is used by the engine's app (engine.py) and MLServer's REST app
when tsctl starts it (mlserver_start.py). Standard library only, but Starlette's response when a body
is refused (tsctl's CLI reads the defaults here; MLServer's environment has no httptools for
http_server).
"""

import asyncio
import ipaddress
import os
import re
from http import HTTPStatus
from typing import Dict, List, Mapping, Optional, Tuple

from handlers.errors import frontend_error

MAX_REQUEST_SIZE = "max_request_size"  # the setting's name: config.properties' key, in every message
DEFAULT_MAX_REQUEST_SIZE = 6553500  # bytes: TorchServe's default
MAX_REQUEST_SIZE_VARIABLE = "TSCTL_MAX_REQUEST_SIZE"  # MLServer started by tsctl reads it here
BODY_IDLE_TIMEOUT = 30.0  # s without a byte of a request's body while it arrives (--body_idle_timeout)
MAX_MANAGEMENT_BODY = 64 << 10  # bytes: one management call's body (a register's parameters)
MANAGEMENT_BODY = "a management call's body: its parameters, a few short values"  # the limit, in messages
CLIENT_SHARE = 4  # a client above 1/CLIENT_SHARE of a budget may take more while 1/CLIENT_SHARE stays free
READS_SHARE = 2  # gRPC messages being read reserve from a budget of their own: --max_inflight_bytes / READS_SHARE
READ_TIMEOUTS = 2  # a unary gRPC call's message arrives whole within READ_TIMEOUTS x --body_idle_timeout (60 s)


def management_body_limit(max_request_size: int) -> int:
    """The bound on one management call's body: ``MAX_MANAGEMENT_BODY``, or ``max_request_size`` when smaller."""
    return min(max_request_size, MAX_MANAGEMENT_BODY)


def max_request_size_from_environment(environ: Mapping[str, str] = os.environ) -> int:
    """``max_request_size`` where no config.properties is read (MLServer started by tsctl):
    ``TSCTL_MAX_REQUEST_SIZE`` when it is a positive whole number, else TorchServe's default."""
    text = environ.get(MAX_REQUEST_SIZE_VARIABLE, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_MAX_REQUEST_SIZE


def too_large_message(what: str, size: int, limit: int, how: str = "", name: str = MAX_REQUEST_SIZE) -> str:
    """The message of a request above a limit (``name``, by default ``max_request_size``): ``what`` it is,
    its ``size`` in bytes (``how`` they were counted)."""
    return f"{what} {size:,} bytes{how}, above the limit of {limit:,} ({name})"


def memory_limit(proc: str = "/proc/self") -> Tuple[int, str]:
    """The memory this process may use, and what sets it: the smallest limit of its memory cgroup and
    of every group above it up to the hierarchy's root (v1 ``memory.limit_in_bytes``, v2
    ``memory.max``), or the machine's memory when that is smaller or no group limits it. The group
    is the process's own (``proc``/cgroup, v1 ``N:memory:/path`` or v2 ``0::/path``), found where its
    hierarchy is mounted (``proc``/mountinfo: /sys/fs/cgroup/memory, /sys/fs/cgroup,
    /sys/fs/cgroup/unified ...): on a host without a cgroup namespace the mount's top is the host's
    root group, not ours."""
    limit, source, _ = limiting_group(proc)
    return limit, source


def limiting_group(proc: str = "/proc/self") -> Tuple[int, str, Optional[str]]:
    """``memory_limit``'s limit and source, and the folder of the cgroup that sets it (None: the machine's
    memory), where its usage is read (``memory_admission.in_use``)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit, source, folder = total, "the machine's memory", None
    found = memory_cgroup(proc)
    if found is None:
        return limit, source, folder
    mount, group, limit_file = found
    path = group
    while True:
        here = os.path.join(mount, path.lstrip("/"))
        value = _read_number(os.path.join(here, limit_file))
        if value is not None and value < limit:
            limit, source, folder = value, f"the limit of cgroup {path} ({limit_file})", here
        if path in ("/", ""):
            return limit, source, folder
        path = os.path.dirname(path)


def memory_cgroup(proc: str = "/proc/self") -> Optional[Tuple[str, str, str]]:
    """(mount point, the process's group below it, limit file) of its memory cgroup: v1's memory
    controller when there is one (a hybrid host's v2 mount has no memory controller), else v2."""
    v1 = v2 = None
    for line in _read_lines(os.path.join(proc, "cgroup")):
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in controllers.split(","):
            v1 = path
        elif number == "0" and controllers == "":
            v2 = path
    for line in _read_lines(os.path.join(proc, "mountinfo")):
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        root, mount = _unescape(fields[3]), _unescape(fields[4])
        kind, _source, options = (line.split(" - ", 1)[1].split() + ["", "", ""])[:3]
        if v1 is not None and kind == "cgroup" and "memory" in options.split(","):
            return mount, _below(v1, root), "memory.limit_in_bytes"
        if v1 is None and v2 is not None and kind == "cgroup2":
            return mount, _below(v2, root), "memory.max"
    return None


def _below(group: str, root: str) -> str:
    """The group's path under a mount of ``root`` (a mount of a group's own subtree: ``/`` is its top)."""
    if root in ("/", ""):
        return group
    if group == root or group.startswith(root.rstrip("/") + "/"):
        return group[len(root.rstrip("/")) :] or "/"
    return "/"  # not below the mount's root: only the mount's own top is visible


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _read_lines(path: str) -> List[str]:
    try:
        with open(path) as lines:
            return lines.read().splitlines()
    except OSError:
        return []


def _read_number(path: str) -> Optional[int]:
    """A limit file's number; None when it is missing or says ``max``."""
    lines = _read_lines(path)
    text = lines[0].strip() if lines else ""
    return int(text) if text.isdigit() else None


def max_inflight_bytes(max_request_size: int, configured: Optional[int] = None) -> Tuple[int, str]:
    """The bound on request bodies in flight and why: ``--max_inflight_bytes`` when given, else a
    quarter of ``memory_limit()`` (at least one body of ``max_request_size``)."""
    if configured:
        return configured, "--max_inflight_bytes"
    limit, source = memory_limit()
    if limit // 4 < max_request_size:
        return max_request_size, f"one body of max_request_size: a quarter of {source}, {limit:,} bytes, is less"
    return limit // 4, f"a quarter of {source}, {limit:,} bytes"


def reads_budget(max_inflight_bytes: int) -> "Budget":
    """What the gRPC messages being read may reserve together (serving/engine/grpc_reading.py), a client its share
    of it: ``--max_inflight_bytes / READS_SHARE``, apart from the bodies in flight (REST's bodies are
    never refused because gRPC calls wait for messages that do not come)."""
    return Budget(max(1, max_inflight_bytes // READS_SHARE))


def client_of(peer) -> str:
    """The client a share is kept for: an ASGI scope's ``client`` (host, port), or a gRPC ``context.peer()``
    (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``, ``unix:path``); "" when unknown. An IPv4 address written as IPv6
    (``::ffff:1.2.3.4``) is that IPv4 address; an IPv6 address counts by its /64, the block one host is given
    (a host would otherwise be a new client at each of its 2^64 addresses)."""
    if isinstance(peer, (tuple, list)):
        host = str(peer[0]) if peer else ""
    else:
        kind, _, where = str(peer or "").partition(":")
        if kind == "ipv6":
            host = where.rpartition("]")[0].lstrip("[") or where
        elif kind == "ipv4":
            host = where.rpartition(":")[0]
        else:
            return where
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    if address.version == 6 and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class Budget:
    """Something clients hold, bounded in all (``limit``) and for each client address (``CLIENT_SHARE``:
    a client holding more than ``limit // CLIENT_SHARE`` takes more only while that much stays free for
    the others). One event loop counts it: no lock."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0
        self.share = max(1, limit // CLIENT_SHARE)
        self.clients: Dict[str, int] = {}

    def refused(self, size: int, client: str = "") -> str:
        """Why ``client`` may not take ``size`` more: "" when it may, "all" (the limit), "client" (its share)."""
        if self.held + size > self.limit:
            return "all"
        if not self.within_share(size, client) and self.held + size > self.limit - self.share:
            return "client"
        return ""

    def within_share(self, size: int, client: str) -> bool:
        """Whether ``client`` holds no more than its share with ``size`` more."""
        return self.clients.get(client, 0) + size <= self.share

    def why(self, size: int, client: str) -> str:
        """Why ``client`` may not take ``size`` more, in words (the counts, not their unit)."""
        if self.refused(size, client) == "client":
            return f"client {client} holds {self.clients.get(client, 0):,}, above its share of {self.share:,}"
        return f"{self.held:,} are held, the limit"

    def take(self, size: int, client: str = "") -> bool:
        """Count ``size`` more held by ``client``; False (nothing counted) when it is refused."""
        if self.refused(size, client):
            return False
        self.hold(size, client)
        return True

    def hold(self, size: int, client: str = ""):
        """Count ``size`` more held whatever the limit (an answer made already, waiting to be sent:
        requests' bodies are refused while it waits)."""
        self.held += size
        self.clients[client] = self.clients.get(client, 0) + size

    def give(self, size: int, client: str = ""):
        self.held -= size
        left = self.clients.get(client, 0) - size
        if left > 0:
            self.clients[client] = left
        else:
            self.clients.pop(client, None)


class InFlight(Budget):
    """The bytes of request bodies the engine holds, all requests together, REST (``BodyLimit``) and
    gRPC (``kserve_grpc``, ``ts_grpc``) alike, and the streamed answers' parts waiting for their
    clients (``streams.Parts``)."""

    def over(self, size: int = 0, client: str = "") -> str:
        """The limit ``size`` more bytes held by ``client`` would pass, in words."""
        if self.refused(size, client) == "client":
            return (
                f"the share of client {client} ({self.share:,} bytes, a quarter of --max_inflight_bytes, while less "
                "than a quarter is free)"
            )
        return f"the engine's bytes in flight ({self.limit:,}, --max_inflight_bytes)"

    def busy(self, size: int = 0, client: str = "") -> str:
        """What a request refused for it is told."""
        return f"the request's body would pass {self.over(size, client)}: send it again"


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware bounding request bodies, the REST side of this module's limits:

    - one body above ``max_request_size`` (under ``management``, the path of TorchServe's management API:
      ``management_body_limit``): 413, by its Content-Length before anything is read, or, sent chunked,
      as soon as what has arrived passes the limit; the body is never held whole;
    - all bodies together: what has arrived of every request not answered yet (received, queued, at
      a worker) above ``inflight.limit`` (``--max_inflight_bytes``): the request whose bytes would
      pass it gets 503 with ``Retry-After``, as soon as they arrive (150 uploads of 32 MiB, sent or
      half sent, no longer exhaust the engine);
    - a body that stops arriving for ``idle`` seconds (``--body_idle_timeout``) while it is still
      arriving: 408. Once its last chunk came, reading on (``disconnected()`` watching for the
      client leaving while the model answers) waits as long as it must: ``responseTimeout`` alone
      bounds the answer.
    - an answer's body counts in flight for as long as sending it waits for the client to read it
      (uvicorn's flow control); the engine's server gives up on a client that reads nothing for
      ``idle`` seconds (``http_server.BoundedHttp``)."""

    def __init__(
        self, app, limit: int, inflight: InFlight, idle: float = BODY_IDLE_TIMEOUT, management: Optional[str] = None
    ):
        self.app, self.limit, self.inflight, self.idle, self.management = app, limit, inflight, idle, management

    def limit_of(self, path: str) -> Tuple[int, str]:
        """The bound on a body sent to ``path``, and its name."""
        if self.management and (path == self.management or path.startswith(self.management + "/")):
            return management_body_limit(self.limit), MANAGEMENT_BODY
        return self.limit, MAX_REQUEST_SIZE

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        inflight, client = self.inflight, client_of(scope.get("client"))
        limit, name = self.limit_of(scope.get("path", ""))

        def too_large(size: int, qualifier: str = "") -> str:
            return too_large_message(f"the request body is {qualifier}".rstrip(), size, limit, name=name)

        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            return await self.refuse(scope, send, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, too_large(int(length)))
        seen, refusal, started, whole = 0, None, False, False

        async def counted():
            nonlocal seen, refusal, whole
            if whole:  # the body came whole: nothing more to count or to time
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.idle)
            except asyncio.TimeoutError:
                refusal = (HTTPStatus.REQUEST_TIMEOUT, f"no byte of the request body came for {self.idle:g} s")
                raise BodyTooLarge() from None
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                if seen + size > limit:
                    refusal = (HTTPStatus.REQUEST_ENTITY_TOO_LARGE, too_large(seen + size, "at least "))
                elif not inflight.take(size, client):
                    refusal = (HTTPStatus.SERVICE_UNAVAILABLE, inflight.busy(size, client))
                if refusal:
                    raise BodyTooLarge()
                seen += size
                whole = not message.get("more_body", False)
            else:
                whole = True  # http.disconnect: nothing more will come
            return message

        async def tracked(message):
            nonlocal started
            if refusal and not started:
                return
            started = started or message["type"] == "http.response.start"
            waiting = len(message.get("body", b"")) if message["type"] == "http.response.body" else 0
            inflight.hold(waiting, client)  # held while the client does not read it (http_server: send_timeout)
            try:
                await send(message)
            finally:
                inflight.give(waiting, client)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge:
            pass
        finally:
            inflight.give(seen, client)
        if refusal and not started:
            await self.refuse(scope, send, *refusal)

    @staticmethod
    async def refuse(scope, send, status: int, message: str):
        from starlette.responses import Response  # imported here: the CLI reads this module's limits

        kind = {408: "RequestTimeout", 413: "RequestEntityTooLarge", 503: "ServiceUnavailableException"}[status]
        headers = {"Retry-After": "1"} if status == 503 else None
        body = frontend_error(status, kind, message, kserve=True)
        await Response(body, int(status), headers=headers, media_type="application/json")(scope, None, send)
