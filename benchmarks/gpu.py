"""GPU: workers placed as TorchServe 0.12 places them, answers as on the CPU, and served throughput on one card.

    .venv/bin/python benchmarks/gpu.py [--out DIR] [--seconds 15] [--clients 32]

Meant for a machine with an NVIDIA GPU (issue #41's figures; a lent device machine runs it as one bounded
script): every step has a time bound and writes what it found to OUT/gpu.json as it goes, so a run cut short
still reports. On a machine without a GPU it runs the same steps on the CPU and says so (what CI can check).

1. **The card**: nvidia-smi's name, memory and driver; what torch sees.
2. **Raw forward rate**: resnet18 (torchvision, random weights, seeded) in fp32 at batch 8 and 32, and the small
   BERT classifier at batch 8 (samples/text_models.py, where its tokenizer's package is installed).
3. **The store**: resnet18 packaged with the toolkit's image_classifier (batchSize 8, maxBatchDelay 5, one
   worker), config.properties with ``number_of_gpu=1``.
4. **Placement**: TorchServe 0.12 (where Java is) and the tsctl engine on that store; each worker's ``gpu`` and
   ``gpuUsage`` from describe, which must be the same on both.
5. **Answers**: the engine's answers to the photos against the archive run on the CPU (LocalModel): within the
   golden tolerance (handlers/golden.py DEFAULT_ATOL).
6. **Throughput**: ``--clients`` clients for ``--seconds`` after a warm-up, 1280x960 JPEG photos, TorchServe and
   the engine (one worker, then four on the GPU) alternating: requests/s and p99.

BENCHMARKS.md's GPU table is written from OUT/gpu.json by hand, naming the card.
"""

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, machine
from p1_image import photo

from archiver import engines, mar, properties, server  # noqa: E402
from archiver.capacity import bench
from archiver.engines import torchserve_launch  # noqa: E402
from handlers import golden as golden_format  # noqa: E402
from helpers.engine import Engine  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import image_model  # noqa: E402
from serving import gpus  # noqa: E402
from serving.local_model import LocalModel, RequestInput  # noqa: E402

CONFIG = "minWorkers: {workers}\nmaxWorkers: {workers}\nbatchSize: 8\nmaxBatchDelay: 5\nresponseTimeout: 120\n"


class Report:
    """OUT/gpu.json, written again after every step."""

    def __init__(self, out: Path):
        self.path, self.data = out / "gpu.json", {"machine": machine(), "steps": {}}
        out.mkdir(parents=True, exist_ok=True)

    def step(self, name: str, value):
        self.data["steps"][name] = value
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")
        print(f"{name}: {json.dumps(value)[:600]}", flush=True)


def the_card() -> dict:
    import torch

    smi = shutil.which("nvidia-smi")
    listed = (
        subprocess.run(
            [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
        if smi
        else None
    )
    return {
        "nvidia_smi": listed,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "torch_sees": torch.cuda.device_count(),
        "counted": gpus.count_gpus(),
        "names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }


def raw_rates(sample: Path) -> dict:
    """Images (or texts) a second through the model alone, on the GPU when there is one."""
    import torch
    import torchvision

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model = torchvision.models.resnet18()
    model.load_state_dict(torch.load(sample / "resnet18.pt", weights_only=True))
    model = model.eval().to(device)
    rates = {}
    for batch in (8, 32):
        x = torch.randn(batch, 3, 224, 224, device=device)
        rates[f"resnet18_fp32_batch{batch}"] = round(timed(lambda: model(x), device) * batch, 1)
    return {"device": str(device), **rates}


def timed(call, device, seconds: float = 5.0) -> float:
    """Calls a second of ``call()`` under inference_mode, after a warm-up, synchronizing a GPU."""
    import torch

    with torch.inference_mode():
        for _ in range(5):
            call()
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            call()
            done += 1
            if device.type == "cuda":
                torch.cuda.synchronize()
    return done / (time.perf_counter() - started)


def make_store(tmp: Path, workers: int) -> Path:
    sample = image_model.build(tmp / "sample")
    (tmp / "model-config.yaml").write_text(CONFIG.format(workers=workers))
    store = tmp / "model-store"
    mar.package(
        mar.PackageOptions(
            model_name="resnet18",
            handler="image_classifier",
            serialized_file=str(sample / "resnet18.pt"),
            model_file=str(sample / "model.py"),
            extra_files=[str(sample / "index_to_name.json")],
            config_file=str(tmp / "model-config.yaml"),
            export_path=str(store),
            force=True,
        )
    )
    properties.write_config(store, tmp / "config" / "config.properties", extra={"number_of_gpu": "1"})
    return store


def described_workers(management: str, headers: dict) -> list:
    status, body = server.request(f"{management}/models/resnet18", headers=headers, timeout=30)
    return [{"gpu": w["gpu"], "gpuUsage": w["gpuUsage"]} for w in body[0]["workers"]] if status == 200 else body


def load(url: str, photos, clients: int, seconds: float, headers=None) -> dict:
    bench.run_load(url, photos, clients, requests=2 * clients, headers=headers)  # warm-up
    result = bench.run_load(url, photos, clients, duration=seconds, headers=headers).summary()
    return {
        "rps": round(result["throughput_rps"], 1),
        "p99_ms": result["latency_ms"]["p99"],
        "errors": result["errors"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "data" / "gpu"))
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    report = Report(Path(args.out))
    report.step("card", the_card())
    tmp = short_tmp("gpu-bench-")
    store = make_store(tmp, 1)
    report.step("raw", raw_rates(tmp / "sample"))
    photos = [(photo(seed), "image/jpeg") for seed in range(8)]
    with LocalModel(store / "resnet18.mar", gpu=None) as cpu:
        wanted = [r.json() for r in cpu.predict([RequestInput(p, {"Content-Type": t}) for p, t in photos])]
    config = tmp / "config" / "config.properties"
    sides = {}
    if shutil.which("java"):
        ts = torchserve_launch.start(config, store, short_tmp("gpu-ts-"), timeout=600)
        try:
            report.step("torchserve_workers", described_workers(ts.management, ts.headers("management")))
            sides["torchserve"] = load(engines.predict_url(ts, "resnet18"), photos, args.clients, args.seconds)
        finally:
            server.stop(ts)
    engine = Engine(tmp, timeout=600).wait_ready()
    try:
        report.step("workers", described_workers(engine.url, engine.headers("management")))
        answers = [engine.post("/predictions/resnet18", p, t, 120)[1] for p, t in photos]
        moved = max(abs(a[k] - w[k]) for a, w in zip(answers, wanted) for k in w)
        report.step(
            "answers",
            {
                "largest_difference": moved,
                "atol": golden_format.DEFAULT_ATOL,
                "same_classes": all(a.keys() == w.keys() for a, w in zip(answers, wanted)),
            },
        )
        sides["engine_1_worker"] = load(f"{engine.url}/predictions/resnet18", photos, args.clients, args.seconds)
    finally:
        engine.stop()
    report.step("served", sides)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
