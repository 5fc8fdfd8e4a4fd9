"""The same archives on TorchServe and on the tsctl engine (``tsctl serve --engine tsctl``; KServe's Python
ModelServer before issue #20).

    .venv/bin/python benchmarks/kserve_engine.py

One model store: resnet18 (eager, 640x480 JPEGs) and all-MiniLM-L6-v2 (sentences), batchSize 8,
maxBatchDelay 20 ms, one worker (TorchServe) or one thread per model (KServe engine). Both servers
run at once, idle while the other is measured; each side gets 160 requests from 16 clients after a
warm-up, alternating, three rounds. Also: seconds from start to every model ready.
"""

import shutil
import tempfile
import time
from pathlib import Path

from common import alternate, median, served_side, write_section

from archiver import engines, properties, server  # noqa: E402
from archiver.engines import torchserve_launch  # noqa: E402
from helpers.models import package_resnet, package_text  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import image_model, text_models  # noqa: E402

CONFIG = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 8\nmaxBatchDelay: 20\nresponseTimeout: 120\n"
REQUESTS = 160
CONCURRENCY = 16
SENTENCES = [
    b"A man is playing a guitar on stage in front of a large crowd.",
    b"The new movie is awesome, I loved every minute of it.",
    b"Stock markets fell sharply after the central bank raised interest rates again.",
    b"short",
]


def main():
    tmp = Path(tempfile.mkdtemp())
    store = tmp / "model-store"
    package_resnet(image_model.build(tmp / "image"), store, config_text=CONFIG)
    package_text(text_models.build(tmp / "text"), store, "minilm", "text_embedder", "minilm", CONFIG)
    inputs = {
        "resnet18": [(image_model.sample_jpeg(seed, (640, 480)), "image/jpeg") for seed in range(8)],
        "minilm": [(text, "text/plain") for text in SENTENCES],
    }
    home = short_tmp("bt-")
    started = time.monotonic()
    ts_server = torchserve_launch.start(properties.write_config(store, home / "config.properties"), store, home)
    ready = {"TorchServe": time.monotonic() - started}
    started = time.monotonic()
    kserve = engines.ENGINES["tsctl"].start(store, home=short_tmp("bk-"))
    ready["KServe engine"] = time.monotonic() - started
    try:
        servers = {"TorchServe": ts_server, "KServe engine": kserve}
        sides = {
            (engine, model): served_side(srv, model, inputs[model], CONCURRENCY, REQUESTS)
            for model in inputs
            for engine, srv in servers.items()
        }
        results = alternate(sides)
    finally:
        server.stop(ts_server)
        server.stop(kserve)
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [
        "| model | engine | req/s (median of 3) | p50 ms | p99 ms | vs TorchServe |",
        "|---|---|---|---|---|---|",
    ]
    for model in inputs:
        base = median(results[("TorchServe", model)])
        for engine in servers:
            side = sides[(engine, model)]
            rps = median(results[(engine, model)])
            p50 = median([lat["p50"] for lat in side.latency])
            p99 = median([lat["p99"] for lat in side.latency])
            rows.append(f"| {model} | {engine} | {rps:.1f} | {p50:.0f} | {p99:.0f} | {rps / base:.2f}x |")
    markdown = (
        "## KServe engine: the same archives on KServe's ModelServer vs TorchServe\n\n"
        "**Whole process**: both servers real, real HTTP. `benchmarks/kserve_engine.py`: one store (resnet18 on 640x480 JPEGs, all-MiniLM-L6-v2 on sentences), "
        f"batchSize 8, maxBatchDelay 20 ms; {REQUESTS} requests from {CONCURRENCY} clients per round after a "
        "warm-up, both servers up, alternating, three rounds.\n\n"
        + "\n".join(rows)
        + "\n\nStart to every model ready: "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in ready.items())
        + "."
    )
    write_section("kserve-engine", markdown)


if __name__ == "__main__":
    main()
