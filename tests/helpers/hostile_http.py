"""HTTP servers that attack their clients (issue 43's "tsctl as a client"), each a process of its own and its
own process group, so that a tsctl command can take it for a running server (``server_json``).

Every POST is answered with the attack the server was started for; anything else (a GET of the model list)
is a bare 404, so that a command falls back on what server.json records. Run as a script:
``python hostile_http.py ATTACK`` prints its port on stdout and serves until it is killed.
"""

import contextlib
import json
import os
import signal
import socketserver
import subprocess
import sys
import time
from pathlib import Path

EMPTIES_BLOCK = b"[]," * 349_525  # 1,048,575 bytes of empty arrays
EMPTIES_BLOCKS = 250  # 250 MiB in all: under the 256 MiB tsctl reads of one answer
DEEP = 200_000


def chunked(sock, expect: bool, length: int):
    """200, then chunks of 1 MiB that never end."""
    answer_head(sock, expect, length, "Transfer-Encoding: chunked")
    chunk = b"100000\r\n" + b"0" * (1 << 20) + b"\r\n"
    while True:
        sock.sendall(chunk)


def drip(sock, expect: bool, length: int):
    """200 with a Content-Length of 1,000, its bytes one a second."""
    answer_head(sock, expect, length, "Content-Length: 1000")
    for _ in range(1000):
        sock.sendall(b" ")
        time.sleep(1)


def continue_close(sock, expect: bool, length: int):
    """The status line of a ``100 Continue`` and no more: the connection closed."""
    sock.sendall(b"HTTP/1.1 100 Continue\r\n")


def continue_drip(sock, expect: bool, length: int):
    """The status line of a ``100 Continue``, then its header a byte every half second, never ending."""
    sock.sendall(b"HTTP/1.1 100 Continue\r\nX-Slow: ")
    while True:
        time.sleep(0.5)
        sock.sendall(b"x")


def empties(sock, expect: bool, length: int):
    """250 MiB of JSON: one array of 87 million empty arrays."""
    size = 1 + len(EMPTIES_BLOCK) * EMPTIES_BLOCKS + 3
    answer_head(sock, expect, length, f"Content-Length: {size}")
    sock.sendall(b"[")
    for _ in range(EMPTIES_BLOCKS):
        sock.sendall(EMPTIES_BLOCK)
    sock.sendall(b"[]]")


def deep(sock, expect: bool, length: int):
    """JSON arrays nested ``DEEP`` levels (400 KB)."""
    body = b"[" * DEEP + b"]" * DEEP
    answer_head(sock, expect, length, f"Content-Length: {len(body)}")
    sock.sendall(body)


ATTACKS = {f.__name__.replace("_", "-"): f for f in (chunked, drip, continue_close, continue_drip, empties, deep)}


def answer_head(sock, expect: bool, length: int, header: str):
    """The request's body read (after a ``100 Continue`` when it asked for one), then a 200's head."""
    if expect:
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    while length > 0:
        read = sock.recv(min(length, 1 << 20))
        if not read:
            raise ConnectionError("the client closed the connection in the middle of its request")
        length -= len(read)
    sock.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{header}\r\n\r\n".encode())


class Attacker(socketserver.BaseRequestHandler):
    attack = None

    def handle(self):
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            more = self.request.recv(4096)
            if not more:
                return
            head += more
        head, _, body = head.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").lower().split("\r\n")
        length = next((int(line.split(":")[1]) for line in lines if line.startswith("content-length:")), 0)
        if not lines[0].startswith("post "):
            self.request.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        expect = any(line.startswith("expect:") and "100-continue" in line for line in lines)
        with contextlib.suppress(OSError):
            self.attack(self.request, expect, length - len(body))


def serve(attack: str):
    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    Attacker.attack = staticmethod(ATTACKS[attack])
    with Server(("127.0.0.1", 0), Attacker) as server:
        print(server.server_address[1], flush=True)
        server.serve_forever()


@contextlib.contextmanager
def hostile_server(attack: str):
    """The server of ``attack`` (a key of ``ATTACKS``) in a process group of its own: (its URL, its pid);
    killed after, by its process group."""
    process = subprocess.Popen(
        [sys.executable, __file__, attack], stdout=subprocess.PIPE, start_new_session=True, text=True
    )
    try:
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        process.stdout.close()


def server_json(home: Path, url: str, pid: int, model: str) -> Path:
    """``home``/server.json recording the server at ``url`` (process group ``pid``) as TorchServe serving
    ``model``: what ``tsctl predict`` and ``bench`` read to find a running server."""
    home.mkdir(parents=True, exist_ok=True)
    record = {"pid": pid, "home": str(home), "inference": url, "management": url, "metrics": url, "models": [model]}
    (home / "server.json").write_text(json.dumps(record))
    return home


if __name__ == "__main__":
    serve(sys.argv[1])
