"""The tsctl engine's ``/metrics``, and the workers' metrics on MLServer's: Prometheus, as TorchServe 0.12
exports them in prometheus mode (``metrics_mode=prometheus``: names, types, label names, HELP), and KServe's.

- TorchServe's frontend metrics that its metrics.yaml's ``ts_metrics`` declares (the yaml in use:
  ``metrics_config``, else TorchServe's own; one it leaves out is not exported), with the yaml's units:
  the counters ``ts_inference_requests_total``, ``ts_inference_latency_microseconds`` (request arrival to
  answer), ``ts_queue_latency_microseconds`` (arrival to the batch leaving for a worker), labelled
  model_name, model_version, hostname; ``Requests2XX``/``4XX``/``5XX`` (Level, Hostname); the gauge
  ``WorkerLoadTime`` per worker. TorchServe's GPU metrics (``GPUMemoryUtilization``, ``GPUMemoryUsed``,
  ``GPUUtilization``, per ``DeviceId``) read through NVML when scraped, on a machine with GPUs; its other
  system metrics (CPU, memory, disk), ``QueueTime`` and ``WorkerThreadTime`` are not kept.
- Worker counts: ``ts_workers{model_name, model_version, status}`` (TorchServe shows them only in
  describe; a gauge makes a dead or restarting worker visible to an alert).
- Each model version's load, the signal to scale on (TorchServe has none: pytorch/serve#714), labelled
  as the ``ts_`` counters (model_name, model_version, hostname) and read when scraped (``LOAD_GAUGES``,
  ``LOAD_COUNTERS``): ``ts_queue_size`` (waiting for a worker), ``ts_requests_in_flight`` (queued or in
  a batch, REST and gRPC alike), ``ts_batch_size_limit`` (batchSize), ``ts_batch_fill_ratio`` (the mean
  size over batchSize of the last ``RECENT_BATCHES`` batches), and the counters ``ts_batches_total`` and
  ``ts_batched_requests_total`` (their rates' ratio: the mean batch size over any window).
- What the workers emit (``WorkerMetrics``, which MLServer's runtime shares), read from the lines of
  their metrics logger (a channel of its own, ``serving/worker/worker_launch.py``: never their stdout, where a
  handler may print a request's data) and recorded as TorchServe's frontend records them
  (``WorkerLifeCycle``, ``MetricCache``): the yaml's ``model_metrics`` are declared from the start, each
  with its type, unit and dimensions, ``Hostname`` last (``HandlerTime`` and ``PredictionTime`` in
  TorchServe's yaml, any a handler's ``context.metrics`` uses); a metric it does not declare is
  auto-detected from its first line (its type, unit and dimensions). A COUNTER line adds, a GAUGE line
  sets, a HISTOGRAM line is one observation: ``NAME_bucket`` at the Java client's bounds (0.005 ... 10,
  +Inf: prometheus_client's defaults too), ``NAME_count``, ``NAME_sum``.
- KServe's ``request_predict_seconds`` histogram, per model name.
- ``tsctl_metrics_dropped_total{reason}``: the workers' metric lines not recorded because of a bound.

Where tsctl differs from TorchServe on purpose: a metric the yaml does not declare is exported unless the
config says ``model_metrics_auto_detect=false`` (TorchServe drops it unless told ``true``); a line whose
type, or whose dimension names, are not its metric's is dropped and counted (reason ``type``, ``labels``)
where TorchServe records it under the declared type with the values taken by position.

**Exposition.** ``exposition`` writes prometheus_client's families with prometheus_client's own text
writer (``generate_latest``), one family at a time, with one change: prometheus_client calls a counter
``NAME_total`` in its HELP and TYPE lines, while TorchServe's counters (``NamedCounter``) carry their own
name on every line (``Requests2XX``, ``InferenceRequestCount``), so those two lines keep it.

**Bounds.** A handler's metrics cannot grow ``/metrics`` without end, nor blind the other models'.
A series has at most ``MAX_LABELS`` labels of at most ``MAX_LABEL`` characters (names and values).
Each model version's workers (the worker that emitted a line: its model name and version) may add
``MAX_MODEL_SERIES`` series and ``MAX_MODEL_BYTES`` bytes of exposition (a histogram's series: its
buckets, count and sum; an auto-detected metric: its HELP and TYPE lines too), all of them together
``MAX_SERIES`` and ``MAX_WORKER_BYTES`` (the engine's memory); a new series past a bound is dropped
and counted. A model's own ``BUILTIN`` series, those TorchServe's worker emits itself (``HandlerTime``,
``PredictionTime``: ``model_metrics`` of ``ts/configs/metrics.yaml``, labelled with its own model
name, ``Level`` Model and this host), are always admitted: two per model, whatever the others emitted,
and they are declared whatever the yaml in use says (a handler cannot claim their names as another
type first). ``render`` runs off the event loop (engine.py's ``/metrics`` route).

**Values.** A counter's line is an increment: it must be finite and >= 0 (TorchServe's worker refuses
a negative one, ``ts/metrics/caching_metric.py``; NaN slips through there), and so must the sum; a
histogram's observation must be finite; any other is dropped and counted (reason ``value``), so a
counter never goes down and neither sticks at NaN. A gauge takes any value, NaN and ±Inf included: the
exposition format has them, and the gauge's next line replaces it (nothing sticks).
"""

