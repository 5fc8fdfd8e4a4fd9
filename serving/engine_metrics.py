"""The tsctl engine's ``/metrics``: Prometheus, under the names TorchServe and KServe give them.

- TorchServe's frontend counters, per model and version: ``ts_inference_requests_total``,
  ``ts_inference_latency_microseconds`` (request arrival to answer) and
  ``ts_queue_latency_microseconds`` (arrival to the batch leaving for a worker); its
  ``Requests2XX``/``Requests4XX``/``Requests5XX`` counters, and ``WorkerLoadTime`` per worker.
- Worker counts: ``ts_workers{model_name, model_version, status}`` (TorchServe shows them only in
  describe; a gauge makes a dead or restarting worker visible to an alert).
- What the workers themselves emit, parsed from the lines of their metrics logger (a channel of its
  own, ``serving/worker_launch.py``: never their stdout, where a handler may print a request's data)
  as TorchServe's frontend parses them: ``HandlerTime`` and ``PredictionTime`` (ms, gauges, labels
  ModelName, Level, Hostname) and any metric a handler adds through ``context.metrics``, with the
  type and dimensions its line carries.
- KServe's ``request_predict_seconds`` histogram, per model name.
- ``tsctl_metrics_dropped_total{reason}``: the workers' metric lines not recorded because of a bound.

**Bounds.** A handler's metrics cannot grow ``/metrics`` without end, nor blind the other models'.
A series has at most ``MAX_LABELS`` labels of at most ``MAX_LABEL`` characters (names and values).
Each model version's workers (the worker that emitted a line: its model name and version) may add
``MAX_MODEL_SERIES`` series and ``MAX_MODEL_BYTES`` bytes of exposition, all of them together
``MAX_SERIES`` and ``MAX_WORKER_BYTES`` (the engine's memory); a new series past a bound is dropped
and counted. A model's own ``BUILTIN`` series, those TorchServe's worker emits itself (``HandlerTime``,
``PredictionTime``: ``model_metrics`` of ``ts/configs/metrics.yaml``, labelled with its own model
name, ``Level`` Model and this host), are always admitted: two per model, whatever the others emitted,
and their type is TorchServe's (a handler cannot claim their names as another type first).
``render`` runs off the event loop (engine.py's ``/metrics`` route).

**Values.** A counter's line is an increment: it must be finite and >= 0 (TorchServe's worker refuses
a negative one, ``ts/metrics/caching_metric.py``; NaN slips through there), and so must the sum; any
other is dropped and counted (reason ``value``), so a counter never goes down nor sticks at NaN. A
gauge takes any value, NaN and ±Inf included: the exposition format has them, and the gauge's next
line replaces it (nothing sticks).
"""

import math
import re
import socket
import threading
from typing import Dict, Tuple

import yaml
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .engine_workers import worker_log_line
from .worker_process import METRICS_YAML

# [METRICS]HandlerTime.ms:12.3|#ModelName:resnet18,Level:Model|#type:GAUGE|#hostname:h,1700000000,req
METRIC_LINE = re.compile(
    r"\[METRICS\](?P<name>[^.|:]+)\.(?P<unit>[^:|]*):(?P<value>[^|]+)\|#(?P<dims>[^|]*)"
    r"(?:\|#type:(?P<type>\w+))?\|#hostname:(?P<host>[^,]*)"
)
NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
METRIC_TYPES = {"GAUGE": "gauge", "COUNTER": "counter", "HISTOGRAM": "gauge"}  # a histogram line is one observation
FRONTEND_COUNTERS = {
    "ts_inference_requests_total": "Total number of inference requests.",
    "ts_inference_latency_microseconds": "Cumulative inference duration in microseconds",
    "ts_queue_latency_microseconds": "Cumulative queue duration in microseconds",
    "Requests2XX": "Total number of requests with response in 200-300 status code range",
    "Requests4XX": "Total number of requests with response in 400-500 status code range",
    "Requests5XX": "Total number of requests with response status code above 500",
}
MAX_MODEL_SERIES = 10_000  # series of one model version's workers: ever-new dimension values end there
MAX_MODEL_BYTES = 4 << 20  # exposition bytes of one model version's series
MAX_SERIES = 50_000  # series of all the workers together (their BUILTIN ones are admitted past it)
MAX_LABEL = 256  # characters of a metric's name, a dimension's name or value; a line with a longer one is dropped
MAX_LABELS = 16  # dimensions of one series (Hostname included); a line with more is dropped
MAX_WORKER_BYTES = 16 << 20  # exposition bytes of all the workers' series together (BUILTIN ones admitted past it)
# Names the engine exposes itself: a worker's line cannot add samples to them.
ENGINE_NAMES = frozenset(FRONTEND_COUNTERS) | {"ts_workers", "WorkerLoadTime", "request_predict_seconds"}
ENGINE_PREFIXES = ("request_predict_seconds", "tsctl_")
DROP_REASONS = ("value", "labels", "label_length", "series", "bytes")  # tsctl_metrics_dropped_total's reasons


