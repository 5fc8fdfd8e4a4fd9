"""P1: the toolkit image handler vs TorchServe's built-in image_classifier, and the in-process limit.

    .venv/bin/python benchmarks/p1_image.py

One TorchServe serves the same TorchScript resnet18 twice: packaged by tsctl with the toolkit handler,
and by torch-model-archiver with the built-in handler; 1 worker each, batchSize 8, maxBatchDelay 20.
Both get the same load (1280x960 JPEG photos, 16 concurrent clients), alternating, three rounds.
The limit is the toolkit handler run in-process on batches of 8 (decode + preprocess + model, no
server). A fifth side serves the toolkit archive with 2 workers of 1 intra-op thread each (the
handler's default for minWorkers 2): one worker decodes while the other runs its forward pass.
Goals (issue 13): >= 2x the built-in and >= 1.2x the sequential in-process limit. Top-1 agreement of the fast JPEG path with
the exact path is measured on the same photos. A fourth side serves the sample resnet18 exported to
ONNX (samples/onnx_export.py) with the same toolkit handler and config, run by ONNX Runtime.
"""

import io
import tempfile
import time
from pathlib import Path

import numpy as np
from common import alternate, bar_plot, median, served_side, write_section
from PIL import Image

from archiver import mar, properties, server  # noqa: E402
from archiver.engines import torchserve_launch  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import image_model, onnx_export  # noqa: E402
from serving.local_model import LocalModel  # noqa: E402

# The toolkit side opts into draft JPEG decoding (off by default: answers then equal the built-in's);
# the built-in handler ignores the handler: section.
CONFIG = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 8\nmaxBatchDelay: 20\nresponseTimeout: 120\nhandler:\n  jpeg_draft: true\n"
TWO_WORKERS = CONFIG.replace("minWorkers: 1\nmaxWorkers: 1", "minWorkers: 2\nmaxWorkers: 2")
REQUESTS = 160
CONCURRENCY = 16


