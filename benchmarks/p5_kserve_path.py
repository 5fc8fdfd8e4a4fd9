"""P5: the KServe data path. One archive, the same KServe v1 request bodies, three ways in:

    .venv/bin/python benchmarks/p5_kserve_path.py

(a) TorchServe direct: TorchServe with ``TS_SERVICE_ENVELOPE=kserve`` answers
    ``/v1/models/NAME:predict`` itself;
(b) through pytorch/serve's kserve_wrapper (``../shared/kserve/wrapper``, kserve 0.13 in the
    torchserve-kfs:0.9.0 runtime venv) in front of that same TorchServe, as KServe's ``pytorch``
    runtime deploys it;
(c) ``tsctl serve --engine tsctl``: KServe's ModelServer running the archive's handler itself.

TorchServe (a, b) is this venv's 0.12.0 with this venv's torch, as is (c): only the path differs.
Every figure is whole-process serving over real HTTP from 16 client threads: throughput and
p50/p99 latency of 160 requests per round after a warm-up, three alternating rounds, for resnet18
(640x480 JPEGs, base64 in ``{"instances": [{"data": ...}]}``) and all-MiniLM-L6-v2 (sentences).
batchSize 8, maxBatchDelay 20 ms, one worker (TorchServe) or one model thread (engine).
Goal: (c) >= (a) and (c) >= 2x (b).
"""

import base64
import contextlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

from common import alternate, median, write_section

from archiver import engines, server  # noqa: E402
from archiver.capacity import bench
from helpers.kserve_wrapper import KFS, WRAPPER, start_stack, stop_stack  # noqa: E402
from helpers.models import export_tree, package_resnet, package_text  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import image_model, kserve_wrapper_launcher, runtime_env, text_models  # noqa: E402

CONFIG = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 8\nmaxBatchDelay: 20\nresponseTimeout: 120\n"
REQUESTS = 160
CONCURRENCY = 16
SENTENCES = [
    "A man is playing a guitar on stage in front of a large crowd.",
    "The new movie is awesome, I loved every minute of it.",
    "Stock markets fell sharply after the central bank raised interest rates again.",
    "short",
]
WHY = """
Why the goals are missed where they are: for resnet18 the forward pass dominates every path, so the
wrapper costs TorchServe only a few per cent and no path can be twice another. For MiniLM the wrapper's
second Python HTTP hop costs TorchServe a third of its rate; the engine needs no hop and drives the same
TorchServe worker from a lighter frontend. (The P5 profile below was taken with the engine before #20.)
"""
PATHS = {"(a) TorchServe direct": "ts", "(b) kserve_wrapper -> TorchServe": "wrapper", "(c) --engine tsctl": "engine"}


def bodies(model: str):
    if model == "resnet18":
        items = [{"data": base64.b64encode(image_model.sample_jpeg(seed, (640, 480))).decode()} for seed in range(8)]
    else:
        items = SENTENCES
    return [(json.dumps({"instances": [item]}).encode(), "application/json") for item in items]


def side(base_url: str, model: str, latencies: list):
    url = f"{base_url}/v1/models/{model}:predict"
    inputs = bodies(model)

    def run():
        bench.run_load(url, inputs, CONCURRENCY, requests=32)
        result = bench.run_load(url, inputs, CONCURRENCY, requests=REQUESTS)
        assert result.errors == 0, result.statuses
        latencies.append(result.summary()["latency_ms"])
        return round(result.throughput, 2)

    return run


@contextlib.contextmanager
def three_paths():
    """resnet18, sentiment and MiniLM packaged, exported for torchserve-kfs:0.9.0 and served every
    way: yields (the kserve_wrapper stack in front of TorchServe, the KServe engine)."""
    tmp = Path(tempfile.mkdtemp())
    root = tmp / "tree"
    store = root / "model-store"
    store.mkdir(parents=True)
    package_resnet(image_model.build(tmp / "image"), store, config_text=CONFIG)
    samples = text_models.build(tmp / "text")
    package_text(samples, store, "sentiment", "text_classifier", "classifier", CONFIG)
    package_text(samples, store, "minilm", "text_embedder", "minilm", CONFIG)
    exported = export_tree(root, runtime=KFS)
    kfs_python = runtime_env.ensure(KFS)
    protos = kserve_wrapper_launcher.generate_protos(str(kfs_python), WRAPPER / "proto", tmp / "protos")
    stack = start_stack(exported, protos, kfs_python, sys.executable, "v1")
    engine = None
    try:
        engine = engines.ENGINES["tsctl"].start(exported / "model-store", home=short_tmp("p5-"), timeout=300)
        yield stack, engine
    finally:
        if engine is not None:
            server.stop(engine)
            shutil.rmtree(engine.home, ignore_errors=True)
        stop_stack(stack)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    with three_paths() as (stack, engine):
        urls = {"ts": stack.torchserve.inference, "wrapper": stack.url, "engine": engine.inference}
        sections = []
        for model in ("resnet18", "minilm"):
            latencies = {label: [] for label in PATHS}
            times = alternate({label: side(urls[key], model, latencies[label]) for label, key in PATHS.items()})
            a, b, c = (median(times[label]) for label in PATHS)
            rows = "\n".join(
                f"| {label} | {median(times[label]):.1f} | {times[label]} | "
                f"{latencies[label][-1]['p50']:.0f} / {latencies[label][-1]['p99']:.0f} |"
                for label in PATHS
            )
            sections.append(
                f"""
### {model}

| path | requests/s (median) | rounds | p50 / p99 ms (last round) |
|---|---|---|---|
{rows}

- (c) / (a): **{c / a:.2f}x** (goal >= 1: {"met" if c >= a else "missed"})
- (c) / (b): **{c / b:.2f}x** (goal >= 2x: {"met" if c >= 2 * b else "missed"}); (a) / (b): {a / b:.2f}x
"""
            )
        write_section(
            "P5",
            "## P5 the KServe path: TorchServe direct, through kserve_wrapper, and `--engine tsctl`\n\n"
            + __doc__.split("\n\n", 2)[2].strip()
            + "\n"
            + "".join(sections)
            + WHY
            + "\nReproduce: `.venv/bin/python benchmarks/p5_kserve_path.py`",
        )


if __name__ == "__main__":
    main()
