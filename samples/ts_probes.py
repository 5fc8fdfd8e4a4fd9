"""The cases beside the conformance matrix (samples/ts_examples.py): what a handler receives and what else
the worker gives it.

- ``xgboost`` (``build_xgboost``): pytorch/serve's xgboost_classfication, a BaseHandler reading each body as
  CSV bytes; with ``TSCTL_PYTORCH_SERVE`` its own handler and a model trained by its own ``xgboost_train.py``;
- ``body_probe`` (``build_body_probe``): a handler answering the type and value of the body it received, one
  request for each row of TorchServe's worker's decoding table;
- ``gpu_probe`` (``build_gpu_probe``): a handler printing, when its worker loads, the gpu_id TorchServe gave it;
- ``context_probe`` (``build_context_probe``): a handler class answering what else the worker gives it (a
  request header, statuses set for part of a batch, sys.path, the environment, stdin, torch's threads,
  context.metrics in initialize), batched by two.

Run by tests/conformance/test_body_decoding.py, tests/conformance/test_worker_context.py,
tests/engine/test_mlserver.py and tests/engine/test_v2_requests.py. Handlers: samples/ts_examples/.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Optional

from samples.ts_examples import STAND_INS, Example, digit_png

IRIS_ROWS = {  # iris flowers (Fisher's data), one CSV line each, and their species
    "versicolor": b"6.1,2.8,4.7,1.2\n",
    "setosa": b"5.7,3.8,1.7,0.3\n",
    "virginica": b"7.7,3.0,6.1,2.3\n",
}
IRIS_MEANS = ((5.006, 3.428, 1.462, 0.246), (5.936, 2.770, 4.260, 1.326), (6.588, 2.974, 5.552, 2.026))
NO_TYPE = ""  # a request sent without a Content-Type, as the example's README sends it (curl -T)


def build_xgboost(out: Path, serve: Optional[Path]) -> Example:
    """pytorch/serve's xgboost_classfication: a BaseHandler reading each body as CSV bytes, packaged as its
    README does (``--config-file model-config.yaml``: batchSize 2). Its requests as that README sends them
    (``curl -T``: no Content-Type), as application/octet-stream, and as ``tsctl predict`` sends a ``.txt``
    (text/plain: the worker hands a str) and a JSON list. The stand-in's model is the nearest species
    mean (a linear classifier, ``{"weights", "bias"}`` JSON); pytorch/serve's is trained here by its
    ``xgboost_train.py``, which needs xgboost and scikit-learn."""
    out.mkdir(parents=True, exist_ok=True)
    if serve:
        folder = serve / "examples/xgboost_classfication"
        handler, labels, config = (
            folder / n for n in ("xgboost_iris_handler.py", "index_to_name.json", "model-config.yaml")
        )
        subprocess.run(
            [sys.executable, str(folder / "xgboost_train.py")],
            cwd=out,
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=600,
        )
        weights = out / "iris_model.json"
    else:
        handler = STAND_INS / "xgboost/xgboost_iris_handler.py"
        labels, config, weights = out / "index_to_name.json", out / "model-config.yaml", out / "iris_model.json"
        labels.write_text(json.dumps({"0": "setosa", "1": "versicolor", "2": "virginica"}))
        config.write_text("minWorkers: 1\nmaxWorkers: 1\nbatchSize: 2\n")
        bias = [-sum(v * v for v in mean) / 2 for mean in IRIS_MEANS]
        weights.write_text(json.dumps({"weights": [list(mean) for mean in IRIS_MEANS], "bias": bias}))
    rows = list(IRIS_ROWS.values())
    inputs = [(rows[0], NO_TYPE), (rows[1], NO_TYPE), (rows[2], "application/octet-stream")]
    inputs += [(rows[0], "text/plain"), (b"[6.1, 2.8, 4.7, 1.2]", "application/json")]
    return Example(
        "xgboost",
        str(handler),
        inputs,
        serialized_file=weights,
        extra_files=[labels],
        config_file=config,
        source="pytorch/serve" if serve else "stand-in",
        note="its body read as CSV bytes: a .txt sent as text/plain reaches it as a str, on every runtime",
    )


def build_body_probe(out: Path) -> Example:
    """A handler answering what it received, for each row of TorchServe's worker's decoding table."""
    out.mkdir(parents=True, exist_ok=True)
    inputs = [
        (b'{"a": [1, 2.5, "x"], "b": null}', "application/json"),
        (b"[1, 2, 3]", "application/json"),
        (b'"a JSON string"', "application/json"),
        (b"{not json", "application/json"),  # the worker hands the bytes
        (b'{"charset": "given"}', "application/json; charset=utf-8"),
        ("h\u00e9llo w\u00f6rld \U0001f642".encode("utf-8"), "text/plain"),
        (b"\xff\xfe not UTF-8", "text/plain"),  # the bytes
        (b"a,b\n1,2\n", "text/csv"),
        (digit_png(4), "image/png"),
        (IRIS_ROWS["setosa"], "application/octet-stream"),
        (IRIS_ROWS["setosa"], NO_TYPE),
        (b"", "application/octet-stream"),
    ]
    return Example(
        "body_probe",
        str(STAND_INS / "body_probe/body_probe.py"),
        inputs,
        note="answers the type and value of the body it received",
    )


CONTEXT_BATCHING = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 2\nmaxBatchDelay: 5000\n"


def build_context_probe(out: Path) -> Example:
    """A handler answering what else the worker gives it (headers, statuses of part of a batch, sys.path,
    environment, stdin, threads, metrics in initialize), its model-config.yaml batching two requests."""
    out.mkdir(parents=True, exist_ok=True)
    config = out / "model-config.yaml"
    config.write_text(CONTEXT_BATCHING)
    inputs = [(b"first", "application/octet-stream"), (b"second", "application/octet-stream")]
    return Example(
        "context_probe",
        str(STAND_INS / "context_probe/context_probe.py"),
        inputs,
        config_file=config,
        note="answers what the worker gave it beside the body; sent as one batch of two",
    )


def build_gpu_probe(out: Path, name: str, config_text: str) -> Example:
    """A handler saying which GPU its worker was given (samples/ts_examples/gpu_probe), as model ``name`` with
    ``config_text`` as its model-config.yaml (workers, deviceType, deviceIds)."""
    out.mkdir(parents=True, exist_ok=True)
    config = out / f"{name}-config.yaml"
    config.write_text(config_text)
    return Example(
        name,
        str(STAND_INS / "gpu_probe/gpu_probe.py"),
        [(b"which", "text/plain")],
        config_file=config,
        note="answers the gpu_id its worker was loaded with",
    )
