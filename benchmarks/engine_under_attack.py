"""The tsctl engine under attack: good traffic's throughput with and without attackers, and the engine's peak memory.

    .venv/bin/python benchmarks/engine_under_attack.py [SECONDS] [ROUNDS]   (20 s, 3 rounds: about 16 minutes)

One engine (``python -m serving.engine``) in a 4 GiB memory cgroup of its own, joined at spawn (so its
bound on bodies in flight is a quarter of that group's limit), serving resnet18 (the toolkit's
``image_classifier``, batchSize 4, one worker) and ``target`` (tests/engine/test_engine_limits.py's handler, one
worker). Good traffic: 4 clients posting a 640x480 JPEG to resnet18 for SECONDS, alone, beside each attack in
turn and beside all of them at once, the sides in alternating order (the machine is noisy: only ratios within
a round mean anything); the CPU each process used is recorded, as the attackers share the machine's cores.
The attacks, all aimed at the engine (issue #29's reproductions):

- 24 connections each declaring a 32 MiB body and sending 16 MiB of it, reopened when refused;
- 2 clients sending gRPC ``ModelInfer`` calls of 15.5 M FP32 values as typed contents;
- 2 clients asking ``target`` for a 200 MB answer (above ``max_response_size``);
- 2 clients sending JSON whose key forges a ``[METRICS]`` line, and scraping ``/metrics``;
- 40 connections trickling a request head a byte a second (slowloris);

and issue #43's:

- 8 clients asking ``target`` for a 50 MiB streamed answer (30 parts) and reading none of it (a 4 KiB receive
  buffer), each held 5 s, then closed and asked again;
- 1 client holding 1,100 half-sent uploads (1 MiB of 2 MiB each: more than the whole budget), topped up a byte at a time, reopened when
  refused (one client against the shared bodies-in-flight budget);
- 1,700 ``StreamPredictions2`` calls opened and left open (nothing sent), reopened when refused;
- 2 clients posting 60 MiB JSON bodies to the management API's register.

The attackers connect from 127.0.0.2, the good clients from 127.0.0.1: the engine sees two clients (the bounds
that are a client's share, issue #43, are per address).

Reported: good requests per second alone and beside each attack, their p99, the cores used, errors among good requests (must
be 0), the engine's peak RSS (VmHWM), whether any pid changed, and the size of ``/metrics`` at the end.
"""

import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import alternate, write_section

from archiver.capacity import bench  # noqa: E402
from helpers.cgroups import MemoryLimit, peak_rss  # noqa: E402
from helpers.engine import Engine, snapshot_entry  # noqa: E402
from helpers.engine_limits import HANDLER, archive_handler, grpc_infer, write_config  # noqa: E402
from helpers.models import package_resnet  # noqa: E402
from samples import image_model  # noqa: E402

GROUP_LIMIT = 4 << 30
ATTACKER = "127.0.0.2"  # the attackers' address: the good traffic's is 127.0.0.1
STREAM = b"stream 30 1048576 0"  # 30 parts, 50 MiB (tests/security/test_attack_fair_share.py's)
FORGED = '{"\\n[METRICS]HandlerTime.ms:999999|#ModelName:resnet18,Level:Model|#hostname:forged": 1}'


def build(root: Path) -> Path:
    """model-store/ with resnet18 and ``target`` (test_engine_limits' handler), and config/config.properties."""
    store = root / "model-store"
    store.mkdir(parents=True)
    handler = root / "target.py"
    handler.write_text(HANDLER)
    archive_handler(handler, ["target"], store)
    sample = image_model.build(root / "sample")
    package_resnet(sample, store, config_text="batchSize: 4\nmaxBatchDelay: 20\n")
    (root / "config").mkdir()
    models = {
        "resnet18": snapshot_entry("resnet18.mar", 1, 4, 20, 120),
        "target": snapshot_entry("target.mar", 1, 1, 0, 60),
    }
    write_config(root / "config" / "config.properties", models)
    return sample / "kitten.jpg"


