"""Why P2's served throughput stays below the raw forward pass: a py-spy profile of the worker and
the CPU each process takes, under the P2 load (dynamic padding, batchSize 8, 16 clients).

    .venv/bin/python benchmarks/p2_profile.py
"""

import tempfile
from pathlib import Path

from common import profile_tables, profile_worker, write_section
from p2_text import CONCURRENCY, SENTENCES

from archiver import mar, properties, server  # noqa: E402
from archiver.engines import torchserve_launch  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples.text_models import minilm_dir  # noqa: E402

BUCKETS = (
    ("model forward", lambda f: "forward" in f and "modeling" in f),
    ("tokenizer", lambda f: "tokeniz" in f.lower()),
    ("TorchServe protocol (read/write)", lambda f: "_retrieve" in f or "create_predict_response" in f),
)


def main():
    tmp = Path(tempfile.mkdtemp(prefix="p2p-"))
    store = tmp / "model-store"
    for name, workers in (("dynamic", 1), ("dynamic2w", 2)):
        config = tmp / f"{name}.yaml"
        config.write_text(f"minWorkers: {workers}\nmaxWorkers: {workers}\nbatchSize: 8\nmaxBatchDelay: 10\n")
        mar.package(
            mar.PackageOptions(
                model_name=name,
                handler="text_embedder",
                serialized_file=str(minilm_dir()),
                config_file=str(config),
                export_path=str(store),
            )
        )
    home = short_tmp("p2p-")
    srv = torchserve_launch.start(properties.write_config(store, home / "config.properties"), store, home)
    try:
        inputs = [(s.encode(), "text/plain") for s in SENTENCES]
        throughput, shares, cores = profile_worker(srv, "dynamic", inputs, CONCURRENCY, BUCKETS)
        throughput2, shares2, cores2 = profile_worker(srv, "dynamic2w", inputs, CONCURRENCY, BUCKETS)
    finally:
        server.stop(srv)
    write_section(
        "P2-PROFILE",
        f"""
### Why P2 stays below the raw forward pass (profile)

**Whole process**: py-spy samples of the served worker under P2's load.
Under the P2 load ({throughput:.0f} texts/s during the profile), py-spy on the worker, and the CPU each
process takes:

{profile_tables(shares, cores)}

The worker spends most of its time in the model's forward pass, on 2 intra-op threads. With 2
workers of 1 intra-op thread each ({throughput2:.0f} texts/s during the profile; py-spy on one of them,
the CPU of both together):

{profile_tables(shares2, cores2)}

the processes take about the same cores as with one worker (compare the process tables), and the
workers do far more with them. MiniLM's matrices for a batch of 8 short sentences are small: split
across 2 threads, each of the model's many small operations pays for the split and the join about
what it saves, while 2 single-threaded workers each run whole batches with no such cost (and one
tokenises or waits on the frontend while the other computes). So the served figure reaches the raw
forward pass's (P2 above), which runs on torch's default 2 threads.

Reproduce: `.venv/bin/python benchmarks/p2_profile.py`
""",
    )


if __name__ == "__main__":
    main()