def photo(seed: int, size=(1280, 960)) -> bytes:
    """A photo-like JPEG: shapes plus sensor-like noise (so it compresses like a photo, ~440 kB)."""
    base = np.array(Image.open(io.BytesIO(image_model.sample_jpeg(seed, size))))
    noisy = np.clip(base + np.random.default_rng(seed).normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(noisy).save(out, "JPEG", quality=90)
    return out.getvalue()


def toolkit_store(tmp: Path):
    """model-store/toolkit.mar: the TorchScript resnet18 with the toolkit handler and P1's config."""
    sample = image_model.build(tmp / "sample")
    torchscript = image_model.torchscript_resnet18(tmp / "resnet18.pt")
    (tmp / "model-config.yaml").write_text(CONFIG)
    store = tmp / "model-store"
    package_toolkit("toolkit", torchscript, sample, tmp, store)
    return store, sample, torchscript


def package_toolkit(name: str, serialized: Path, sample: Path, tmp: Path, store: Path):
    mar.package(
        mar.PackageOptions(
            model_name=name,
            handler="image_classifier",
            serialized_file=str(serialized),
            extra_files=[str(sample / "index_to_name.json")],
            config_file=str(tmp / "model-config.yaml"),
            export_path=str(store),
        )
    )


def main():
    tmp = Path(tempfile.mkdtemp(prefix="p1-"))
    store, sample, torchscript = toolkit_store(tmp)
    image_model.package_builtin(
        torchscript, store, "builtin", tmp / "model-config.yaml", [sample / "index_to_name.json"]
    )
    onnx_file = tmp / "resnet18.onnx"  # the same architecture, exported to ONNX, run by ONNX Runtime
    onnx_export.export_image(sample, onnx_file)
    package_toolkit("onnx", onnx_file, sample, tmp, store)
    (tmp / "two").mkdir()
    (tmp / "two" / "model-config.yaml").write_text(TWO_WORKERS)
    package_toolkit("toolkit2w", torchscript, sample, tmp / "two", store)
    photos = [photo(seed) for seed in range(16)]
    inputs = [(p, "image/jpeg") for p in photos]

    local = LocalModel(store / "toolkit.mar", batch_size=8)
    exact_config = tmp / "exact"
    exact_config.mkdir()

    def limit():
        local.predict(photos[:8])  # warm
        start = time.perf_counter()
        batches = REQUESTS // 8
        for i in range(batches):
            responses = local.predict(photos[(i % 2) * 8 : (i % 2) * 8 + 8])
            assert all(r.status == 200 for r in responses)
        return round(batches * 8 / (time.perf_counter() - start), 2)

    home = short_tmp("p1-")
    srv = torchserve_launch.start(properties.write_config(store, home / "config.properties"), store, home)
    try:
        toolkit = served_side(srv, "toolkit", inputs, CONCURRENCY, REQUESTS)
        builtin = served_side(srv, "builtin", inputs, CONCURRENCY, REQUESTS)
        onnx = served_side(srv, "onnx", inputs, CONCURRENCY, REQUESTS)
        two = served_side(srv, "toolkit2w", inputs, CONCURRENCY, REQUESTS)
        results = alternate(
            {
                "toolkit": toolkit,
                "built-in": builtin,
                "toolkit, ONNX Runtime": onnx,
                "toolkit, 2 workers": two,
                "in-process limit": limit,
            }
        )
    finally:
        server.stop(srv)

    # fast JPEG path vs the exact path, on the same photos
    handler = local.handler
    fast = [r.json() for r in local.predict(photos)]
    handler.settings.jpeg_draft = False
    exact = [r.json() for r in local.predict(photos)]
    local.close()
    agree = sum(next(iter(a)) == next(iter(b)) for a, b in zip(fast, exact))
    drift = max(abs(a[k] - b.get(k, 0.0)) for a, b in zip(fast, exact) for k in a)

    t, b, lim = (median(results[k]) for k in ("toolkit", "built-in", "in-process limit"))
    ort = median(results["toolkit, ONNX Runtime"])
    t2 = median(results["toolkit, 2 workers"])
    lat_2 = two.latency[-1]
    best = max(t, t2)
    lat_o = onnx.latency[-1]
    lat_t = toolkit.latency[-1]
    lat_b = builtin.latency[-1]
    plot = bar_plot(
        "p1_image",
        "P1: resnet18, 1280x960 JPEGs (images/s)",
        ["toolkit", "2 workers", "built-in", "ONNX RT", "limit"],
        [t, t2, b, ort, lim],
        "images / s",
    )
    write_section(
        "P1",
        f"""
## P1 image: toolkit handler vs TorchServe's built-in `image_classifier`

Served, **whole process** (a real TorchServe, real HTTP): the same TorchScript resnet18, 1 worker, batchSize 8, maxBatchDelay 20 ms, {CONCURRENCY} concurrent clients,
{REQUESTS} requests of 1280x960 JPEG photos (~{len(photos[0]) // 1000} kB) per round, three alternating rounds.

| | images/s (median) | rounds | p50 / p99 ms (last round) |
|---|---|---|---|
| toolkit `image_classifier` | {t:.1f} | {results["toolkit"]} | {lat_t["p50"]:.0f} / {lat_t["p99"]:.0f} |
| TorchServe built-in `image_classifier` | {b:.1f} | {results["built-in"]} | {lat_b["p50"]:.0f} / {lat_b["p99"]:.0f} |
| toolkit `image_classifier`, 2 workers x 1 intra-op thread | {t2:.1f} | {results["toolkit, 2 workers"]} | {lat_2["p50"]:.0f} / {lat_2["p99"]:.0f} |
| toolkit `image_classifier`, the model in ONNX Runtime | {ort:.1f} | {results["toolkit, ONNX Runtime"]} | {lat_o["p50"]:.0f} / {lat_o["p99"]:.0f} |
| in-process limit (**in-process**: decode + preprocess + model in sequence, batch 8) | {lim:.1f} | {results["in-process limit"]} | |

- toolkit (1 worker) / built-in: {t / b:.2f}x; 2 workers / 1 worker: {t2 / t:.2f}x
- best toolkit / built-in: **{best / b:.2f}x** (goal >= 2x: {"met" if best / b >= 2 else "missed"})
- best toolkit / sequential in-process limit: **{best / lim:.2f}x** (goal >= 1.2x: {"met" if best / lim >= 1.2 else "missed"})
- ONNX Runtime / TorchScript, same handler: **{ort / t:.2f}x** (whole process, served; the ONNX graph is the
  eager model exported by `samples/onnx_export.py`, the TorchScript one frozen and optimised)
- fast JPEG path (draft decoding) vs exact decode: top-1 agrees on {agree}/{len(photos)} photos, largest
  probability difference {drift:.4f} (random weights: near-uniform outputs, so this is a strict test).

Where the time goes (P1 profile below): the toolkit saves what it can around the model with JPEG
draft decoding (~2x faster decode of 1280x960), decoding the batch's images on 2 threads, batched
normalisation, channels_last input and a frozen, inference-optimised TorchScript graph. What is left
is the forward pass (about two thirds of the worker's samples) and the decode that must precede it
(JPEG decode + resize, the other third, on a second thread). TorchServe hands a worker one batch at
a time, so within one worker decoding cannot overlap the previous batch's forward pass; with 2
workers of 1 intra-op thread each, one decodes while the other runs its model, which is what the
2-worker side gains. Both cores are then busy: the in-process limit already runs decode and the
model on 2 threads each, so what overlap can add on 2 cores is the parallel inefficiency of those
threads (~10 % here), not the 20 % the goal asks for; the built-in handler is served as TorchServe
configures it (1 worker; its 2 workers would each claim every core).

{plot}

Reproduce: `.venv/bin/python benchmarks/p1_image.py`
""",
    )


if __name__ == "__main__":
    main()
