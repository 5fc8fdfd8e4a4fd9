"""Issue #43, an outsider's attack on the engine's HTTP server (serving/engine/http_server.py): what uvicorn
makes of a few bytes before any bound of body_limit.py sees a request.

1. HTTP/1.1 pipelining: uvicorn parses every request of a read (256 KiB) at once and queues each
   (a request cycle, its scope) behind the one being answered; each answer that completes reads
   more. 20 connections each sending 256 KiB of ``GET /ping`` and reading nothing grew the engine by
   about 640 MiB, a neighbour waiting 19.5 s. Now a connection may have ``MAX_PIPELINED`` requests
   waiting behind the one being answered; the rest of what it sent is dropped, and it is closed once
   those are answered (as a server may close a pipelining connection, RFC 9112 section 9.3.2).
2. Heads of many tiny headers: a 63 KiB head of ``a:b`` lines is 12,902 headers, each a tuple of two
   bytes objects (about 80 bytes a header where the wire has 5): 100 connections holding such a
   request (a body still to come) grew the engine by 102 MiB, 400 by 529 MiB; a client's share of
   connections (1,024) would be about 1 GB. Now ``MAX_HEADERS`` headers a request: 431 past it.

One engine in a memory cgroup of its own; its peak resident memory measured (VmHWM), its workers'
pids checked before and after, a neighbour's request answered after each attack.

3. One client's connections: at most ``max_connections()`` at once (from the open-file limit), a client
   its share of them (``body_limit.CLIENT_SHARE``), past it 503 as the connection opens (an engine of
   its own with 256 open files).
"""

import resource
import socket
import time

import pytest

from helpers.cgroups import peak_rss, reset_peak
from helpers.engine import Engine, received
from helpers.engine_limits import engine_in_cgroup, limits_tree
from serving.engine.http_server import HEAD_BYTES_IN_FLIGHT, MAX_HEADERS, MAX_PIPELINED

GROUP_LIMIT = 2 << 30
BOUND = 128 << 20  # --max_inflight_bytes
PING = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("http-parsing")
    limits_tree(root, {"other": 1})
    with engine_in_cgroup(root, GROUP_LIMIT, "--max_inflight_bytes", str(BOUND)) as running:
        yield running


def connect(engine) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", engine.http), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # reads nothing: the answers back up
    return sock


def neighbour(engine):
    started = time.monotonic()
    status, _ = engine.post("/predictions/other", b"echo", timeout=60)
    return status, time.monotonic() - started


def answers_on(sock: socket.socket) -> int:
    """How many answers the engine sent before closing the connection (read to its end)."""
    data, sock_timeout = b"", time.monotonic() + 60
    sock.settimeout(30)
    while time.monotonic() < sock_timeout:
        try:
            chunk = sock.recv(1 << 16)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        data += chunk
    return data.count(b"HTTP/1.1 200")


def test_a_head_of_many_tiny_headers_is_refused(engine):
    base = reset_peak(engine.process.pid)
    head = b"POST /predictions/other HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n" + b"a:b\r\n" * 12900 + b"\r\n"
    socks = [connect(engine) for _ in range(100)]
    try:
        for sock in socks:
            sock.sendall(head + b"x")  # the body: 1 byte of 10, the rest never sent
        status, took = neighbour(engine)  # answered once the engine has parsed what it read
        socks[0].settimeout(40)
        first = socks[0].recv(1 << 16)
        grown = peak_rss(engine.process.pid) - base
    finally:
        for sock in socks:
            sock.close()
    print(
        f"100 heads of 12,900 headers: engine +{grown >> 20} MiB, first answer {first[:12]!r}, "
        f"neighbour {status} in {took:.2f} s"
    )
    assert status == 200
    assert first.startswith(b"HTTP/1.1 431"), first[:200]
    assert f"{MAX_HEADERS:,} headers".encode() in first
    assert grown < 32 << 20, f"+{grown >> 20} MiB for 100 heads of 12,900 headers"


def test_pipelined_requests_are_not_parsed_ahead_of_their_answers(engine):
    workers = [w["pid"] for w in engine.workers("other")]
    base = reset_peak(engine.process.pid)
    burst = PING * ((256 << 10) // len(PING))  # 8,456 requests in one read
    socks = [connect(engine) for _ in range(20)]
    try:
        for sock in socks:
            sock.sendall(burst)
        status, took = neighbour(engine)  # answered once the engine has parsed what it read
        answered = answers_on(socks[0])
        grown = peak_rss(engine.process.pid) - base
    finally:
        for sock in socks:
            sock.close()
    print(
        f"20 connections x {burst.count(b'GET'):,} pipelined requests: engine +{grown >> 20} MiB, "
        f"the first connection answered {answered}, neighbour {status} in {took:.2f} s"
    )
    assert status == 200 and [w["pid"] for w in engine.workers("other")] == workers
    assert grown < 64 << 20, f"+{grown >> 20} MiB for 20 connections' pipelined requests"
    assert answered <= MAX_PIPELINED + 1


OPEN_FILES = 256  # the engine's open-file limit in the next test: max_connections() is 128, a share 32


@pytest.fixture(scope="module")
def few_files(tmp_path_factory):
    """An engine whose open-file limit is OPEN_FILES (its connections bound with it)."""
    root = tmp_path_factory.mktemp("few-files")
    limits_tree(root, {"other": 1})

    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))

    running = Engine(root, "--max_inflight_bytes", str(BOUND), preexec_fn=limited).wait_ready()
    try:
        yield running
    finally:
        assert running.stop() == 0


