"""Batch memory under load: 8 clients sending the largest bodies a tensor model admits, 8 sending good
ones, for 60 s, to TorchServe with the worker under a 3 GiB memory limit.

    .venv/bin/python benchmarks/batch_memory.py [SECONDS]

A `tensor` archive (a Linear(4, 2), batchSize 8, maxBatchDelay 100 ms, 1 worker) served by
TorchServe from `tsctl config`. Attackers send KServe v1 JSON bodies of 15,000,000 numbers (30 MB
each, inside max_body_bytes 64 MiB and max_json_values 16,777,216: before #21, 8 of them in one batch
were 3.8 GB of Python floats and the worker was OOM-killed); good clients send one row of 4 numbers.
Goals: 0 worker deaths, every good request 200, attackers answered 4xx/503 (never 5xx other than
503), peak worker RSS under the limit; the good requests' p50/p99 are recorded.
"""

import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import torch
from common import write_section

from archiver import properties, server  # noqa: E402
from archiver.engines import torchserve_launch  # noqa: E402
from helpers.cgroups import MemoryLimit, peak_rss  # noqa: E402
from helpers.hostile import build, scripted  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from helpers.servers import workers  # noqa: E402

LIMIT = 3 << 30
BATCHING = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 8\nmaxBatchDelay: 100\nresponseTimeout: 120\n"
ATTACK = b'{"instances": [[' + b"1," * (15_000_000 - 1) + b"1]]}"
GOOD = b'{"instances": [[1.0, 2.0, 3.0, 4.0]]}'


def main(seconds: float = 60):
    tmp = Path(tempfile.mkdtemp(prefix="batch-memory-"))
    store = build(tmp, "tensor", "tensor", scripted(tmp / "linear.pt", torch.nn.Linear(4, 2)), BATCHING).parent
    home = short_tmp("batchmem-")
    srv = torchserve_launch.start(properties.write_config(store, home / "config.properties"), store, home)
    url = f"{srv.inference}/predictions/tensor"
    statuses, good_ms, failures = Counter(), [], []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(body: bytes, good: bool):
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                status, answer = server.request(url, body, "POST", {"Content-Type": "application/json"}, 180)
            except OSError as exc:
                status, answer = f"error {type(exc).__name__}", None
            with lock:
                statuses[("good" if good else "attack", status)] += 1
                if good:
                    good_ms.append((time.perf_counter() - started) * 1000)
                    if status != 200:
                        failures.append(f"good request: {status} {str(answer)[:200]}")
                elif not (isinstance(status, int) and (400 <= status < 500 or status == 503)):
                    failures.append(f"attack: {status} {str(answer)[:200]}")

    try:
        before = workers(srv, "tensor")
        pid = before[0][2]
        limit = MemoryLimit(pid, LIMIT)
        threads = [threading.Thread(target=client, args=(ATTACK, False)) for _ in range(8)]
        threads += [threading.Thread(target=client, args=(GOOD, True)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        after = workers(srv, "tensor")
        peak = peak_rss(pid)
    finally:
        server.stop(srv)
    limit.release()
    deaths = 0 if after == before else 1
    good_ms.sort()
    p50 = statistics.median(good_ms) if good_ms else float("nan")
    p99 = good_ms[max(0, int(len(good_ms) * 0.99) - 1)] if good_ms else float("nan")
    shown = ", ".join(f"{who} {status}: {count:,}" for (who, status), count in sorted(statuses.items(), key=str))
    met = lambda ok: "met" if ok else "**missed**"  # noqa: E731
    for failure in failures[:20]:
        print("FAILURE", failure)
    write_section(
        "BATCH_MEMORY",
        f"""
## Batch memory: 8 clients sending the largest admitted bodies, 8 sending good ones, {seconds:.0f} s

**Whole process**: a real TorchServe; its worker under a {LIMIT >> 30} GiB {limit.kind} memory limit. A `tensor`
archive (batchSize 8, maxBatchDelay 100 ms, 1 worker). Attack: KServe v1 JSON of 15,000,000 numbers (30 MB,
inside the tensor handler's max_body_bytes and max_json_values); before #21, eight of them in one batch
were parsed whole into 3.8 GB of Python floats and the worker was OOM-killed.

| worker deaths | good requests | good failed | good p50 / p99 ms | attacks answered | peak worker RSS |
|---|---|---|---|---|---|
| {deaths} | {len(good_ms):,} | {sum(1 for f in failures if f.startswith("good"))} | {p50:.0f} / {p99:.0f} | {sum(c for (w, _), c in statuses.items() if w == "attack"):,} | {peak / 1e9:.2f} GB |

Statuses: {shown}.

Goals: no worker death ({met(deaths == 0)}); every good request 200 ({met(not any(f.startswith("good") for f in failures))});
attacks answered with their own 4xx or 503 ({met(not any(f.startswith("attack") for f in failures))});
peak RSS under the limit ({met(peak < LIMIT)}). Good requests share batches with attacks, so their
latency includes reading up to `handler.max_batch_bytes` of attack bodies.

Reproduce: `.venv/bin/python benchmarks/batch_memory.py` (`tests/security/test_batch_budget.py` runs the batch in-process).
""",
    )


if __name__ == "__main__":
    main(*(float(a) for a in sys.argv[1:]))