import bisect
import math
import re
import socket
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import yaml
from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

from ..config_properties import MAX_METRICS_YAML, ConfigError, read_regular
from ..worker.worker_process import METRICS_YAML
from .worker_runner import worker_log_line
from .workers import RECENT_BATCHES

# [METRICS]HandlerTime.ms:12.3|#ModelName:resnet18,Level:Model|#type:GAUGE|#hostname:h,1700000000,req
METRIC_LINE = re.compile(
    r"\[METRICS\](?P<name>[^.|:]+)\.(?P<unit>[^:|]*):(?P<value>[^|]+)\|#(?P<dims>[^|]*)"
    r"(?:\|#type:(?P<type>\w+))?\|#hostname:(?P<host>[^,]*)"
)
NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
METRIC_TYPES = {"GAUGE": "gauge", "COUNTER": "counter", "HISTOGRAM": "histogram"}
BUCKETS = Histogram.DEFAULT_BUCKETS  # the Java client's default buckets, which TorchServe's histograms have
HELP = "Torchserve prometheus {kind} metric with unit: {unit}"  # TorchServe's HELP of every metric it exports
FRONTEND_COUNTERS = {  # name -> label names, as TorchServe's frontend fills them
    "ts_inference_requests_total": ("model_name", "model_version", "hostname"),
    "ts_inference_latency_microseconds": ("model_name", "model_version", "hostname"),
    "ts_queue_latency_microseconds": ("model_name", "model_version", "hostname"),
    "Requests2XX": ("Level", "Hostname"),
    "Requests4XX": ("Level", "Hostname"),
    "Requests5XX": ("Level", "Hostname"),
}
MAX_MODEL_SERIES = 10_000  # series of one model version's workers: ever-new dimension values end there
MAX_MODEL_BYTES = 4 << 20  # exposition bytes of one model version's series
MAX_SERIES = 50_000  # series of all the workers together (their BUILTIN ones are admitted past it)
MAX_LABEL = 256  # characters of a metric's name, a dimension's name or value; a line with a longer one is dropped
MAX_LABELS = 16  # dimensions of one series (Hostname included); a line with more is dropped
MAX_WORKER_BYTES = 16 << 20  # exposition bytes of all the workers' series together (BUILTIN ones admitted past it)
LOAD_GAUGES = {  # per model version, read when scraped: the signal to scale on (docs/engines.md, Metrics)
    "ts_queue_size": "Requests waiting in the model version's job queue for a worker",
    "ts_requests_in_flight": "Requests taken and not yet answered: queued or in a worker's batch",
    "ts_batch_size_limit": "The model version's batchSize: the most requests one batch holds",
    "ts_batch_fill_ratio": f"Requests per batch over batchSize, the mean of the last {RECENT_BATCHES} batches",
}
LOAD_COUNTERS = {
    "ts_batches_total": "Batches the model version's workers ran",
    "ts_batched_requests_total": "Requests in those batches (over ts_batches_total: the mean batch size)",
}
# TorchServe's GPU system metrics (ts/metrics/system_metrics.py), per visible GPU, read through NVML when scraped
GPU_GAUGES = ("GPUMemoryUtilization", "GPUMemoryUsed", "GPUUtilization")
GPU_LABELS = ("Level", "DeviceId", "Hostname")
# Names the engine exposes itself: a worker's line cannot add samples to them.
ENGINE_NAMES = (
    frozenset(FRONTEND_COUNTERS)
    | {"ts_workers", "WorkerLoadTime", "request_predict_seconds"}
    | set(LOAD_GAUGES)
    | set(LOAD_COUNTERS)
    | {name[: -len("_total")] for name in LOAD_COUNTERS}
    | set(GPU_GAUGES)
)
ENGINE_PREFIXES = ("request_predict_seconds", "tsctl_")
DROPPED = "tsctl_metrics_dropped_total"
MODEL_LABELS = ("model_name", "model_version", "hostname")  # TorchServe's ts_* labels
DROP_REASONS = ("value", "labels", "label_length", "series", "bytes", "type")  # tsctl_metrics_dropped_total's


