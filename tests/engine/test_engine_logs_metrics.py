"""The tsctl engine's logs and /metrics against a hostile handler and hostile requests (issue #29).

Served as ``tsctl serve --engine tsctl`` serves it (``engines.ENGINES["tsctl"].start``: detached, its
output through ``archiver/bounded_log.py``), the engine and its workers under a memory cgroup; the
engine's and the workers' pids are the same before and after each attack.

- A handler printing 60 KiB lines without end: ``engine.out`` and its rotated files stay under the
  configured size, the worker's excess lines are dropped and counted, the engine answers meanwhile.
- A handler printing a ``[METRICS]`` line, and a request whose JSON key is a forged ``[METRICS]`` line
  (echoed in the toolkit's error and logged): no forged series in /metrics (metrics come from the
  worker's metrics logger only), and the toolkit logs the key escaped, on its own line.
- A handler emitting, through ``context.metrics``, series with 230 labels of 250 characters, and
  thousands of series with long labels: /metrics stays under its byte budget and is scraped fast, the
  dropped lines are counted in ``tsctl_metrics_dropped_total``.
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from prometheus_client.parser import text_string_to_metric_families

from archiver import bounded_log, engines, server
from helpers.cgroups import MemoryLimit
from helpers.models import package_resnet
from helpers.paths import short_tmp
from helpers.servers import workers
from serving.engine import metrics as engine_metrics
from serving.local_model import LocalModel

BIN = Path(sys.executable).parent
LOG_CAP, LOG_BACKUPS = 1 << 20, 2
MEMORY = 3 << 30
FORGED_KEY = "\n[METRICS]HandlerTime.ms:999999|#ModelName:resnet18,Level:Model|#type:GAUGE|#hostname:forged,1,x"
NOISY = '''\
import os
from ts.metrics.metric_type_enum import MetricTypes


def handle(data, context):
    """'spam N': print N lines of 60 KiB; 'forge': print a [METRICS] line; 'metrics N L K': emit N
    series of metric WideL with L labels of K characters; anything else: answer the pid."""
    if data is None:
        return None
    answers = []
    for row in data:
        body = row.get("body") if row.get("body") is not None else row.get("data")
        text = bytes(body).decode() if isinstance(body, (bytes, bytearray)) else str(body)
        words = text.split()
        if words[0] == "spam":
            line = "x" * (60 << 10)
            for _ in range(int(words[1])):
                print(line, flush=True)
        elif words[0] == "forge":
            print("[METRICS]Forged.ms:1|#ModelName:noisy,Level:Model|#type:GAUGE|#hostname:forged,1,x", flush=True)
        elif words[0] == "metrics":
            count, labels, size = map(int, words[1:])
            names = [f"d{i}" for i in range(labels)]
            metric = context.metrics.add_metric_to_cache(f"Wide{labels}", "count", names, MetricTypes.GAUGE)
            for series in range(count):
                metric.add_or_update(1.0, [f"{series:06d}" + "v" * (size - 6)] * labels)
        answers.append({"pid": os.getpid()})
    return answers
'''


@pytest.fixture(scope="module")
def store(image_sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("logs-metrics")
    store = root / "model-store"
    package_resnet(image_sample, store)
    handler = root / "noisy.py"
    handler.write_text(NOISY)
    command = [
        str(BIN / "torch-model-archiver"),
        "--model-name",
        "noisy",
        "--version",
        "1.0",
        "--handler",
        str(handler),
        "--export-path",
        str(store),
    ]
    subprocess.run(command, check=True, capture_output=True, env=dict(os.environ, TMPDIR=str(root)))
    return store


@pytest.fixture(scope="module")
def srv(store):
    """The store served by the tsctl engine as ``tsctl serve --engine tsctl`` starts it, logs capped at
    1 MiB x 2, the engine and its workers under a memory cgroup."""
    home = short_tmp("logs-")
    limits = []
    caps = {bounded_log.MAX_BYTES_VARIABLE: str(LOG_CAP), bounded_log.BACKUPS_VARIABLE: str(LOG_BACKUPS)}
    with mock.patch.dict(os.environ, caps):
        running = engines.ENGINES["tsctl"].start(store, None, home, timeout=240)
    try:
        pids = [running.pid] + [pid for model in ("noisy", "resnet18") for _, _, pid in workers(running, model)]
        limits = [MemoryLimit(pid, MEMORY) for pid in pids]
        running.out = Path(home) / engines.ENGINE_OUT
        yield running
    finally:
        server.stop(running)
        for limit in limits:
            limit.release()


def pids(srv) -> list:
    return [srv.pid] + sorted(pid for model in ("noisy", "resnet18") for _, _, pid in workers(srv, model))


def say(srv, model: str, text: str, timeout: float = 60):
    return server.request(
        f"{srv.inference}/predictions/{model}", text.encode(), "POST", {"Content-Type": "text/plain"}, timeout
    )


def metrics(srv):
    started = time.monotonic()
    status, text = server.request(f"{srv.metrics}/metrics", timeout=60)
    assert status == 200, text
    return text, time.monotonic() - started


def logs(srv) -> list:
    return sorted(srv.out.parent.glob(f"{srv.out.name}*"))


@pytest.mark.matrix  # out of make test for its time (issue #32's tests took its room); make matrix runs it
def test_a_handler_printing_without_end_cannot_fill_the_disk_or_stall_the_engine(srv):
    before = pids(srv)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        flood = pool.submit(say, srv, "noisy", "spam 3000", 120)  # 180 MiB of output
        answered = []
        while not flood.done():
            started = time.monotonic()
            status, _ = server.request(f"{srv.inference}/v2/health/ready", timeout=30)
            answered.append((status, time.monotonic() - started))
            time.sleep(0.2)
        assert flood.result()[0] == 200
    time.sleep(1.5)  # the worker's budget refills: its next line is logged, after the count of those dropped
    assert say(srv, "noisy", "hello")[0] == 200
    time.sleep(0.5)
    files = logs(srv)
    sizes = {f.name: f.stat().st_size for f in files}
    print(f"log files {sizes}, health answers during the flood {[f'{s} {t:.2f}s' for s, t in answered]}")
    assert all(size <= LOG_CAP for size in sizes.values()), sizes
    assert f"{srv.out.name}.1" in sizes and len(files) <= LOG_BACKUPS + 1, sizes
    assert all(status == 200 and took < 5 for status, took in answered), answered
    text = "".join(f.read_text(errors="replace") for f in files)
    assert "of this worker's output were not logged" in text
    assert pids(srv) == before, "the engine or a worker restarted"


def test_no_line_a_handler_prints_or_a_client_sends_becomes_a_metric(srv):
    before = pids(srv)
    assert say(srv, "noisy", "forge")[0] == 200
    body = json.dumps({FORGED_KEY: 1}).encode()
    status, answer = server.request(
        f"{srv.inference}/predictions/resnet18", body, "POST", {"Content-Type": "application/json"}, 60
    )
    assert status == 400 and "[METRICS]" in answer["message"], answer
    assert say(srv, "noisy", "hello")[0] == 200  # the handler's own metrics still arrive
    time.sleep(0.5)
    text, _ = metrics(srv)
    forged = [line for line in text.splitlines() if "forged" in line.lower() or line.endswith(" 999999.0")]
    assert not forged, forged
    handler_time = [line for line in text.splitlines() if line.startswith("HandlerTime{")]
    assert any('ModelName="resnet18"' in line for line in handler_time), handler_time  # the toolkit's own
    assert any(line.startswith("PredictionTime{") and 'ModelName="noisy"' in line for line in text.splitlines())
    log = "".join(f.read_text(errors="replace") for f in logs(srv))
    assert "got keys" in log or "found keys" in log
    assert "keys: \\n[METRICS]HandlerTime.ms:999999" in log  # logged escaped, on the toolkit's one line
    assert pids(srv) == before


def test_metrics_stay_bounded_whatever_a_handler_emits(srv):
    before = pids(srv)
    # 500 series of 230 labels of 250 characters (the report's 340 MiB), and 3000 series of 15 labels
    # of 250 characters (12 MB of exposition): too many labels, then past the byte budget.
    assert say(srv, "noisy", "metrics 500 230 250", 120)[0] == 200
    assert say(srv, "noisy", "metrics 3000 15 250", 120)[0] == 200
    time.sleep(1)
    text, took = metrics(srv)
    print(f"/metrics: {len(text.encode()):,} bytes in {took:.2f}s")
    assert len(text.encode()) < engine_metrics.MAX_MODEL_BYTES + (256 << 10)  # one model emitted them
    assert took < 3
    assert "Wide230{" not in text and "Wide15{" in text
    dropped = {
        line.split('"')[1]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("tsctl_metrics_dropped_total{")
    }
    assert dropped["labels"] >= 500 and dropped["bytes"] > 0, dropped
    assert server.request(f"{srv.inference}/v2/health/ready", timeout=30)[0] == 200
    assert pids(srv) == before


def test_the_toolkit_logs_a_clients_data_on_its_own_line(store):
    """On TorchServe too (its frontend parses the worker's stdout lines starting with [METRICS]): the
    toolkit's log line naming a forged key is one line, escaped."""
    with LocalModel(store / "resnet18.mar", decode_input_request=False) as local:
        for body in ({FORGED_KEY: 1}, {"instances": [{FORGED_KEY: 1}]}):
            [answer] = local.predict([json.dumps(body).encode()])
            assert answer.status == 400
    lines = list(local.log)  # what the worker wrote on its stdout, line by line (complete once closed)
    assert sum("keys: \\n[METRICS]HandlerTime.ms:999999" in line for line in lines) == 2, lines
    assert not [line for line in lines if line.startswith("[METRICS]") and "forged" in line]


def test_each_model_has_its_own_series_budget_and_its_builtin_series_always_fit(monkeypatch):
    """``Metrics.worker_metric`` alone, budgets made small: a model past its own budget does not take
    another's; past the bound of all models together, a model's own PredictionTime (TorchServe's
    labels: its name, Level Model, this host) is still admitted, a look-alike of it is not, and no
    handler can claim PredictionTime's name as a counter."""
    monkeypatch.setattr(engine_metrics, "MAX_MODEL_SERIES", 5)
    monkeypatch.setattr(engine_metrics, "MAX_SERIES", 8)
    metrics = engine_metrics.Metrics()

    def emit(model, name, dims, kind="GAUGE", value=1.0):
        worker = SimpleNamespace(owner=SimpleNamespace(spec=SimpleNamespace(name=model, version="1.0")), index=1)
        line = f"[METRICS]{name}.ms:{value}|#{dims}|#type:{kind}|#hostname:{metrics.hostname},1700000000,req"
        metrics.worker_metric(worker, line)

    emit("hog", "PredictionTime", "ModelName:quiet,Level:Model", "COUNTER")  # TorchServe's gauge, as a counter
    for n in range(20):
        emit("hog", "Many", f"Id:{n}")  # 5 admitted: hog's budget
    for n in range(20):
        emit("other", "Many", f"Id:other{n}")  # 3 admitted: all models' 8
    emit("quiet", "Many", "Id:quiet")
    emit("quiet", "PredictionTime", "ModelName:quiet,Level:Model", value=2.5)
    emit("quiet", "PredictionTime", "ModelName:quiet,Level:Forged", value=3.5)
    emit("hog", "PredictionTime", "ModelName:hog2,Level:Model", value=4.5)  # another model's name: not hog's own
    text = metrics.render()[0].decode()
    many = [line for line in text.splitlines() if line.startswith("Many{")]
    assert sum('Id="other' in line for line in many) == 3 and len(many) == 8, many
    predictions = [  # read back: prometheus_client's writer sorts a sample's labels
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "PredictionTime"
    ]
    assert predictions == [({"ModelName": "quiet", "Level": "Model", "Hostname": metrics.hostname}, 2.5)], predictions
    assert "# TYPE PredictionTime gauge" in text
    dropped = {
        line.split('"')[1]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("tsctl_metrics_dropped_total{")
    }
    assert dropped["series"] == 15 + 17 + 1 + 2, dropped
