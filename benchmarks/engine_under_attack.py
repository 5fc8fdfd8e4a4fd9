"""The tsctl engine under attack: good traffic's throughput with and without attackers, and the engine's peak memory.

    .venv/bin/python benchmarks/engine_under_attack.py [SECONDS] [ROUNDS]

One engine (``python -m handlers.engine``) in a 4 GiB memory cgroup of its own, joined at spawn (so its
bound on bodies in flight is a quarter of that group's limit), serving resnet18 (the toolkit's
``image_classifier``, batchSize 4, one worker) and ``target`` (tests/test_engine_limits.py's handler, one
worker). Good traffic: 4 clients posting a 640x480 JPEG to resnet18 for SECONDS. Each round runs it twice,
alone and beside the attackers, in alternating order (the machine is noisy: only the ratio within a round
means anything). The attackers, at once, all aimed at the engine (issue #29's reproductions):

- 24 connections each declaring a 32 MiB body and sending 16 MiB of it, reopened when refused;
- 2 clients sending gRPC ``ModelInfer`` calls of 15.5 M FP32 values as typed contents;
- 2 clients asking ``target`` for a 200 MB answer (above ``max_response_size``);
- 2 clients sending JSON whose key forges a ``[METRICS]`` line, and scraping ``/metrics``;
- 40 connections trickling a request head a byte a second (slowloris).

Reported: good requests per second alone and under attack, their p99, errors among good requests (must
be 0), the engine's peak RSS (VmHWM), whether any pid changed, and the size of ``/metrics`` at the end.
"""

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import alternate, write_section
from test_engine import BIN, Engine, snapshot_entry  # noqa: E402
from test_engine_limits import HANDLER, grpc_infer, write_config  # noqa: E402

from archiver import bench  # noqa: E402
from conftest import MemoryLimit, package_resnet, peak_rss  # noqa: E402
from samples import image_model  # noqa: E402

GROUP_LIMIT = 4 << 30
FORGED = '{"\\n[METRICS]HandlerTime.ms:999999|#ModelName:resnet18,Level:Model|#hostname:forged": 1}'