@dataclass
class Family:
    """One metric of the workers: its type (``METRIC_TYPES``' values), unit and label names (Hostname
    last), and its series: label values -> value (a histogram's: its count per bucket, then its sum)."""

    kind: str
    unit: str
    labels: Tuple[str, ...]
    series: Dict[Tuple[str, ...], object] = field(default_factory=dict)


def read_metrics_yaml(path: str) -> Tuple[Dict[str, Family], Dict[str, str]]:
    """A metrics.yaml as TorchServe reads it: its ``model_metrics`` (name -> an empty Family, Hostname
    added to its dimensions) and its ``ts_metrics`` (name -> unit). A ConfigError for a file that is not
    one (``config_properties.read_regular``: a FIFO or a device refused at once) or not a YAML mapping."""
    try:
        spec = yaml.safe_load(read_regular(path, MAX_METRICS_YAML)) or {}
        if not isinstance(spec, dict):
            raise ValueError("not a YAML mapping")
    except (OSError, ValueError, yaml.YAMLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc).splitlines()[0]
        raise ConfigError(f"metrics_config {path} cannot be read as TorchServe's metrics.yaml ({reason})") from None
    model, frontend = {}, {}
    for section, into in (("model_metrics", model), ("ts_metrics", frontend)):
        for kind, entries in (spec.get(section) or {}).items():
            for entry in entries if str(kind).upper() in METRIC_TYPES and isinstance(entries, list) else []:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                    continue  # not a metric TorchServe could build either
                if section == "ts_metrics":
                    into[entry["name"]] = str(entry.get("unit", ""))
                else:
                    labels = tuple(str(d) for d in entry.get("dimensions") or [] if d != "Hostname") + ("Hostname",)
                    into[entry["name"]] = Family(METRIC_TYPES[kind.upper()], str(entry.get("unit", "")), labels)
    return model, frontend


BUILTIN = read_metrics_yaml(METRICS_YAML)[0]  # HandlerTime, PredictionTime: gauges (ModelName, Level, Hostname)


class NamedCounter(Metric):
    """A counter whose samples carry its own name, as TorchServe's do (``exposition``)."""

    def __init__(self, name: str, documentation: str, labels: Tuple[str, ...]):
        super().__init__(name, documentation, "counter")
        self.label_names = labels

    def add(self, values: Tuple[str, ...], value: float):
        self.add_sample(self.name, dict(zip(self.label_names, values)), value)


class _One:
    def __init__(self, family: Metric):
        self.family = family

    def collect(self):
        return [self.family]


def exposition(registry) -> bytes:
    """prometheus_client's text format of ``registry`` (``generate_latest``), family by family; a
    ``NamedCounter`` keeps its own name in its HELP and TYPE lines, where prometheus_client writes
    ``NAME_total``. A drop-in for ``generate_latest`` (MLServer's /metrics: serving/runtimes/mlserver_start.py)."""
    parts = []
    for family in registry.collect():
        text = generate_latest(_One(family))
        if isinstance(family, NamedCounter):
            help_line, _type_line, rest = text.split(b"\n", 2)
            written = f"# HELP {family.name}_total ".encode()
            help_line = f"# HELP {family.name} ".encode() + help_line[len(written) :]
            text = b"\n".join((help_line, f"# TYPE {family.name} counter".encode(), rest))
        parts.append(text)
    return b"".join(parts)


