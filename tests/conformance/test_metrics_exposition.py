"""Conformance of /metrics (issue #31, items 2 and 3): pytorch/serve's custom_metrics example (the stand-in
of samples/ts_examples/custom_metrics/, or its own files with ``TSCTL_PYTORCH_SERVE``), served with its
config (its metrics.yaml as ``metrics_config``, ``model_metrics_auto_detect=true``) on TorchServe 0.12 in
prometheus mode, on the tsctl engine and on MLServer: the metric families each exports are compared with
TorchServe's (name, type, the names its samples carry, label names, a histogram's bucket bounds).

- The tsctl engine exports every family TorchServe does but TorchServe's system metrics (``SYSTEM``: its
  metric collector process samples CPU, memory, disk and GPU) and ``QueueTime``/``WorkerThreadTime``,
  each as TorchServe does; its own (``ENGINE_OWN``) besides.
- MLServer's /metrics holds the workers' families (TorchServe's ``model_metrics``, declared and
  auto-detected), the same, beside MLServer's own; ``tsctl serve --engine mlserver --config`` carries the
  config's ``metrics_config`` to each model's model-settings.json (without it the example's handler
  fails every request: its ``RequestBatchSize`` is declared in its metrics.yaml only).

``make test`` runs the cheap checks: the worker's own metric lines (the stand-in run in TorchServe's
worker process, ``LocalModel``) through the engine's registry, against the families TorchServe 0.12
exported for them (``STAND_IN``, ``EXAMPLE``: measured, and checked against TorchServe again by the
matrix), and the pieces (histogram buckets as prometheus_client's, counters' names, the yaml's types,
the MLServer settings). ``pytest -m matrix`` serves it on the three.
"""

import base64
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, NamedTuple, Tuple

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from archiver import engines, server
from archiver.engines.mlserver import metrics_settings
from archiver.engines.tsctl import served
from archiver.properties import write_config
from helpers.paths import short_tmp
from helpers.servers import RunningServer
from samples import runtime_env, ts_examples
from serving.engine import metrics as engine_metrics
from serving.engine.metrics import Metrics, WorkerMetrics, exposition
from serving.local_model import LocalModel, RequestInput

SERVE = ts_examples.checkout()
MODEL = "custom_metrics"
SYSTEM = {  # TorchServe's families the tsctl runtimes do not have
    "CPUUtilization",
    "MemoryUsed",
    "MemoryAvailable",
    "MemoryUtilization",
    "DiskUsage",
    "DiskUtilization",
    "DiskAvailable",
    "GPUMemoryUtilization",
    "GPUMemoryUsed",
    "GPUUtilization",
    "QueueTime",
    "WorkerThreadTime",
}
ENGINE_OWN = {"ts_workers", "request_predict_seconds", "tsctl_metrics_dropped_total"}
LE = (
    "0.005",
    "0.01",
    "0.025",
    "0.05",
    "0.075",
    "0.1",
    "0.25",
    "0.5",
    "0.75",
    "1.0",
    "2.5",
    "5.0",
    "7.5",
    "10.0",
    "+Inf",
)
MODEL_LEVEL = ("Hostname", "Level", "ModelName")
# What TorchServe 0.12 exported for the workers' lines (measured; test_families_equal_torchserves checks it)
STAND_IN = {
    "HandlerTime": ("gauge", MODEL_LEVEL),
    "PredictionTime": ("gauge", MODEL_LEVEL),
    "ConformanceLoads": ("counter", MODEL_LEVEL),
    "ConformanceRequests": ("counter", ("Hostname",)),
    "ConformanceBatchSize": ("gauge", ("Hostname", "ModelName")),
    "ConformanceImageBytes": ("histogram", MODEL_LEVEL),
    "ConformancePreprocessTime": ("gauge", ("Hostname", "Level", "MethodName", "ModelName")),
    "ConformancePostprocessCalls": ("counter", MODEL_LEVEL),
    "ConformanceDigitShare": ("histogram", MODEL_LEVEL),
}
EXAMPLE = {  # pytorch/serve's mnist_handler.py
    "HandlerTime": ("gauge", MODEL_LEVEL),
    "PredictionTime": ("gauge", MODEL_LEVEL),
    "InitializeCallCount": ("counter", MODEL_LEVEL),
    "InferenceRequestCount": ("counter", ("Hostname",)),
    "PreprocessCallCount": ("counter", ("Hostname", "ModelName")),
    "RequestBatchSize": ("gauge", ("Hostname", "ModelName")),
    "SizeOfImage": ("gauge", MODEL_LEVEL),
    "HandlerMethodTime": ("gauge", ("Hostname", "Level", "MethodName", "ModelName")),
    "PostprocessCallCount": ("counter", MODEL_LEVEL),
    "ExamplePercentMetric": ("histogram", MODEL_LEVEL),
}
WORKER_FAMILIES = EXAMPLE if SERVE else STAND_IN


