"""Soak: 5,000 requests at concurrency 16 against one worker, bounded in time; errors and worker memory.

    .venv/bin/python benchmarks/soak.py

resnet18 (toolkit image_classifier, batchSize 8) gets 5,000 JPEG requests from 16 clients (at most 20
minutes). The worker's resident memory is read from /proc after a 200-request warm-up and at the end.
Goals: 0 errors, RSS growth < 10 %.
"""

import tempfile
from pathlib import Path

from common import write_section

from archiver import properties, server  # noqa: E402
from archiver.capacity import bench
from archiver.engines import torchserve_launch  # noqa: E402
from helpers.models import package_resnet  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import image_model  # noqa: E402

REQUESTS = 5000
CONCURRENCY = 16


def worker_rss_mb(srv, model) -> float:
    status, body = server.request(f"{srv.management}/models/{model}", timeout=10)
    pid = body[0]["workers"][0]["pid"]
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main():
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    sample = image_model.build(tmp / "sample")
    store = tmp / "model-store"
    package_resnet(sample, store, config_text="batchSize: 8\nmaxBatchDelay: 20\n")
    inputs = [(image_model.sample_jpeg(seed, (640, 480)), "image/jpeg") for seed in range(32)]
    home = short_tmp("soak-")
    srv = torchserve_launch.start(properties.write_config(store, home / "config.properties"), store, home)
    try:
        url = f"{srv.inference}/predictions/resnet18"
        bench.run_load(url, inputs, CONCURRENCY, requests=200)
        before = worker_rss_mb(srv, "resnet18")
        workers_before = [
            (w["id"], w["startTime"]) for w in server.request(f"{srv.management}/models/resnet18")[1][0]["workers"]
        ]
        result = bench.run_load(url, inputs, CONCURRENCY, requests=REQUESTS, duration=None)
        after = worker_rss_mb(srv, "resnet18")
        workers_after = [
            (w["id"], w["startTime"]) for w in server.request(f"{srv.management}/models/resnet18")[1][0]["workers"]
        ]
    finally:
        server.stop(srv)
    summary = result.summary()
    growth = (after - before) / before * 100
    write_section(
        "SOAK",
        f"""
## Soak: {REQUESTS:,} requests at concurrency {CONCURRENCY}

**Whole process**: a real TorchServe under real HTTP load; RSS read from /proc.
resnet18 (toolkit `image_classifier`, batchSize 8, 1 worker), 640x480 JPEGs.

| requests | errors | seconds | req/s | p50 / p99 ms | worker RSS after warm-up → end | growth | worker restarts |
|---|---|---|---|---|---|---|---|
| {summary["requests"]:,} | {summary["errors"]} | {summary["seconds"]:.0f} | {summary["throughput_rps"]:.1f} | {summary["latency_ms"]["p50"]:.0f} / {summary["latency_ms"]["p99"]:.0f} | {before:.0f} MB → {after:.0f} MB | {growth:+.1f} % | {"none" if workers_before == workers_after else "YES"} |

Goals: 0 errors ({"met" if summary["errors"] == 0 else "missed"}), RSS growth < 10 % ({"met" if growth < 10 else "missed"}).

Reproduce: `.venv/bin/python benchmarks/soak.py`
""",
    )


if __name__ == "__main__":
    main()