def refusals(socks, why: bytes) -> int:
    """How many of ``socks`` the engine answered 503 for ``why`` (any other answer fails); the others
    have had no answer."""
    refused = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            answer = sock.recv(4096)
        except BlockingIOError:
            continue
        assert answer.startswith(b"HTTP/1.1 503") and why in answer, answer[:300]
        refused += 1
    return refused


def test_one_client_holding_connections_leaves_the_others_theirs(few_files):
    """One client (127.0.0.2) opens more connections than the engine serves, each a head begun and never
    finished: past its share, while a quarter stays free, each is answered 503 as it opens and closed;
    another client (127.0.0.1) still connects and is answered, and its own connections are never refused."""
    engine, limit = few_files, max(16, OPEN_FILES - 128)  # http_server.max_connections() in the engine
    workers = [w["pid"] for w in engine.workers("other")]
    held = []
    try:
        for _ in range(limit + 40):
            sock = socket.create_connection(("127.0.0.1", engine.http), timeout=10, source_address=("127.0.0.2", 0))
            sock.sendall(b"GET /ping HTTP/1.1\r\n")  # a head begun: the connection stays until HEAD_TIMEOUT
            held.append(sock)
        time.sleep(1)
        refused = refusals(held, b"too many connections")
        mine = [connect(engine) for _ in range(limit // 4)]  # the other client's share, all at once
        try:
            for sock in mine:
                sock.sendall(PING)
            answers = [received(sock, b"}") for sock in mine]
        finally:
            for sock in mine:
                sock.close()
    finally:
        for sock in held:
            sock.close()
    print(f"{limit + 40} connections from one client: {refused} refused; the other's {len(mine)} all answered")
    assert refused == limit + 40 - (limit - limit // 4), refused  # it kept three quarters of them
    assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers), [a[:60] for a in answers]
    assert [w["pid"] for w in engine.workers("other")] == workers


def test_unfinished_heads_on_many_connections_are_bounded_together(engine):
    """An outsider's attack (#43): thousands of connections, each sending a head of 62 KiB (under
    MAX_HEAD_BYTES) slowly and never finishing it, OOM-killed an engine in a 1.5 GiB group in 22 s: one head
    was bounded, all of them were not. Now their bytes count against HEAD_BYTES_IN_FLIGHT, of which one
    client (127.0.0.2) holds three quarters at most: past it, 503 and the connection closed; a neighbour
    is answered, the engine's memory grows by a bounded amount, its workers unchanged."""
    line = b"X-Pad: " + b"a" * 240 + b"\r\n"
    head = b"POST /predictions/other HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n" + line * 240  # no end
    per_head = len(head)
    count = HEAD_BYTES_IN_FLIGHT // per_head + 200  # more than all of it could hold
    workers = [w["pid"] for w in engine.workers("other")]
    base = reset_peak(engine.process.pid)
    socks = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", engine.http), timeout=10, source_address=("127.0.0.2", 0))
            sock.sendall(head)
            socks.append(sock)
        time.sleep(2)
        refused = refusals(socks, b"too many request heads in flight")
        status, seconds = neighbour(engine)
        grown = peak_rss(engine.process.pid) - base
    finally:
        for sock in socks:
            sock.close()
    held = count - refused
    print(f"{count} unfinished heads of {per_head:,} bytes: {held} held, {refused} refused, +{grown >> 20} MiB")
    assert held * per_head <= HEAD_BYTES_IN_FLIGHT * 3 // 4 + per_head, held  # the client's three quarters at most
    assert refused >= count - HEAD_BYTES_IN_FLIGHT * 3 // 4 // per_head - 1, refused
    assert status == 200 and seconds < 30, (status, seconds)
    assert grown < 3 * HEAD_BYTES_IN_FLIGHT, grown >> 20
    assert [w["pid"] for w in engine.workers("other")] == workers


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # and an empty SETTINGS


def test_each_grpc_server_takes_a_bounded_number_of_connections(few_files):
    """gRPC had no bound on connections (#43: 3,000 on each of three gRPC ports, each an HTTP/2 head never
    ended, OOM-killed an engine in 30 s). Now each gRPC server takes grpc_reading.connections() (32 at
    256 open files): past them, a connection is closed as it opens; REST is still answered."""
    engine, cap = few_files, max(16, max(16, OPEN_FILES - 128) // 4)  # grpc_reading.connections() there
    workers = [w["pid"] for w in engine.workers("other")]
    for port in (engine.grpc, engine.ts_grpc, engine.ts_grpc_management):
        socks = []
        try:
            for _ in range(cap + 20):
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.sendall(HTTP2_PREFACE)
                socks.append(sock)
            time.sleep(1)
            closed = sum(closed_by_the_server(sock) for sock in socks)
            status, _ = neighbour(few_files)
        finally:
            for sock in socks:
                sock.close()
        assert closed == 20, (port, closed)
        assert status == 200
    assert [w["pid"] for w in engine.workers("other")] == workers


def closed_by_the_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        while sock.recv(1 << 16):
            pass
        return True  # the end of the stream
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