class Shape(NamedTuple):
    """What is compared of a family: its type, the names its samples carry, its label names (``le``
    apart) and a histogram's bucket bounds."""

    kind: str
    samples: Tuple[str, ...]
    labels: Tuple[str, ...]
    buckets: Tuple[str, ...] = ()


def expected(kind: str, name: str, labels: Tuple[str, ...]) -> Shape:
    if kind == "histogram":
        return Shape(kind, tuple(f"{name}_{s}" for s in ("bucket", "count", "sum")), labels, LE)
    return Shape(kind, (name,), labels)


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "summary": ("", "_count", "_sum")}


def families(text: str) -> Dict[str, Shape]:
    """The exposition's families by the name its TYPE line gives, as written (the sample names too:
    prometheus_client's parser would rename a counter's samples ``NAME_total``). Strict: it parses, and
    every sample belongs to the family above it."""
    list(text_string_to_metric_families(text))
    found: Dict[str, list] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, current, kind = line.split(" ", 3)
            found[current] = [kind, set(), set(), set()]
        elif line and not line.startswith("#"):
            name, labels = SAMPLE.match(line).groups()
            kind, samples, label_names, buckets = found[current]
            assert name in [current + suffix for suffix in SUFFIXES.get(kind, ("",))], (name, current, kind)
            pairs = dict(LABEL.findall(labels or ""))
            samples.add(name)
            label_names.update(k for k in pairs if k != "le")
            buckets.update([pairs["le"]] if "le" in pairs else [])
    return {
        name: Shape(kind, tuple(sorted(samples)), tuple(sorted(labels)), tuple(sorted(les, key=float)))
        for name, (kind, samples, labels, les) in found.items()
    }


def differences(got: Dict[str, Shape], want: Dict[str, Shape]) -> List[str]:
    problems = [f"{name}: missing (TorchServe: {want[name]})" for name in sorted(set(want) - set(got))]
    problems += [f"{name}: not on TorchServe ({got[name]})" for name in sorted(set(got) - set(want))]
    problems += [
        f"{name}: {got[name]} where TorchServe has {want[name]}"
        for name in sorted(set(got) & set(want))
        if got[name] != want[name]
    ]
    return problems


def worker(name: str = MODEL, version: str = "1.0"):
    return SimpleNamespace(owner=SimpleNamespace(spec=SimpleNamespace(name=name, version=version)), index=1)


# ---- the example, built once -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def example(tmp_path_factory) -> ts_examples.Example:
    return ts_examples.build_custom_metrics(tmp_path_factory.mktemp("custom_metrics"), SERVE)


