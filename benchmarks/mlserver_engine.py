"""MLServer vs the tsctl engine: one store, the same Open Inference Protocol (KServe v2) bodies, two engines.

    .venv/bin/python benchmarks/mlserver_engine.py

(k) ``tsctl serve --engine tsctl``: the tsctl engine (Starlette) in front of TorchServe's worker processes;
(m) ``tsctl serve --engine mlserver``: MLServer 1.7.1 (samples/runtime_env.py's venv, this venv's torch)
    with serving/runtimes/mlserver_runtime.py in front of the same worker processes.

Both engines run at once on the same archives; one is driven at a time. Whole-process serving over real
HTTP from 16 client threads to ``/v2/models/NAME/infer``: throughput and p50/p99 latency of 160 requests
per round after a warm-up, three alternating rounds, for resnet18 (640x480 JPEGs, base64 in a BYTES
tensor) and all-MiniLM-L6-v2 (one sentence a request). batchSize 8, maxBatchDelay 20 ms, one worker.
Goal (issue #22): (m) within 10 % of (k).
"""

import base64
import json
import shutil
import tempfile
from pathlib import Path

from common import alternate, median, served_side, write_section
from p5_kserve_path import CONCURRENCY, CONFIG, REQUESTS, SENTENCES  # P5's bodies and settings

from archiver import engines  # noqa: E402
from helpers.models import package_resnet, package_text  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import image_model, runtime_env, text_models  # noqa: E402

SIDES = {"(k) --engine tsctl": "tsctl", "(m) --engine mlserver": "mlserver"}


def bodies(model: str):
    if model == "resnet18":
        items = [base64.b64encode(image_model.sample_jpeg(seed, (640, 480))).decode() for seed in range(8)]
    else:
        items = SENTENCES
    tensor = {"name": "input-0", "shape": [1], "datatype": "BYTES"}
    return [(json.dumps({"inputs": [{**tensor, "data": [item]}]}).encode(), "application/json") for item in items]


def main():
    tmp = Path(tempfile.mkdtemp())
    store = tmp / "model-store"
    package_resnet(image_model.build(tmp / "image"), store, config_text=CONFIG)
    package_text(text_models.build(tmp / "text"), store, "minilm", "text_embedder", "minilm", CONFIG)
    python = str(runtime_env.ensure_mlserver())
    running = {}
    try:
        running["tsctl"] = engines.ENGINES["tsctl"].start(store, home=short_tmp("bk-"), timeout=300)
        running["mlserver"] = engines.ENGINES["mlserver"].start(
            store, home=short_tmp("bm-"), timeout=300, python=python
        )
        sections = []
        for model in ("resnet18", "minilm"):
            sides = {
                label: served_side(running[key], model, bodies(model), CONCURRENCY, REQUESTS)
                for label, key in SIDES.items()
            }
            times = alternate(sides)
            k, m = (median(times[label]) for label in SIDES)
            rows = "\n".join(
                f"| {label} | {median(times[label]):.1f} | {times[label]} | "
                f"{sides[label].latency[-1]['p50']:.0f} / {sides[label].latency[-1]['p99']:.0f} |"
                for label in SIDES
            )
            verdict = "met" if m >= 0.9 * k else "missed"
            sections.append(
                f"""
### {model}

| engine | requests/s (median) | rounds | p50 / p99 ms (last round) |
|---|---|---|---|
{rows}

- (m) / (k): **{m / k:.2f}x** (goal >= 0.9: {verdict})
"""
            )
        write_section(
            "MLSERVER",
            "## MLServer engine vs the tsctl engine (issue #22)\n\n"
            + __doc__.split("\n\n", 2)[2].strip()
            + "\n"
            + "".join(sections)
            + WHY
            + "\nReproduce: `.venv/bin/python benchmarks/mlserver_engine.py`",
        )
    finally:
        for key, srv in running.items():
            engines.ENGINES[key].stop(srv)
            shutil.rmtree(srv.home, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


WHY = """
Where the difference comes from: both engines drive the same TorchServe worker over the same socket
protocol; per request MLServer also parses the body into pydantic objects, the runtime writes them back
to the v2 JSON the handler reads (``request_body``), and the handler's answer is parsed into MLServer's
response and encoded again. For resnet18 the forward pass dominates; for MiniLM those steps are a
larger share of each request.
"""

if __name__ == "__main__":
    main()