class WorkerMetrics:
    """The metrics TorchServe's workers emit, as TorchServe's frontend exports them: a prometheus_client
    collector (``collect``) fed with ``worker_metric`` per line of a worker's metrics logger, within the
    bounds. ``declare`` adds a metrics.yaml's ``model_metrics``; ``reserved(name)`` says a name is
    another's (the engine's own, MLServer's) and no worker's."""

    def __init__(self, hostname: str, auto_detect: bool = True, reserved: Callable[[str], bool] = lambda n: False):
        self.hostname, self.auto_detect, self.reserved = hostname, auto_detect, reserved
        self.families: Dict[str, Family] = {}
        self.taken: Dict[str, str] = {}  # every sample name of the families -> the family's
        self.worker_series = self.worker_bytes = 0  # the workers' series, and their exposition's size
        self.models: Dict[Tuple[str, str], Tuple[int, int]] = {}  # the same, per model (name, version)
        self.dropped = {reason: 0 for reason in DROP_REASONS}
        self.lock = threading.Lock()
        for name, family in BUILTIN.items():  # first: whatever a yaml says, they are TorchServe's
            self._add_family(name, Family(family.kind, family.unit, family.labels))

    def declare(self, path: str):
        """The ``model_metrics`` of the metrics.yaml at ``path``, but for a name that is already there."""
        declared = read_metrics_yaml(path)[0]
        with self.lock:
            for name, family in declared.items():
                if self._free(name, family.kind):
                    self._add_family(name, family)

    def _free(self, name: str, kind: str) -> bool:
        names = sample_names(name, kind)
        return NAME.match(name) is not None and not any(
            n in self.taken or n in ENGINE_NAMES or n.startswith(ENGINE_PREFIXES) or self.reserved(n) for n in names
        )

    def _add_family(self, name: str, family: Family):
        self.families[name] = family
        for sample in sample_names(name, family.kind):
            self.taken[sample] = name

    def drop(self, reason: str):
        with self.lock:
            self.dropped[reason] += 1

    def worker_metric(self, worker, line: str, auto_detect: Optional[bool] = None):
        """A line of a worker's metrics logger: the metric it carries is recorded (within the bounds);
        any other line (TorchServe's "[METRICS]Failed to update metric ...") goes to its log.
        ``auto_detect``: whether a metric not declared is recorded (None: this collector's setting)."""
        match = METRIC_LINE.match(line)
        if not match:
            worker_log_line(worker, line)
            return
        name = match.group("name")
        try:
            value = float(match.group("value"))
        except ValueError:
            return self.drop("value")
        labels = {}
        for pair in match.group("dims").split(","):
            key, _, dim = pair.partition(":")
            if key and LABEL.match(key) and key != "Hostname":
                labels.setdefault(key, dim)
        labels["Hostname"] = match.group("host") or self.hostname
        if len(labels) > MAX_LABELS:
            return self.drop("labels")
        if any(len(text) > MAX_LABEL for text in (name, *labels, *labels.values())):
            return self.drop("label_length")
        kind = METRIC_TYPES.get((match.group("type") or "GAUGE").upper(), "gauge")
        if (kind != "gauge" and not math.isfinite(value)) or (kind == "counter" and value < 0):
            return self.drop("value")
        model = (worker.owner.spec.name, worker.owner.spec.version)
        detect = self.auto_detect if auto_detect is None else auto_detect
        with self.lock:
            self._record(name, kind, match.group("unit"), labels, value, model, detect)

    def _record(self, name: str, kind: str, unit: str, labels: Dict[str, str], value: float, model, detect: bool):
        family = self.families.get(name)
        if family is None:
            if not detect or not self._free(name, kind):
                return  # TorchServe, too, records nothing for a name it does not know (without auto-detection)
            family = Family(kind, unit, tuple(labels))  # auto-detected: added once its first series fits
        if family.kind != kind:
            self.dropped["type"] += 1  # one type per name: the yaml's, else the first line's
            return
        if tuple(labels) != family.labels:
            self.dropped["labels"] += 1  # one set of label names per metric, as Prometheus has it
            return
        key = tuple(labels.values())
        series = family.series
        if key not in series:
            size = series_bytes(name, labels, kind) + (0 if name in self.families else header_bytes(name, unit))
            count, used = self.models.get(model, (0, 0))
            if not (name in BUILTIN and key == (model[0], "Model", self.hostname)):  # a model's own always fit
                if count >= MAX_MODEL_SERIES or self.worker_series >= MAX_SERIES:
                    self.dropped["series"] += 1
                    return
                if used + size > MAX_MODEL_BYTES or self.worker_bytes + size > MAX_WORKER_BYTES:
                    self.dropped["bytes"] += 1
                    return
            self.models[model] = (count + 1, used + size)
            self.worker_series, self.worker_bytes = self.worker_series + 1, self.worker_bytes + size
            if name not in self.families:
                self._add_family(name, family)
            series[key] = [0] * len(BUCKETS) + [0.0] if kind == "histogram" else 0.0
        if kind == "gauge":
            series[key] = value
            return
        total = (series[key][-1] if kind == "histogram" else series[key]) + value
        if not math.isfinite(total):  # a sum past 1.8e308: the counter (the histogram) stays where it was
            self.dropped["value"] += 1
        elif kind == "counter":
            series[key] = total
        else:
            counts = series[key]
            counts[bisect.bisect_left(BUCKETS, value)] += 1
            counts[-1] = total

    def describe(self) -> List[Metric]:
        return []  # what a registry checks for clashes at registration: nothing fixed (names come as lines do)

    def collect(self) -> Iterable[Metric]:
        with self.lock:  # copied here, built outside: a scrape holds the workers' lines back only this long
            families = [
                (name, family, {key: list(v) if family.kind == "histogram" else v for key, v in family.series.items()})
                for name, family in sorted(self.families.items())
            ]
            dropped = dict(self.dropped)
        for name, family, series in families:
            yield build_family(name, family, series)
        counter = NamedCounter(
            DROPPED, "Metric lines of the workers not recorded, by the bound they passed", ("reason",)
        )
        for reason, count in dropped.items():
            counter.add((reason,), count)
        yield counter