@pytest.fixture(scope="module")
def store(example, tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("metrics-store") / "model-store"
    ts_examples.package(example, "torch-model-archiver", store)
    return store


# ---- make test: the worker's own lines through the engine's registry ----------------------------------------
def test_the_workers_lines_come_out_as_torchserve_exports_them(example, store):
    """The example run in TorchServe's worker process; each line its metrics logger wrote, through the
    engine's registry (its metrics.yaml declared, the rest auto-detected): the families TorchServe 0.12
    exported for them, a HISTOGRAM as ``_bucket``/``_count``/``_sum``, a counter under its own name."""
    config = example.properties["metrics_config"]
    with LocalModel(store / f"{MODEL}.mar", batch_size=1, metrics_config=config) as model:
        statuses = [
            model.predict([RequestInput(body, {"Content-Type": kind})])[0].status for body, kind in example.inputs
        ]
    assert statuses == [200] * len(example.inputs)
    metrics = Metrics(config)
    for line in model.metrics:
        metrics.worker_metric(worker(), line)
    text = metrics.render()[0].decode()
    own = set(engine_metrics.FRONTEND_COUNTERS) | ENGINE_OWN
    got = {name: shape for name, shape in families(text).items() if name not in own}
    want = {name: expected(kind, name, labels) for name, (kind, labels) in WORKER_FAMILIES.items()}
    assert not differences(got, want)
    histogram = next(name for name, (kind, _) in WORKER_FAMILIES.items() if kind == "histogram")
    counts = [line for line in text.splitlines() if line.startswith(f"{histogram}_count{{")]
    assert counts and float(counts[0].split()[-1]) == len(example.inputs), counts  # one observation a request


def test_a_histograms_buckets_count_and_sum_are_prometheus_clients():
    """Observations on the bounds, between them, past the last and negative: the same buckets, count
    and sum as prometheus_client's Histogram (the Java client's bounds and semantics: ``le`` inclusive)."""
    values = [0.005, 0.0051, 0.1, 10.0, 10.5, 1e6, -3.0, 0.0, 2.5, 50.0]
    reference = CollectorRegistry()
    histogram = Histogram("Share", "h", ["Hostname"], registry=reference)
    metrics = WorkerMetrics("host")
    for value in values:
        histogram.labels("h1").observe(value)
        metrics.worker_metric(worker(), f"[METRICS]Share.percent:{value}|#|#type:HISTOGRAM|#hostname:h1,1,r")

    def samples(registry):
        return sorted(
            (s.name, s.labels.get("le", ""), s.value)
            for f in registry.collect()
            for s in f.samples
            if s.name.startswith("Share") and not s.name.endswith("_created")
        )

    ours = samples(metrics)
    assert ours == samples(reference) and len(ours) == len(LE) + 2, ours


def test_counters_keep_their_names_and_the_yamls_type_wins(tmp_path):
    """A NamedCounter's HELP and TYPE lines name it as its samples (prometheus_client's Counter keeps
    ``_total``); a line typed unlike the metric its yaml declares is dropped and counted; without
    auto-detection a metric the yaml does not declare is not exported; a histogram's NaN is dropped."""
    yaml_file = tmp_path / "metrics.yaml"  # no ts_metrics: TorchServe exports none of its frontend's
    yaml_file.write_text(
        "model_metrics:\n  histogram:\n    - {name: Declared, unit: ms, dimensions: [ModelName]}\n"
        "  counter:\n    - {name: Calls, unit: count, dimensions: []}\n"
    )
    metrics = Metrics(str(yaml_file), auto_detect=False)
    Counter("plain", "a prometheus_client counter", registry=metrics.registry).inc()
    emit = lambda name, kind, value=1.0, dims=f"ModelName:{MODEL}": metrics.worker_metric(  # noqa: E731
        worker(), f"[METRICS]{name}.ms:{value}|#{dims}|#type:{kind}|#hostname:h,1,r"
    )
    emit("Declared", "GAUGE")  # the yaml says HISTOGRAM
    emit("Declared", "HISTOGRAM", 3.0)
    emit("Declared", "HISTOGRAM", float("nan"))
    emit("Other", "HISTOGRAM", 1e308, "")  # not declared: not recorded at all (no auto-detection)
    emit("Undeclared", "COUNTER")
    emit("Calls", "COUNTER", 2.0, "")
    text = metrics.render()[0].decode()
    shapes = families(text)
    assert shapes["Declared"] == expected("histogram", "Declared", ("Hostname", "ModelName"))
    assert f'Declared_sum{{Hostname="h",ModelName="{MODEL}"}} 3.0' in text
    assert "Undeclared" not in text and "Requests2XX" not in text
    assert shapes["Calls"] == expected("counter", "Calls", ("Hostname",)) and 'Calls{Hostname="h"} 2.0' in text
    assert "# HELP Calls Torchserve prometheus counter metric with unit: count\n# TYPE Calls counter\n" in text
    assert shapes["plain_total"].samples == ("plain_total",)  # prometheus_client's own, as it writes them
    dropped = {
        s.labels["reason"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == engine_metrics.DROPPED
    }
    assert dropped["type"] == 1 and dropped["value"] == 1, dropped
    emit("Declared", "HISTOGRAM", 1.5e308)
    emit("Declared", "HISTOGRAM", 1.5e308)  # its sum would pass 1.8e308: dropped, the sum stays finite
    text = metrics.render()[0].decode()
    assert f'Declared_sum{{Hostname="h",ModelName="{MODEL}"}} 1.5e+308' in text
    assert f'Declared_count{{Hostname="h",ModelName="{MODEL}"}} 2.0' in text
    assert 'tsctl_metrics_dropped_total{reason="value"} 2.0' in text
    assert exposition(metrics.registry) == metrics.render()[0]


def test_serve_on_mlserver_carries_the_configs_metrics_config(example, store, tmp_path, monkeypatch):
    """What ``tsctl serve --engine mlserver --config`` writes in each model's parameters.extra: the
    config's metrics_config (relative to the current directory, as TorchServe reads it) and
    model_metrics_auto_detect=false; a metrics_config that is not a file is refused."""
    from archiver import mlserver
    from archiver.errors import UserError

    metrics_yaml = Path(example.properties["metrics_config"])
    monkeypatch.chdir(metrics_yaml.parent)
    config = write_config(
        store,
        tmp_path / "config.properties",
        extra={"metrics_config": metrics_yaml.name, "model_metrics_auto_detect": "false"},
    )
    specs, frontend = served(store, config)
    folder = mlserver.write_repository(specs, tmp_path / "repository", metrics_settings(frontend))
    settings = json.loads((folder / f"{MODEL}-1.0" / mlserver.MODEL_SETTINGS).read_text())
    assert settings["parameters"]["extra"]["metricsConfig"] == str(metrics_yaml)
    assert settings["parameters"]["extra"]["metricsAutoDetect"] is False
    frontend.metrics_config = "missing.yaml"
    with pytest.raises(UserError, match="metrics_config missing.yaml cannot be read"):
        metrics_settings(frontend)


# ---- make matrix: served on TorchServe 0.12, the tsctl engine and MLServer -----------------------------------
def ask(srv, example, v2: bool) -> List[int]:
    statuses = []
    for body, kind in example.inputs:
        if v2:  # the Open Inference Protocol: the image as one BYTES element, base64
            tensor = {"name": "input-0", "shape": [1], "datatype": "BYTES", "data": [base64.b64encode(body).decode()]}
            body, kind = json.dumps({"inputs": [tensor]}).encode(), "application/json"
        statuses.append(server.request(engines.predict_url(srv, MODEL), body, "POST", {"Content-Type": kind}, 120)[0])
    return statuses


def scrape(srv) -> str:
    time.sleep(1)  # the last request's metric lines read
    status, text = server.request(srv.metrics_url, timeout=30)
    assert status == 200, text
    return text


@pytest.fixture(scope="module")
def torchserve(example, store):
    running = RunningServer(store)
    with open(running.config, "a") as config:
        config.write("".join(f"{k}={v}\n" for k, v in {**example.properties, "metrics_mode": "prometheus"}.items()))
    with running as srv:
        return ask(srv, example, v2=False), families(scrape(srv))


@pytest.mark.matrix  # 15 s
def test_torchserve_exports_the_families_measured(torchserve, example):
    statuses, exported = torchserve
    assert statuses == [200] * len(example.inputs)
    want = {name: expected(kind, name, labels) for name, (kind, labels) in WORKER_FAMILIES.items()}
    assert not differences({name: exported[name] for name in exported if name in want}, want)


@pytest.mark.matrix  # 25 s
def test_the_tsctl_engine_exports_torchserves_families(example, store, torchserve):
    engine = engines.ENGINES["tsctl"]
    srv = engine.start(store, home=short_tmp("me-"), timeout=300, metrics_config=example.properties["metrics_config"])
    try:
        statuses, text = ask(srv, example, v2=False), scrape(srv)
    finally:
        engine.stop(srv)
    assert statuses == torchserve[0]
    got = {name: shape for name, shape in families(text).items() if name not in ENGINE_OWN}
    want = {name: shape for name, shape in torchserve[1].items() if name not in SYSTEM}
    assert not differences(got, want)


@pytest.mark.matrix  # 45 s
def test_mlserver_exports_the_workers_families_as_torchserve(example, store, torchserve, tmp_path):
    """Served as ``tsctl serve --engine mlserver --config`` serves it, the config TorchServe's: with the
    stand-in and with pytorch/serve's own files."""
    config = write_config(store, tmp_path / "config.properties", extra=example.properties)
    engine = engines.ENGINES["mlserver"]
    srv = engine.start(
        store, config=str(config), home=short_tmp("mm-"), timeout=300, python=str(runtime_env.ensure_mlserver())
    )
    try:
        statuses, text = ask(srv, example, v2=True), scrape(srv)
    finally:
        engine.stop(srv)
    log = engine.handler_log(srv).read_text(errors="replace")
    assert "MetricsCacheKeyError" not in log  # the config's metrics_config reached the workers
    assert statuses == torchserve[0]
    frontend = engine_metrics.read_metrics_yaml(example.properties["metrics_config"])[1]
    want = {name: shape for name, shape in torchserve[1].items() if name not in frontend}
    got = {name: shape for name, shape in families(text).items() if name in want}
    assert not differences(got, want)
    assert families(text)[engine_metrics.DROPPED].kind == "counter"
