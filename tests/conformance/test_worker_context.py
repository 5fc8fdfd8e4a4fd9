"""Conformance, issue #31 item 10: what else a worker gives a handler, on every runtime.

The case ``context_probe`` (samples/ts_probes.py; its handler samples/ts_examples/context_probe/) is a
handler class whose ``initialize`` adds a counter through ``context.metrics`` and calls
``torch.set_num_threads(1)``, and whose ``handle`` answers, per request of a batch: the ``X-Probe`` header
(``context.get_request_header``), the status it set for the odd indices of the batch
(``context.set_response_status(299, "Probe Odd", idx)``) and the batch's size, its ``sys.path``, the
``TS_*``/``LOG_LOCATION``/``METRICS_LOCATION``/``PYTHONPATH``/``OMP_NUM_THREADS`` environment (paths
named: MODEL_DIR, CWD, SITE, ...), what its stdin is, torch's threads before and after its own
``set_num_threads(1)``, and what ``context.metrics`` was in ``initialize``.

It is packaged by torch-model-archiver (its model-config.yaml: one worker, batchSize 2, maxBatchDelay 5 s)
and two requests are sent at once, so that they share one batch, on TorchServe 0.12 (the reference), the
tsctl engine, in-process (``LocalModel``, one batch of two) and MLServer 1.7.1 (two v2 requests at once).
Each field is compared with TorchServe's; where a runtime differs on purpose, ``DIFFERENCES`` says what it
answers instead and why (docs/engines.md, "Archives made for TorchServe: what runs where"), and the test
checks that it still answers exactly that.

``test_local_model_smoke`` (default run, ~4 s) checks LocalModel against what TorchServe's code gives
(read in ts/context.py, ts/model_service_worker.py, the frontend's EnvironmentUtils and WorkerLifeCycle);
the served comparison is ``make matrix`` (about a minute and a half).
"""

import concurrent.futures
import http.client
import json
import re
import shutil
import urllib.parse
from pathlib import Path
from typing import Dict, List

import pytest

from archiver import engines
from helpers.paths import short_tmp
from helpers.servers import RunningServer
from samples import runtime_env, ts_examples, ts_probes
from serving.local_model import LocalModel, RequestInput

RUNTIMES = ("TorchServe", "tsctl engine", "in-process", "MLServer")
FIELDS = ("header", "status", "batch", "cwd", "sys_path", "env", "stdin", "threads", "metrics")
HEADERS = ("one", "two")  # X-Probe of the two requests
MLSERVER = engines.ENGINES["mlserver"]
OCTETS = "application/octet-stream"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    example = ts_probes.build_context_probe(tmp_path_factory.mktemp("context"))
    store = short_tmp("ctx-")
    ts_examples.package(example, "torch-model-archiver", store)
    yield store
    shutil.rmtree(store, ignore_errors=True)


