"""Why P2's served throughput stays below the raw forward pass: a py-spy profile of the worker and
the CPU each process takes, under the P2 load (dynamic padding, batchSize 8, 16 clients).

    .venv/bin/python benchmarks/p2_profile.py
"""

import collections
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import write_section
from p2_text import CONCURRENCY, SENTENCES

from archiver import bench, mar, properties, server  # noqa: E402
from conftest import short_tmp  # noqa: E402
from samples.text_models import minilm_dir  # noqa: E402

SECONDS = 10
BUCKETS = (
    ("model forward", lambda f: "forward" in f and "modeling" in f),
    ("tokenizer", lambda f: "tokeniz" in f.lower()),
    ("TorchServe protocol (read/write)", lambda f: "_retrieve" in f or "create_predict_response" in f),
)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def group_members(pgid: int):
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def main():
    tmp = Path(tempfile.mkdtemp(prefix="p2p-"))
    store = tmp / "model-store"
    (tmp / "dynamic.yaml").write_text("minWorkers: 1\nmaxWorkers: 1\nbatchSize: 8\nmaxBatchDelay: 10\n")
    mar.package(
        mar.PackageOptions(
            model_name="dynamic",
            handler="text_embedder",
            serialized_file=str(minilm_dir()),
            config_file=str(tmp / "dynamic.yaml"),
            export_path=str(store),
        )
    )
    home = short_tmp("p2p-")
    srv = server.start(properties.write_config(store, home / "config.properties"), store, home)
    try:
        inputs = [(s.encode(), "text/plain") for s in SENTENCES]
        url = f"{srv.inference}/predictions/dynamic"
        bench.run_load(url, inputs, CONCURRENCY, requests=64)
        worker = server.request(f"{srv.management}/models/dynamic")[1][0]["workers"][0]["pid"]
        java = [p for p in group_members(srv.pid) if b"java" in Path(f"/proc/{p}/cmdline").read_bytes()]
        processes = {"worker (Python)": [worker], "frontend (Java)": java, "load generator": [os.getpid()]}
        before = {name: sum(cpu_seconds(p) for p in pids) for name, pids in processes.items()}
        started = time.monotonic()
        result = {}
        load = threading.Thread(
            target=lambda: result.update(bench.run_load(url, inputs, CONCURRENCY, duration=SECONDS + 2).summary())
        )
        load.start()
        time.sleep(1)
        subprocess.run(
            [
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "-p",
                str(worker),
                "-d",
                str(SECONDS),
                "-f",
                "raw",
                "-o",
                str(tmp / "worker.txt"),
                "--nonblocking",
            ],
            check=True,
            capture_output=True,
        )
        load.join()
        wall = time.monotonic() - started
        cores = {name: (sum(cpu_seconds(p) for p in pids) - before[name]) / wall for name, pids in processes.items()}
    finally:
        server.stop(srv)
    samples, total = collections.Counter(), 0
    for line in (tmp / "worker.txt").read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        total += int(count)
        frames = stack.split(";")
        bucket = next((name for name, match in BUCKETS if any(match(f) for f in frames)), "other")
        samples[bucket] += int(count)
    rows = "\n".join(f"| {name} | {samples[name] / total * 100:.1f} % |" for name, _ in BUCKETS + (("other", None),))
    cpu_rows = "\n".join(f"| {name} | {value:.2f} |" for name, value in cores.items())
    write_section(
        "P2-PROFILE",
        f"""
### Why P2 stays below the raw forward pass (profile)

Under the P2 load ({result["throughput_rps"]:.0f} texts/s during the profile), py-spy on the worker:

| where the worker's CPU samples are | share |
|---|---|
{rows}

and the CPU each process takes (cores, of {os.cpu_count()}):

| process | cores |
|---|---|
{cpu_rows}

The worker spends most of its time in the model's forward pass already; what it lacks is cores. The
raw-forward limit runs on the whole machine, while served, TorchServe's Java frontend (and the load
generator) take their share of the same 2 cores. With cores to spare for the frontend, the served
figure approaches the limit; on this machine the goal of 0.85x is not reachable by the handler.

Reproduce: `.venv/bin/python benchmarks/p2_profile.py`
""",
    )


if __name__ == "__main__":
    main()