def build_family(name: str, family: Family, series: dict) -> Metric:
    """One metric of the workers as the prometheus_client family TorchServe's exposition holds."""
    doc = HELP.format(kind=family.kind, unit=family.unit)
    if family.kind == "counter":
        counter = NamedCounter(name, doc, family.labels)
        for key, value in series.items():
            counter.add(key, value)
        return counter
    if family.kind == "gauge":
        gauge = GaugeMetricFamily(name, doc, labels=family.labels)
        for key, value in series.items():
            gauge.add_metric(key, value)
        return gauge
    histogram = HistogramMetricFamily(name, doc, labels=family.labels)
    for key, counts in series.items():
        cumulative, buckets = 0, []
        for bound, count in zip(BUCKETS, counts):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        histogram.add_metric(key, buckets, counts[-1])
    return histogram


def sample_names(name: str, kind: str) -> Tuple[str, ...]:
    return (f"{name}_bucket", f"{name}_count", f"{name}_sum", name) if kind == "histogram" else (name,)


def series_bytes(name: str, labels: Dict[str, str], kind: str = "gauge") -> int:
    """About the bytes one series takes in the exposition (each line's value at most 24 characters; a
    histogram's: a line per bucket, with its ``le`` label, and its count and sum)."""
    line = len(name) + sum(len(key) + len(escape(str(value))) + 4 for key, value in labels.items()) + 28
    return line if kind != "histogram" else (len(BUCKETS) + 2) * (line + 7) + len(BUCKETS) * 14


def header_bytes(name: str, unit: str) -> int:
    return 2 * len(name) + len(unit) + 80


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """The engine's registry; ``observer`` per model version, ``worker_metric`` per line of a worker's
    metrics logger. ``metrics_config``: the metrics.yaml in use (None: TorchServe's); ``auto_detect``:
    whether the workers' metrics it does not declare are exported."""

    def __init__(self, metrics_config: Optional[str] = None, auto_detect: bool = True):
        disable_created_metrics()  # TorchServe's and KServe's expositions have no *_created samples
        self.registry = CollectorRegistry()
        self.predict_seconds = Histogram(
            "request_predict_seconds", "predict latency", ["model_name"], registry=self.registry
        )
        self.hostname = socket.gethostname()
        self.declared = read_metrics_yaml(metrics_config or METRICS_YAML)[1]  # ts_metrics: name -> unit
        self.frontend: Dict[str, Dict[Tuple, float]] = {name: {} for name in FRONTEND_COUNTERS}
        self.workers = WorkerMetrics(self.hostname, auto_detect, reserved=self.declared.__contains__)
        if metrics_config:
            self.workers.declare(metrics_config)
        self.lock = threading.Lock()
        self.engine = None  # set by the engine: worker counts and load times are read when scraped
        self.registry.register(_Frontend(self))
        self.registry.register(self.workers)
        self.registry.register(_Live(self))
        self.registry.register(_Gpus(self))

    def _add(self, name: str, labels: Tuple, value: float):
        series = self.frontend[name]
        series[labels] = series.get(labels, 0.0) + value

    def observer(self, spec):
        model = (spec.name, spec.version, self.hostname)
        host = ("Host", self.hostname)

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
        self.workers.worker_metric(worker, line)

    def render(self) -> Tuple[bytes, str]:
        return exposition(self.registry), CONTENT_TYPE_LATEST


