"""Hostile load: 64 clients for 60 s mixing good requests and attacks against one served image model.

    .venv/bin/python benchmarks/hostile_load.py [CLIENTS] [SECONDS]

resnet18 (toolkit image_classifier, batchSize 8, 1 worker) served by TorchServe from `tsctl config`;
the worker is put under a 3 GiB memory limit (a cgroup where possible, as a pod limit would). Each
client sends a good 640x480 JPEG, or with probability 0.3 an attack drawn from samples/hostile.py's
image corpus, and every answer is judged as it arrives (tests/security/test_hostile_served.py: `mixed_load`).
Goals: 0 answers outside 200/4xx (or with the wrong 4xx) for attacks, 0 errors and 0 wrong answers for
good requests, no worker restart, peak worker RSS < 2 GB.
"""

import statistics
import sys
import tempfile
from pathlib import Path

from common import write_section

from archiver import properties, server  # noqa: E402
from archiver.engines import torchserve_launch  # noqa: E402
from helpers.cgroups import MemoryLimit, peak_rss  # noqa: E402
from helpers.models import package_resnet  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from helpers.servers import workers  # noqa: E402
from samples import hostile, image_model  # noqa: E402
from security.test_hostile_served import BATCHING, GOOD_JPEG, LIMIT, PEAK_GOAL, mixed_load  # noqa: E402


def main(clients: int = 64, seconds: float = 60):
    tmp = Path(tempfile.mkdtemp(prefix="hostile-load-"))
    store = tmp / "model-store"
    package_resnet(image_model.build(tmp / "sample"), store, config_text=BATCHING)
    home = short_tmp("hostile-")
    srv = torchserve_launch.start(properties.write_config(store, home / "config.properties"), store, home)
    srv.store = store
    try:
        before = workers(srv, "resnet18")
        pid = before[0][2]
        limit = MemoryLimit(pid, LIMIT)
        cases = hostile.image_corpus(GOOD_JPEG)
        result = mixed_load(srv, "resnet18", GOOD_JPEG, "image/jpeg", cases, clients, seconds)
        restarted = workers(srv, "resnet18") != before
        peak = peak_rss(pid)
    finally:
        server.stop(srv)
    limit.release()
    latency = sorted(result["latency_ms"])
    p50 = statistics.median(latency) if latency else float("nan")
    p99 = latency[int(len(latency) * 0.99) - 1] if latency else float("nan")
    hostile_failures = [f for f in result["failures"] if not f.startswith("good request")]
    good_failures = [f for f in result["failures"] if f.startswith("good request")]
    statuses = ", ".join(f"{status}: {count:,}" for status, count in sorted(result["statuses"].items()))
    met = lambda ok: "met" if ok else "**missed**"  # noqa: E731
    for failure in result["failures"][:20]:
        print("FAILURE", failure)
    write_section(
        "HOSTILE",
        f"""
## Hostile load: {clients} clients for {seconds:.0f} s, good requests mixed with attacks

**Whole process**: a real TorchServe, its worker in a memory cgroup, under real HTTP load.
resnet18 (toolkit `image_classifier`, batchSize 8, 1 worker under a {LIMIT >> 30} GiB {limit.kind} memory limit).
Each request is a good 640x480 JPEG or, with probability 0.3, one of the {len(cases)} attacks of
`samples/hostile.py` (deep JSON, 1x9,000,000 images, header-declared 65535x65535, zip-bomb-like
PNG text, 5,000-item v1 bodies, a 60 MB JSON list, a 70 MB body, mutated files, odd-but-valid images
such as a 9000x9000 PNG, ...). Every answer is judged as it arrives.

| requests | good | attacks | wrong answers to attacks | good requests failed or wrong | worker restarts | peak worker RSS | good p50 / p99 ms |
|---|---|---|---|---|---|---|---|
| {result["good"] + result["hostile"]:,} | {result["good"]:,} | {result["hostile"]:,} | {len(hostile_failures)} | {len(good_failures)} | {"yes" if restarted else "none"} | {peak / 1e9:.2f} GB | {p50:.0f} / {p99:.0f} |

Statuses: {statuses}.

Goals: attacks answered 200-as-in-process or their own 4xx ({met(not hostile_failures)}); good requests
0 errors and 0 wrong answers ({met(not good_failures)}); no worker restart ({met(not restarted)}); peak
worker RSS < 2 GB ({met(peak < PEAK_GOAL)}). Latency of good requests includes waiting in batches with
attacks (a 9000x9000 PNG takes about half a second to decode).

Reproduce: `.venv/bin/python benchmarks/hostile_load.py` (a 16-client, 10 s version runs in `make test`).
""",
    )


if __name__ == "__main__":
    main(*(float(a) if i else int(a) for i, a in enumerate(sys.argv[1:])))
