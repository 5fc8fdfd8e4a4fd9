"""What TorchServe 0.12's KServe envelopes do with a batch of several requests, measured.

    .venv/bin/python benchmarks/kserve_envelopes.py

For TS_SERVICE_ENVELOPE=kserve and kservev2, one TorchServe with two resnet18 archives at
batchSize 4 / maxBatchDelay 200: TorchServe's own image_classifier handler (torch-model-archiver)
and the toolkit's. Each gets 8 concurrent requests of 2 instances on the v1, v2 and /predictions
paths; the script prints the status codes. On 2026-11-21: the stock handler got 503 on every
request ("number of batch response mismatched"), the toolkit handler 200 on every one.
"""

import base64
import concurrent.futures
import json
import shutil
import tempfile
from pathlib import Path

from common import write_section

from archiver import properties, server  # noqa: E402
from archiver.engines import torchserve_launch  # noqa: E402
from helpers.models import package_resnet  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import image_model  # noqa: E402


def main():
    tmp = Path(tempfile.mkdtemp())
    sample = image_model.build(tmp / "sample")
    store = tmp / "model-store"
    config = tmp / "batching.yaml"
    config.write_text("batchSize: 4\nmaxBatchDelay: 200\n")
    package_resnet(sample, store, config_text=config.read_text())
    torchscript = image_model.torchscript_resnet18(tmp / "resnet18_ts.pt")
    image_model.package_builtin(torchscript, store, "builtin", config)
    b64 = [base64.b64encode(image_model.sample_jpeg(seed)).decode() for seed in range(8)]
    rows = []
    for envelope in ("kserve", "kservev2"):
        home = short_tmp("env-")
        srv = torchserve_launch.start(
            properties.write_config(store, home / "config.properties"),
            store,
            home,
            env={"TS_SERVICE_ENVELOPE": envelope},
        )
        try:
            for model in ("builtin", "resnet18"):
                for path in (f"/v1/models/{model}:predict", f"/v2/models/{model}/infer", f"/predictions/{model}"):
                    if envelope == "kservev2":
                        bodies = [
                            {"inputs": [{"name": "image", "shape": [2], "datatype": "BYTES", "data": [b, b64[0]]}]}
                            for b in b64
                        ]
                    else:
                        bodies = [{"instances": [{"data": b}, {"data": b64[0]}]} for b in b64]
                    with concurrent.futures.ThreadPoolExecutor(8) as pool:
                        results = list(
                            pool.map(
                                lambda body: server.request(
                                    srv.inference + path,
                                    json.dumps(body).encode(),
                                    "POST",
                                    {"Content-Type": "application/json"},
                                    60,
                                ),
                                bodies,
                            )
                        )
                    codes = [status for status, _ in results]
                    print(f"{envelope:9} {model:9} {path:30} {codes}  {json.dumps(results[0][1])[:90]}")
                    handler = "TorchServe built-in" if model == "builtin" else "toolkit"
                    first = results[0][1].get("message", "answers") if isinstance(results[0][1], dict) else "answers"
                    rows.append(f"| {envelope} | {handler} | `{path}` | {codes.count(200)}/8 | {first} |")
        finally:
            server.stop(srv)
            shutil.rmtree(home, ignore_errors=True)
    table = "\n".join(rows)
    write_section(
        "KSERVE-ENVELOPES",
        f"""
## TorchServe's KServe envelopes and batching

**Whole process**: a real TorchServe with each envelope, real HTTP.
`TS_SERVICE_ENVELOPE` as KServe sets it; one TorchServe, resnet18 at batchSize 4 / maxBatchDelay 200 ms,
8 concurrent requests of 2 instances each per row.

| envelope | handler | path | 200s | first answer's message |
|---|---|---|---|---|
{table}

TorchServe's envelopes read only the first request of a batch, so every request of a batch of two
or more fails; the toolkit handlers decode KServe bodies themselves and the envelope steps aside
(`handlers/envelopes.py`). `tsctl export kserve` sets batchSize 1 for archives with other handlers.

Reproduce: `.venv/bin/python benchmarks/kserve_envelopes.py`
""",
    )


if __name__ == "__main__":
    main()