def build(root: Path) -> Path:
    """model-store/ with resnet18 and ``target`` (test_engine_limits' handler), and config/config.properties."""
    store = root / "model-store"
    store.mkdir(parents=True)
    handler = root / "target.py"
    handler.write_text(HANDLER)
    command = [str(BIN / "torch-model-archiver"), "--model-name", "target", "--version", "1.0", "--handler",
               str(handler), "--export-path", str(store)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, env=dict(os.environ, TMPDIR=str(root)))
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
    """Every attack at once, each in its own threads, until ``stop()``; counts what each got."""

    def __init__(self, engine):
        self.engine, self.stopping = engine, threading.Event()
        self.counts = {}
        self.lock = threading.Lock()
        self.threads = []

    def count(self, attack: str, outcome):
        with self.lock:
            key = f"{attack}: {outcome}"
            self.counts[key] = self.counts.get(key, 0) + 1

    def start(self):
        plan = [(self.partial_upload, 24), (self.grpc_typed, 2), (self.big_answer, 2), (self.forged_metric, 2)]
        plan += [(self.slowloris, 40)]
        for attack, copies in plan:
            for _ in range(copies):
                thread = threading.Thread(target=self._loop, args=(attack,), daemon=True)
                thread.start()
                self.threads.append(thread)

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(120)

    def _loop(self, attack):
        while not self.stopping.is_set():
            try:
                attack()
            except OSError as exc:
                self.count(attack.__name__, type(exc).__name__)

    def partial_upload(self):
        with socket.create_connection(("127.0.0.1", self.engine.http), timeout=30) as sock:
            sock.sendall(b"POST /predictions/target HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (32 << 20))
            chunk = b"a" * (1 << 20)
            try:
                for _ in range(16):
                    sock.sendall(chunk)
                sock.settimeout(5)
                answer = sock.recv(64)
                self.count("partial_upload", answer[:12].decode(errors="replace") or "held")
            except OSError:
                self.count("partial_upload", "refused while sending")
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
        with socket.create_connection(("127.0.0.1", self.engine.http), timeout=60) as sock:
            try:
                for byte in b"POST /predictions/resnet18 HTTP/1.1\r\nHost: x\r\n":
                    if self.stopping.is_set():
                        return
                    sock.sendall(bytes([byte]))
                    time.sleep(1)
                self.count("slowloris", "whole head sent")
            except OSError:
                self.count("slowloris", "disconnected")


def good_traffic(engine, jpeg: bytes, seconds: float) -> dict:
    result = bench.run_load(f"{engine.url}/predictions/resnet18", [(jpeg, "image/jpeg")], 4, duration=seconds)
    summary = result.summary()
    return {"rps": round(result.throughput, 2), "p99": summary["latency_ms"]["p99"], "errors": result.errors}


def main(seconds: float = 30, rounds: int = 3):
    root = Path(tempfile.mkdtemp(prefix="under-attack-"))
    jpeg = build(root).read_bytes()
    group = MemoryLimit(None, GROUP_LIMIT)
    if group.cgroup is None:
        sys.exit("no memory cgroup can be made here")
    engine = Engine(root, preexec_fn=group.join).wait_ready()
    pids_before = {m: [w["pid"] for w in engine.workers(m)] for m in ("resnet18", "target")}
    attackers = {}
    try:
        good_traffic(engine, jpeg, 5)  # warm-up

        def alone():
            return good_traffic(engine, jpeg, seconds)

        def attacked():
            attack = Attackers(engine)
            attack.start()
            time.sleep(3)
            try:
                return good_traffic(engine, jpeg, seconds)
            finally:
                attack.stop()
                for key, value in attack.counts.items():
                    attackers[key] = attackers.get(key, 0) + value

        results = alternate({"alone": alone, "attacked": attacked}, rounds)
        peak = peak_rss(engine.process.pid)
        pids_after = {m: [w["pid"] for w in engine.workers(m)] for m in ("resnet18", "target")}
        _, metrics_text = engine.get("/metrics")
        metrics_size = len(metrics_text.encode())
        forged = "forged" in metrics_text or "999999" in metrics_text
        alive = engine.process.poll() is None
    finally:
        code = engine.stop()
        group.release()
    ratios = [a["rps"] / b["rps"] for a, b in zip(results["attacked"], results["alone"])]
    row = lambda side: " / ".join(f"{r['rps']:.1f}" for r in results[side])  # noqa: E731
    p99 = lambda side: statistics.median(r["p99"] for r in results[side])  # noqa: E731
    errors = sum(r["errors"] for side in results for r in results[side])
    outcomes = "\n".join(f"| {key} | {value:,} |" for key, value in sorted(attackers.items()))
    write_section(
        "UNDER_ATTACK",
        f"""
## The engine under attack (issue #29): good traffic beside every attack at once

`benchmarks/engine_under_attack.py`: one tsctl engine in a {GROUP_LIMIT >> 30} GiB memory cgroup (joined at
spawn), resnet18 (batchSize 4) and an attack target; 4 clients post a JPEG to resnet18 for {seconds:.0f} s,
alone and beside the attackers (24 half-sent 32 MiB uploads, 2 clients of 15.5 M-float gRPC calls, 2 asking
for 200 MB answers, 2 forging `[METRICS]` keys and scraping, 40 slowloris heads), {rounds} alternating rounds.

| | alone | under attack |
|---|---|---|
| good requests/s, each round | {row("alone")} | {row("attacked")} |
| median p99 (ms) | {p99("alone"):.0f} | {p99("attacked"):.0f} |

- Good throughput under attack / alone: **{statistics.median(ratios):.2f}x** (median of the rounds:
  {", ".join(f"{r:.2f}" for r in ratios)}); errors among good requests: **{errors}**.
- Engine peak RSS (VmHWM) over the whole run: **{peak / 2**20:,.0f} MiB**; the engine
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