def builtin_metrics(path: str = METRICS_YAML) -> Dict[str, str]:
    """The metrics TorchServe's worker emits itself for a model (``model_metrics`` of its metrics.yaml):
    name -> type (``METRIC_TYPES``'s)."""
    with open(path) as config:
        model_metrics = yaml.safe_load(config)["model_metrics"]
    return {
        entry["name"]: METRIC_TYPES[metric_type.upper()]
        for metric_type, entries in model_metrics.items()
        for entry in entries
    }


BUILTIN = builtin_metrics()  # HandlerTime, PredictionTime: gauges


class Metrics:
    """The engine's registry; ``observer`` per model version, ``worker_metric`` per line of a worker's
    metrics logger."""

    def __init__(self):
        disable_created_metrics()  # TorchServe's and KServe's expositions have no *_created samples
        self.registry = CollectorRegistry()
        self.predict_seconds = Histogram(
            "request_predict_seconds", "predict latency", ["model_name"], registry=self.registry
        )
        self.hostname = socket.gethostname()
        # TorchServe's counters carry no _total suffix: kept here and exposed as they are named.
        self.frontend: Dict[str, Dict[Tuple, float]] = {name: {} for name in FRONTEND_COUNTERS}
        self.backend: Dict[Tuple[str, str], Dict[Tuple, float]] = {}  # (name, type) -> labels -> value
        self.types: Dict[str, str] = dict(BUILTIN)  # a worker metric's name -> its type
        self.worker_series = self.worker_bytes = 0  # the workers' series, and their exposition's size
        self.models: Dict[Tuple[str, str], Tuple[int, int]] = {}  # the same, per model (name, version)
        self.dropped = Counter(
            "tsctl_metrics_dropped",
            "Metric lines of the workers not recorded, by the bound they passed",
            ["reason"],
            registry=self.registry,
        )
        for reason in DROP_REASONS:
            self.dropped.labels(reason)
        self.lock = threading.Lock()
        self.engine = None  # set by the engine: worker counts and load times are read when scraped
        self.registry.register(_Live(self))

    def _add(self, name: str, labels: Tuple, value: float):
        series = self.frontend[name]
        series[labels] = series.get(labels, 0.0) + value

    def observer(self, spec):
        model = (("model_name", spec.name), ("model_version", spec.version))
        host = (("Level", "Host"), ("Hostname", self.hostname))

        def observe(jobs, responses, sent: float, done: float):
            with self.lock:
                for job, response in zip(jobs, responses):
                    self._add("ts_inference_requests_total", model, 1)
                    self._add("ts_inference_latency_microseconds", model, (done - job.arrived) * 1e6)
                    self._add("ts_queue_latency_microseconds", model, max(0.0, sent - job.arrived) * 1e6)
                    status_class = "2XX" if response.status < 400 else ("4XX" if response.status < 500 else "5XX")
                    self._add(f"Requests{status_class}", host, 1)
            for job in jobs:
                self.predict_seconds.labels(spec.name).observe(done - job.arrived)

        return observe

    def worker_metric(self, worker, line: str):
        """A line of a worker's metrics logger: the metric it carries is recorded (within the bounds);
        any other line (TorchServe's "[METRICS]Failed to update metric ...") goes to its log."""
        match = METRIC_LINE.match(line)
        if not match:
            worker_log_line(worker, line)
            return
        name = match.group("name")
        try:
            value = float(match.group("value"))
        except ValueError:
            return self.dropped.labels("value").inc()
        if not NAME.match(name) or name in ENGINE_NAMES or name.startswith(ENGINE_PREFIXES):
            return
        labels = {}
        for pair in match.group("dims").split(","):
            key, _, dim = pair.partition(":")
            if key and LABEL.match(key) and key != "Hostname":
                labels.setdefault(key, dim)
        labels["Hostname"] = match.group("host") or self.hostname
        if len(labels) > MAX_LABELS:
            return self.dropped.labels("labels").inc()
        if any(len(text) > MAX_LABEL for text in (name, *labels, *labels.values())):
            return self.dropped.labels("label_length").inc()
        metric_type = METRIC_TYPES.get((match.group("type") or "GAUGE").upper(), "gauge")
        if metric_type == "counter" and not (math.isfinite(value) and value >= 0):
            return self.dropped.labels("value").inc()
        model = (worker.owner.spec.name, worker.owner.spec.version)
        with self.lock:
            if self.types.get(name, metric_type) != metric_type:
                return  # one type per name: TorchServe's for BUILTIN, else the first line's
            series = self.backend.get((name, metric_type), {})
            key = tuple(labels.items())
            if key not in series:
                size = series_bytes(name, key)
                count, used = self.models.get(model, (0, 0))
                builtin = (("ModelName", model[0]), ("Level", "Model"), ("Hostname", self.hostname))
                if not (name in BUILTIN and key == builtin):  # a model's own BUILTIN series always fit
                    if count >= MAX_MODEL_SERIES or self.worker_series >= MAX_SERIES:
                        return self.dropped.labels("series").inc()
                    if used + size > MAX_MODEL_BYTES or self.worker_bytes + size > MAX_WORKER_BYTES:
                        return self.dropped.labels("bytes").inc()
                self.models[model] = (count + 1, used + size)
                self.worker_series, self.worker_bytes = self.worker_series + 1, self.worker_bytes + size
                self.types[name] = metric_type
                self.backend[(name, metric_type)] = series
            if metric_type == "counter":
                value += series.get(key, 0.0)
                if not math.isfinite(value):  # a sum past 1.8e308: the counter stays where it was
                    return self.dropped.labels("value").inc()
            series[key] = value

    def render(self) -> Tuple[bytes, str]:
        """TorchServe's families as TorchServe writes them (a counter named as its samples are), then
        the prometheus_client registry (worker counts, load times, KServe's histogram)."""
        with self.lock:
            families = [
                (name, FRONTEND_COUNTERS[name], "counter", dict(series)) for name, series in self.frontend.items()
            ]
            families += [
                (name, f"{name}, as the workers emit it", metric_type, dict(series))
                for (name, metric_type), series in sorted(self.backend.items())
            ]
        lines = []
        for name, doc, metric_type, series in families:
            if not series:
                continue
            lines += [f"# HELP {name} {doc}", f"# TYPE {name} {metric_type}"]
            for labels, value in series.items():
                text = ",".join(f'{key}="{escape(str(label))}"' for key, label in labels)
                lines.append(f"{name}{{{text}}} {float(value)!r}")
        text = ("\n".join(lines) + "\n").encode() if lines else b""
        return text + generate_latest(self.registry), CONTENT_TYPE_LATEST