class _Frontend:
    """TorchServe's frontend counters that the yaml in use declares, as TorchServe names them."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        metrics = self.metrics
        with metrics.lock:
            copied = {name: dict(series) for name, series in metrics.frontend.items()}
        for name, series in copied.items():
            if name in metrics.declared:
                counter = NamedCounter(
                    name, HELP.format(kind="counter", unit=metrics.declared[name]), FRONTEND_COUNTERS[name]
                )
                for labels, value in series.items():
                    counter.add(labels, value)
                yield counter


class _Live:
    """What is read when scraped: worker counts, load times, and each model version's load."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        metrics, engine = self.metrics, self.metrics.engine
        if engine is None:
            return
        workers = Metric("ts_workers", "Workers of each model version, by status", "gauge")
        unit = metrics.declared.get("WorkerLoadTime", "Milliseconds")
        load = Metric("WorkerLoadTime", HELP.format(kind="gauge", unit=unit), "gauge")
        gauges = {name: GaugeMetricFamily(name, doc, labels=MODEL_LABELS) for name, doc in LOAD_GAUGES.items()}
        counters = {name: CounterMetricFamily(name, doc, labels=MODEL_LABELS) for name, doc in LOAD_COUNTERS.items()}
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
            key = (model.spec.name, model.spec.version, metrics.hostname)
            fill = list(model.recent_fill)
            for name, value in (
                ("ts_queue_size", len(model.queue)),
                ("ts_requests_in_flight", model.in_flight),
                ("ts_batch_size_limit", model.spec.batch_size),
                ("ts_batch_fill_ratio", sum(fill) / len(fill) if fill else 0.0),
            ):
                gauges[name].add_metric(key, value)
            counters["ts_batches_total"].add_metric(key, model.batches)
            counters["ts_batched_requests_total"].add_metric(key, model.batched)
        yield workers
        if "WorkerLoadTime" in metrics.declared:
            yield load
        yield from gauges.values()
        yield from counters.values()


class _Gpus:
    """TorchServe's GPU metrics that the yaml in use declares, per GPU the engine uses (number_of_gpu), by the
    id its workers know it by: ``GPUMemoryUtilization`` (memory used over total, %), ``GPUMemoryUsed`` (MB),
    ``GPUUtilization`` (%), read through NVML when scraped (serving/gpus.py), never through torch."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        from .. import gpus

        metrics, engine = self.metrics, self.metrics.engine
        declared = [name for name in GPU_GAUGES if name in metrics.declared]
        if engine is None or not declared or engine.frontend.number_of_gpu < 1:
            return
        samples = [s for index, s in sorted(gpus.sample_devices().items()) if index < engine.frontend.number_of_gpu]
        if not samples:  # NVML could not read them: no family rather than an empty one
            return
        values = {
            "GPUMemoryUtilization": lambda sample: sample.memory_used_percent,
            "GPUMemoryUsed": lambda sample: sample.memory_used_mib,
            "GPUUtilization": lambda sample: sample.utilization,
        }
        for name in declared:
            family = GaugeMetricFamily(name, HELP.format(kind="gauge", unit=metrics.declared[name]), labels=GPU_LABELS)
            for sample in samples:
                family.add_metric(("Host", str(sample.index), metrics.hostname), values[name](sample))
            yield family


_registered: Optional[WorkerMetrics] = None


def registered_metrics(hostname: str) -> WorkerMetrics:
    """This process's one ``WorkerMetrics``, registered in prometheus_client's registry at first use, its
    names clear of those registered before it (MLServer's own). One for the process: MLServer reloads its
    runtime's module for each model it loads (mlserver/settings.py, ``_reload_module``), so a collector
    kept there was registered again for every model, each family exported once per model."""
    from prometheus_client import REGISTRY

    global _registered
    if _registered is None:
        taken = getattr(REGISTRY, "_names_to_collectors", {})
        _registered = WorkerMetrics(hostname, reserved=taken.__contains__)
        REGISTRY.register(_registered)
    return _registered
