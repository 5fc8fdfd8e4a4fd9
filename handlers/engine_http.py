"""The tsctl engine's HTTP server: uvicorn (httptools), with the bounds it does not set itself.

- **The request head** (request line and headers) may be at most ``MAX_HEAD_BYTES``: above that
  the connection gets 431 and is closed before the rest is read (uvicorn's httptools protocol has no
  limit: a 100 MB header was parsed whole). TorchServe's Netty allows 8 KiB; this allows more for
  long tokens and tracing headers.
- **Slow clients**: a request head must arrive within ``HEAD_TIMEOUT`` seconds of its first byte
  (or of the connection's opening); a client trickling headers (slowloris) is disconnected.
- **Bodies in flight**: what all requests' bodies hold together (being received, queued, at a
  worker), REST and gRPC alike, may be at most ``--max_inflight_bytes`` (default: a quarter of the
  memory the process may use, ``memory_limit()``: the smallest limit of its memory cgroup and the
  groups above it, read through ``/proc/self/cgroup``, or the machine's memory; logged at start); a
  REST request whose body would pass it gets 503 with ``Retry-After``, a gRPC call UNAVAILABLE, with
  the same message (``InFlight``: the one counter both use). A body must keep arriving:
  ``--body_idle_timeout`` seconds (``BODY_IDLE_TIMEOUT``) without a byte of it end the request
  (408); once the body is whole, only the model's ``responseTimeout`` bounds the answer.
  (``BodyLimit`` in engine.py counts both.)
- **Connections** at once: at most ``max_connections()`` (below the process's open-file limit, so
  that the workers can always be restarted); above it uvicorn answers 503.
- **Stopping**: no signal handling of uvicorn's own (the engine stops on SIGTERM/SIGINT itself and
  ends its workers; uvicorn would re-raise the signal once stopped), and at most
  ``SHUTDOWN_GRACE`` seconds for the requests in flight.
"""

import contextlib
import json
import os
import re
import resource
from typing import List, Optional, Tuple

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 << 10
HEAD_TIMEOUT = 30.0  # s
BODY_IDLE_TIMEOUT = 30.0  # s without a byte of a request's body while it arrives (--body_idle_timeout)
SHUTDOWN_GRACE = 30  # s
END_OF_HEAD = b"\r\n\r\n"


class BoundedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with a size and a time limit on each request's head."""

    def connection_made(self, transport):
        super().connection_made(transport)
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
        if self.in_head:
            room = MAX_HEAD_BYTES - self.head_bytes
            if len(data) > room and END_OF_HEAD not in self.head_tail + data[: max(room, 0) + len(END_OF_HEAD)]:
                return self._refuse_head()
            self.head_bytes += len(data)
            self.head_tail = data[-(len(END_OF_HEAD) - 1) :]
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self.in_head:  # the next request on a kept-alive connection
            self._begin_head()

    def on_headers_complete(self) -> None:
        self.in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _head_too_slow(self):
        self.head_timer = None
        if self.in_head and not self.transport.is_closing():
            self.transport.close()

    def _refuse_head(self):
        message = f"the request line and headers are above {MAX_HEAD_BYTES:,} bytes"
        body = json.dumps({"code": 431, "type": "RequestHeaderFieldsTooLarge", "message": message, "error": message})
        head = (
            "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.in_head = False
        self._cancel_head_timer()
        self.transport.write(head.encode("ascii") + body.encode("utf-8"))
        self.transport.close()


def memory_limit(proc: str = "/proc/self") -> Tuple[int, str]:
    """The memory this process may use, and what sets it: the smallest limit of its memory cgroup and
    of every group above it up to the hierarchy's root (v1 ``memory.limit_in_bytes``, v2
    ``memory.max``), or the machine's memory when that is smaller or no group limits it. The group
    is the process's own (``proc``/cgroup, v1 ``N:memory:/path`` or v2 ``0::/path``), found where its
    hierarchy is mounted (``proc``/mountinfo: /sys/fs/cgroup/memory, /sys/fs/cgroup,
    /sys/fs/cgroup/unified ...): on a host without a cgroup namespace the mount's top is the host's
    root group, not ours."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit, source = total, "the machine's memory"
    found = memory_cgroup(proc)
    if found is None:
        return limit, source
    mount, group, limit_file = found
    path = group
    while True:
        value = _read_number(os.path.join(mount, path.lstrip("/"), limit_file))
        if value is not None and value < limit:
            limit, source = value, f"the limit of cgroup {path} ({limit_file})"
        if path in ("/", ""):
            return limit, source
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


class InFlight:
    """The bytes of request bodies the engine holds, all requests together, REST (``BodyLimit``) and
    gRPC (``engine_grpc``) alike; one event loop serves both: no lock."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0

    def take(self, size: int) -> bool:
        """Count ``size`` more bytes held; False (nothing counted) when they would pass the limit."""
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int):
        self.held -= size

    def busy(self) -> str:
        """What a request refused for it is told."""
        return (
            f"the engine holds {self.limit:,} bytes of request bodies in flight, its limit (--max_inflight_bytes): "
            "send it again"
        )


def max_connections() -> int:
    """Connections served at once: the open-file limit, less what the workers and the engine need."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, min(4096, soft - 128))


def server(app, host: str, port: int) -> uvicorn.Server:
    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=BoundedHttp,
        log_level="warning",
        access_log=False,
        lifespan="off",
        limit_concurrency=max_connections(),
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
    )
    return Server(config)