def series_bytes(name: str, labels: Tuple) -> int:
    """About the bytes one series takes in the exposition (its line, its value at most 24 characters)."""
    return len(name) + sum(len(key) + len(escape(str(value))) + 4 for key, value in labels) + 28


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Live:
    """What is read when scraped: worker counts and load times, and the workers' own metrics."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        metrics, engine = self.metrics, self.metrics.engine
        if engine is None:
            return
        workers = Metric("ts_workers", "Workers of each model version, by status", "gauge")
        load = Metric("WorkerLoadTime", "Milliseconds from a worker's start to its model loaded", "gauge")
        for model in engine.all():
            counts: Dict[str, int] = {}
            for worker in model.workers:
                counts[worker.status] = counts.get(worker.status, 0) + 1
                if worker.load_seconds is not None:
                    name = f"W-{worker.id}-{model.spec.name}_{model.spec.version}"
                    labels = {"WorkerName": name, "Level": "Host", "Hostname": metrics.hostname}
                    load.add_sample("WorkerLoadTime", labels, worker.load_seconds * 1000)
            for status in ("READY", "BUSY", "STARTING"):
                labels = {"model_name": model.spec.name, "model_version": model.spec.version, "status": status}
                workers.add_sample("ts_workers", labels, counts.get(status, 0))
        yield workers
        yield load