def post(url: str, body: bytes, headers: Dict[str, str]):
    """(status, reason phrase, body as JSON) of one POST."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request("POST", parts.path, body, headers)
        response = connection.getresponse()
        return response.status, response.reason, json.loads(response.read() or b"null")
    finally:
        connection.close()


def at_once(url: str, bodies: List[bytes], kind: str):
    """Both requests at the same time (one batch, the server's maxBatchDelay being 5 s)."""
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        futures = [
            pool.submit(post, url, body, {"Content-Type": kind, "X-Probe": header})
            for body, header in zip(bodies, HEADERS)
        ]
        return [future.result(timeout=120) for future in futures]


def fields(replies) -> Dict[str, object]:
    """(status, reason, answer) of each request as the fields compared: the per-request ones sorted by
    the header sent (which request lands at which index of the batch is the server's), the others one
    value that every request must agree on."""
    answers = [answer for _, _, answer in replies]
    got = {
        "header": [answer["header"] for answer in answers],
        "status": sorted([answer["status"][0], status, reason] for status, reason, answer in replies),
        "batch": [answer["status"][1] for answer in answers],
    }
    for name in FIELDS[3:]:
        for answer in answers:
            answer["env"] = {k: normalised(k, v) for k, v in answer["env"].items()}
        values = [json.dumps(answer[name], sort_keys=True) for answer in answers]
        assert len(set(values)) == 1, (name, values)
        got[name] = answer[name] if (answer := answers[0]) else None
    return got


def normalised(name: str, value):
    """Ports and thread counts vary by run and machine: named."""
    if name == "OMP_NUM_THREADS":
        return "SET"
    if name.endswith("_PORT"):
        return "PORT"
    return re.sub(r":\d+$", ":PORT", value) if isinstance(value, str) else value


def in_process(store: Path):
    archive = next(store.glob("*.mar"))
    with LocalModel(archive) as model:
        requests = [
            RequestInput(body, {"Content-Type": "application/octet-stream", "X-Probe": header})
            for body, header in zip((b"first", b"second"), HEADERS)
        ]
        replies = model.predict(requests)
    return [(r.status, None, r.json()) for r in replies]


@pytest.fixture(scope="module")
def runs(store) -> Dict[str, Dict[str, object]]:
    with pytest.MonkeyPatch.context() as patch:  # an inherited PYTHONPATH (OTHER), whether the caller set one or not
        patch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
        return run_everywhere(store)


def run_everywhere(store) -> Dict[str, Dict[str, object]]:
    bodies = [b"first", b"second"]
    runs = {"in-process": fields(in_process(store))}
    with RunningServer(store) as srv:
        runs["TorchServe"] = fields(at_once(f"{srv.inference}/predictions/context_probe", bodies, OCTETS))
    engine = engines.ENGINES["tsctl"]
    srv = engine.start(store, home=short_tmp("ctxe-"), timeout=300)
    try:
        runs["tsctl engine"] = fields(at_once(f"{srv.inference}/predictions/context_probe", bodies, OCTETS))
    finally:
        engine.stop(srv)
    srv = MLSERVER.start(store, home=short_tmp("ctxm-"), timeout=300, python=str(runtime_env.ensure_mlserver()))
    try:
        v2 = [MLSERVER.request_body(body, OCTETS, as_request=False)[0] for body in bodies]
        replies = at_once(engines.predict_url(srv, "context_probe"), v2, "application/json")
        runs["MLServer"] = fields([(s, r, json.loads(a["outputs"][0]["data"][0])) for s, r, a in replies])
    finally:
        MLSERVER.stop(srv)
    return runs


# Where a runtime answers otherwise than TorchServe, on purpose: what it answers instead (docs/engines.md,
# "Archives made for TorchServe: what runs where", says why). OTHER in a path is this test run's own
# PYTHONPATH (the repository); MLServer's runtime adds its own directory.
ENGINE_PATH = {"sys_path": ["MODEL_DIR", "OTHER", "SITE"], "stdin": "devnull"}
ENGINE_ENV = {"OMP_NUM_THREADS": "SET", "PYTHONPATH": ["MODEL_DIR", "OTHER"], "TS_DECODE_INPUT_REQUEST": "true"}
DIFFERENCES = {
    "tsctl engine": {
        "status": [[200, 200, "OK"], [299, 299, ""]],  # the status's standard phrase, not the handler's
        "env": ENGINE_ENV,  # no TS_* addresses, LOG_LOCATION, METRICS_LOCATION; OMP_NUM_THREADS set
        **ENGINE_PATH,  # the model directory first; stdin /dev/null, not an open pipe
    },
    "in-process": {
        "status": [[200, 200, None], [299, 299, None]],  # LocalModel's Response keeps no reason phrase
        "env": {k: v for k, v in ENGINE_ENV.items() if k != "OMP_NUM_THREADS"},
        **ENGINE_PATH,
    },
    "MLServer": {
        "header": [[None, "one"], [None, "two"]],
        "status": [[200, 200, "OK"], [299, 200, "OK"]],  # a v2 answer below 400 is a 200
        "env": {**ENGINE_ENV, "PYTHONPATH": ["MODEL_DIR", "OTHER", "OTHER"]},
        "sys_path": ["MODEL_DIR", "OTHER", "OTHER", "SITE"],
        "stdin": "devnull",
    },
}
CELLS = [(runtime, name) for runtime in RUNTIMES[1:] for name in FIELDS]
TABLE: Dict[str, Dict[str, str]] = {}


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    if TABLE:
        lines = ["| field | " + " | ".join(RUNTIMES) + " |", "|---|" + "---|" * len(RUNTIMES)]
        for name in FIELDS:
            cells = [TABLE.get(name, {}).get(runtime, "not run") for runtime in RUNTIMES[1:]]
            lines.append(f"| {name} | reference | " + " | ".join(cells) + " |")
        print("\n" + "\n".join(lines))


@pytest.mark.matrix
def test_the_reference_answers_as_torchserve_s_code_says(runs):
    """TorchServe's own answers, the premise: the header as the client spelled it, the handler's status
    and phrase for the odd request of one batch of two, the model directory after the inherited
    PYTHONPATH, the frontend's TS_* variables, stdin an open pipe, the handler's own thread count."""
    ts = runs["TorchServe"]
    assert ts["header"] == [["one", None], ["two", None]]
    assert ts["status"] == [[200, 200, ""], [299, 299, "Probe Odd"]] and ts["batch"] == [2, 2]
    assert ts["cwd"] == "MODEL_DIR" and ts["sys_path"].index("MODEL_DIR") > 0
    assert {"LOG_LOCATION", "METRICS_LOCATION", "TS_INFERENCE_ADDRESS"} <= set(ts["env"])
    assert ts["stdin"] == "fifo" and ts["threads"][1] == 1
    assert ts["metrics"] == {"type": "MetricsCacheYamlImpl", "add_counter": "ok"}


@pytest.mark.matrix
@pytest.mark.parametrize("runtime, name", CELLS, ids=["-".join(cell).replace(" ", "_") for cell in CELLS])
def test_field(runtime, name, runs):
    want = DIFFERENCES.get(runtime, {}).get(name, runs["TorchServe"][name])
    got = runs[runtime][name]
    TABLE.setdefault(name, {})[runtime] = (
        ("equal" if got == runs["TorchServe"][name] else "differs (listed)") if got == want else "differs (NOT listed)"
    )
    assert got == want, f"{name} on {runtime}: {got!r}, TorchServe {runs['TorchServe'][name]!r}"


def test_local_model_smoke(store):
    """LocalModel against what TorchServe's worker code gives a handler (ts/context.py,
    ts/model_service_worker.py): the header as sent, the handler's statuses for part of one batch, the
    model directory as cwd and on sys.path, stdin open, torch's threads as the handler set them,
    context.metrics usable in initialize."""
    got = fields(in_process(store))
    assert got["header"] == [["one", None], ["two", None]]
    assert got["status"] == [[200, 200, None], [299, 299, None]] and got["batch"] == [2, 2]
    assert got["cwd"] == "MODEL_DIR" and "MODEL_DIR" in got["sys_path"]
    assert got["env"]["TS_DECODE_INPUT_REQUEST"] == "true" and got["stdin"] != "closed"
    assert got["threads"][1] == 1
    assert got["metrics"] == {"type": "MetricsCacheYamlImpl", "add_counter": "ok"}