class Attackers:
    """The chosen attacks at once, each in its own threads of a process of their own (so that they hold its
    GIL, not the good traffic's), from ``start()`` until ``stop()``; ``counts``: what each got."""

    def __init__(self, engine, kinds=None):
        self.engine, self.kinds, self.counts = engine, kinds, {}
        self.lock = threading.Lock()

    def count(self, attack: str, outcome):
        with self.lock:
            key = f"{attack}: {outcome}"
            self.counts[key] = self.counts.get(key, 0) + 1

    def start(self):
        context = multiprocessing.get_context("fork")
        self.stopping, self.results = context.Event(), context.Queue()
        self.process = context.Process(target=self._attack, daemon=True)
        self.process.start()

    def stop(self):
        self.stopping.set()
        self.counts = self.results.get(timeout=600)
        self.process.join(60)

    def _attack(self):
        plan = [(self.partial_upload, 24), (self.grpc_typed, 2), (self.big_answer, 2), (self.forged_metric, 2)]
        plan += [(self.slowloris, 40), (self.unread_stream, 8), (self.one_client_uploads, 1)]
        plan += [(self.half_open_streams, 1), (self.management_body, 2)]
        threads = []
        for attack, copies in plan:
            if self.kinds is not None and attack.__name__ not in self.kinds:
                continue
            for _ in range(copies):
                threads.append(threading.Thread(target=self._loop, args=(attack,), daemon=True))
                threads[-1].start()
        self.stopping.wait()
        for thread in threads:
            thread.join(120)
        self.results.put(self.counts)

    def _loop(self, attack):
        while not self.stopping.is_set():
            try:
                attack()
            except OSError as exc:
                self.count(attack.__name__, type(exc).__name__)

    def connect(self, timeout: float) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.engine.http), timeout=timeout, source_address=(ATTACKER, 0))

    def partial_upload(self):
        with self.connect(30) as sock:
            sock.sendall(b"POST /predictions/target HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (32 << 20))
            chunk = b"a" * (1 << 20)
            try:
                for _ in range(16):
                    sock.sendall(chunk)
            except OSError:
                self.count("partial_upload", "refused while sending")
                return
            sock.settimeout(5)
            try:
                answer = sock.recv(64)
                self.count("partial_upload", answer[:12].decode(errors="replace") or "closed")
            except OSError:  # half a body: the engine waits for the rest, holding what came (counted in flight)
                self.count("partial_upload", "held, unanswered (half its body sent)")
            self.stopping.wait(2)

    def grpc_typed(self):
        import numpy as np

        code, _ = grpc_infer(self.engine, "target", np.ones(15_500_000, dtype=np.float32), timeout=120)
        self.count("grpc_typed", code.name if code else "OK")

    def big_answer(self):
        status, _ = self.engine.post("/predictions/target", b"big 200000000", timeout=120)
        self.count("big_answer", status)

    def forged_metric(self):
        status, _ = self.engine.post("/predictions/resnet18", FORGED.encode(), "application/json", timeout=60)
        self.count("forged_metric", status)
        self.engine.get("/metrics")

    def slowloris(self):
        with self.connect(60) as sock:
            try:
                for byte in b"POST /predictions/resnet18 HTTP/1.1\r\nHost: x\r\n":
                    if self.stopping.is_set():
                        return
                    sock.sendall(bytes([byte]))
                    time.sleep(1)
                self.count("slowloris", "whole head sent")
            except OSError:
                self.count("slowloris", "disconnected")

    def unread_stream(self):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(30)
        sock.bind((ATTACKER, 0))
        with sock:
            sock.connect(("127.0.0.1", self.engine.http))
            head = b"POST /predictions/target HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(STREAM)
            sock.sendall(head + STREAM)
            self.stopping.wait(5)
        self.count("unread_stream", "held 5 s unread, closed")

    def one_client_uploads(self):
        head = b"POST /predictions/target HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (2 << 20)
        held = []
        try:
            while not self.stopping.is_set():
                while len(held) < 1100 and not self.stopping.is_set():
                    sock = self.connect(30)
                    try:
                        sock.sendall(head + b"a" * (1 << 20))
                        held.append(sock)
                    except OSError:
                        sock.close()
                        self.count("one_client_uploads", "refused while sending")
                for sock in list(held):  # a byte each, so that no body goes idle
                    try:
                        sock.sendall(b"a")
                    except OSError:
                        held.remove(sock)
                        sock.close()
                        self.count("one_client_uploads", "refused or closed")
                self.stopping.wait(1)
        finally:
            for sock in held:
                sock.close()

    def half_open_streams(self):
        import asyncio

        import grpc

        from serving.engine import ts_protos as pb

        async def hold():
            channels = [grpc.aio.insecure_channel(f"127.0.0.1:{self.engine.ts_grpc}") for _ in range(8)]
            method = [c.stream_stream(f"/{pb.INFERENCE_SERVICE}/StreamPredictions2") for c in channels]
            calls = [method[n % 8](timeout=600) for n in range(1700)]
            while not self.stopping.is_set():
                await asyncio.sleep(1)
                for n, call in enumerate(calls):
                    if call.done():
                        self.count("half_open_streams", (await call.code()).name)
                        calls[n] = method[n % 8](timeout=600)
            for call in calls:
                call.cancel()
            for channel in channels:
                await channel.close()

        asyncio.run(hold())

    def management_body(self):
        body = b'{"url": "' + b"a" * (60 << 20) + b'"}'
        with self.connect(60) as sock:
            head = b"POST /models HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            try:
                sock.sendall(head % len(body))
                sock.sendall(body)
            except OSError:
                pass
            try:
                self.count("management_body", sock.recv(12)[9:12].decode(errors="replace") or "closed")
            except OSError as exc:
                self.count("management_body", type(exc).__name__)


def good_traffic(engine, jpeg: bytes, seconds: float) -> dict:
    result = bench.run_load(f"{engine.url}/predictions/resnet18", [(jpeg, "image/jpeg")], 4, duration=seconds)
    summary = result.summary()
    return {"rps": round(result.throughput, 2), "p99": summary["latency_ms"]["p99"], "errors": result.errors}


SIDES = {  # what runs beside the good traffic
    "alone": (),
    "uploads": ("partial_upload",),
    "gRPC": ("grpc_typed",),
    "big answers": ("big_answer",),
    "forged metrics": ("forged_metric",),
    "slowloris": ("slowloris",),
    "unread streams": ("unread_stream",),
    "one client's uploads": ("one_client_uploads",),
    "half-open StreamPredictions2": ("half_open_streams",),
    "management bodies": ("management_body",),
    "all at once": (
        "partial_upload",
        "grpc_typed",
        "big_answer",
        "forged_metric",
        "slowloris",
        "unread_stream",
        "one_client_uploads",
        "half_open_streams",
        "management_body",
    ),
}


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(seconds: float = 20, rounds: int = 3):
    root = Path(tempfile.mkdtemp(prefix="under-attack-"))
    jpeg = build(root).read_bytes()
    group = MemoryLimit(None, GROUP_LIMIT)
    if group.cgroup is None:
        sys.exit("no memory cgroup can be made here")
    engine = Engine(root, preexec_fn=group.join).wait_ready()
    pids_before = {m: [w["pid"] for w in engine.workers(m)] for m in ("resnet18", "target")}
    processes = {
        "engine": engine.process.pid,
        "resnet18 worker": pids_before["resnet18"][0],
        "target worker": pids_before["target"][0],
    }
    attackers = {}
    try:
        good_traffic(engine, jpeg, 5)  # warm-up

        def side(kinds):
            def run():
                attack = Attackers(engine, kinds)
                attack.start()
                if kinds:
                    time.sleep(3)
                measured = {**processes, "attackers": attack.process.pid}
                used = {name: cpu_seconds(pid) for name, pid in measured.items()}
                try:
                    result = good_traffic(engine, jpeg, seconds)
                finally:
                    result["cpu"] = {name: cpu_seconds(pid) - used[name] for name, pid in measured.items()}
                    attack.stop()
                    for key, value in attack.counts.items():
                        attackers[key] = attackers.get(key, 0) + value
                return result

            return run

        results = alternate({name: side(kinds) for name, kinds in SIDES.items()}, rounds)
        peak = peak_rss(engine.process.pid)
        pids_after = {m: [w["pid"] for w in engine.workers(m)] for m in ("resnet18", "target")}
        _, metrics_text = engine.get("/metrics")
        metrics_size = len(metrics_text.encode())
        forged = "forged" in metrics_text or "999999" in metrics_text
        alive = engine.process.poll() is None
    finally:
        code = engine.stop()
        group.release()
    alone = results["alone"]
    errors = sum(r["errors"] for side in results for r in results[side])
    rows = []
    for name in SIDES:
        ratios = [r["rps"] / a["rps"] for r, a in zip(results[name], alone)]
        cpu = {p: statistics.median(r["cpu"][p] for r in results[name]) / seconds for p in (*processes, "attackers")}
        rows.append(
            f"| {name} | {' / '.join(format(r['rps'], '.1f') for r in results[name])} | "
            f"{statistics.median(ratios):.2f}x | {statistics.median(r['p99'] for r in results[name]):,.0f} | "
            f"{cpu['engine']:.2f} | {cpu['resnet18 worker']:.2f} | {cpu['target worker']:.2f} | {cpu['attackers']:.2f} |"
        )
    table = "\n".join(rows)
    outcomes = "\n".join(f"| {key} | {value:,} |" for key, value in sorted(attackers.items()))
    write_section(
        "UNDER_ATTACK",
        f"""
## The engine under attack (issues #29 and #43): good traffic beside each attack, and all at once

`benchmarks/engine_under_attack.py`: one tsctl engine in a {GROUP_LIMIT >> 30} GiB memory cgroup (joined at
spawn), serving resnet18 (batchSize 4, one worker) and an attack target (one worker). 4 clients post a JPEG to
resnet18 for {seconds:.0f} s beside each attack: 24 half-sent 32 MiB uploads (reopened when refused), 2
clients of 15.5 M-float typed gRPC calls, 2 asking for 200 MB answers (above `max_response_size`), 2 forging
`[METRICS]` keys and scraping `/metrics`, 40 slowloris heads; issue #43's: 8 unread 50 MiB streams, one
client's 1,100 half-sent 2 MiB uploads topped up a byte a second, 1,700 half-open `StreamPredictions2` calls, 2
clients of 60 MiB management bodies; the attackers from 127.0.0.2, the good clients from 127.0.0.1;
{rounds} rounds, the sides alternating. The
attackers run on the same 2 cores: CPU is the columns on the right (cores used by each process while the good
traffic ran; the attackers are a process of their own, the good clients another), and a side that takes the
cores leaves fewer to resnet18 whatever the server does.

| beside | good requests/s, each round | vs alone (median) | p99 ms (median) | engine cores | resnet18 worker cores | target worker cores | attackers' cores |
|---|---|---|---|---|---|---|---|
{table}

- Errors among good requests: **{errors}**. Engine peak RSS (VmHWM) over the whole run:
  **{peak / 2**20:,.0f} MiB** in its {GROUP_LIMIT >> 30} GiB group; the engine
  {"stayed up" if alive else "**died**"} (exit {code} on SIGTERM); worker pids
  {"unchanged" if pids_before == pids_after else "**changed**: " + str((pids_before, pids_after))}.
- `/metrics` at the end: {metrics_size:,} bytes; a forged series {"**is** in it" if forged else "is not in it"}.

| attack: outcome | count |
|---|---|
{outcomes}
""",
    )


if __name__ == "__main__":
    main(*(float(a) for a in sys.argv[1:2]), *(int(a) for a in sys.argv[2:3]))
