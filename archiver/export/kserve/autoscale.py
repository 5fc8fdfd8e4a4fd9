"""``tsctl export kserve --autoscale knative|keda|hpa``: the InferenceService's autoscaling, sized from one
replica's measured capacity (``--from-bench RESULT.json``, written by ``tsctl bench --capacity``; or
``--target N`` by hand), and what every mode adds beside it.

    knative   Knative mode (KPA): scaleMetric concurrency|rps, scaleTarget, containerConcurrency, min/maxReplicas,
              autoscaling.knative.dev/target-utilization-percentage and scale-down-delay annotations
    keda      Standard mode, serving.kserve.io/autoscalerClass: keda; autoScaling.metrics: two External
              metrics (Prometheus queries over the predictor's pods), the HPA taking the larger count: the
              answer rate (ts_inference_requests_total) against 70% of the measured throughput at the
              operating point, and the engine's ts_requests_in_flight gauge against 70% of the operating point
    hpa       Standard mode, serving.kserve.io/autoscalerClass: hpa; scaleMetric cpu, scaleTarget, and
              autoScaling.metrics/behavior (scale-up and scale-down)
    every     a readiness probe on the engine's every-worker endpoint (/ping), the prometheus.kserve.io
    mode      annotations, OUT/pdb.yaml (policy/v1 PodDisruptionBudget), OUT/podmonitor.yaml or
              OUT/metrics-service.yaml + OUT/servicemonitor.yaml (--monitor), OUT/capacity.json (the result read)

The rule each number follows, and the documents it rests on, are in docs/kserve.md ("Autoscaling"); DEPLOY.md
names, for each number, the measurement it came from (file, model, date, step). ``check`` refuses bad values in
one line before anything is written; ``apply`` and ``manifests`` build what ``kserve.export`` validates and writes;
DEPLOY.md's section is ``kserve_deploy.autoscale_section``.
"""

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from ...choices import AUTOSCALE_MODES
from ...errors import UserError
from ..options import ExportOptions
from . import targets
from .measured_notes import measured_notes

MODES = AUTOSCALE_MODES
MONITORS = ("podmonitor", "servicemonitor")
SCALE_METRICS = ("concurrency", "rps")  # Knative's KPA metrics (--scale-metric)
UTILIZATION = 70  # percent: Knative's container-concurrency-target-percentage default, written per revision
CPU_HEADROOM = 70  # percent of the knee's CPU the HPA aims at, the same headroom as Knative's utilisation
LOAD_GAUGE = "ts_requests_in_flight"  # KEDA's overload signal: queued or in a batch (docs/engines.md)
ANSWERS = "ts_inference_requests_total"  # KEDA's load signal: its rate, requests answered a second
RATE_WINDOW_S = 60  # the rate's range: four scrapes at SCRAPE_INTERVAL (the simulator reads it too)
RATE_WINDOW = f"{RATE_WINDOW_S // 60}m"
DEFAULT_MAX_REPLICAS = 10
INT32 = 2**31 - 1  # KServe's replica counts and scaleTarget are int32: its webhook cannot decode more
KNATIVE_MAX_CONCURRENCY = 1000  # Knative's config-defaults container-concurrency-max-limit, its webhook's bound
SCRAPE_INTERVAL = "15s"
DURATION = re.compile(r"^(\d+)(s|m|h)$")
POD_LABELS = ("serving.kserve.io/inferenceservice", "component")  # what KServe labels the predictor's pods with
CAPACITY_FILE = "capacity.json"


# ---- the capacity result file ---------------------------------------------------------------------------
def read_capacity(path: str, models: Iterable[str]) -> dict:
    """The capacity result file ``tsctl bench --capacity`` writes, read by ``capacity.load`` (its format and
    keys; ``knee`` and ``within_p99`` what its steps give), and checked for what the export needs besides: a
    knee, ``model`` one of ``models``. Anything else: one UserError line naming the file and key."""
    from ...capacity import sweep

    where = f"--from-bench {path}"
    try:
        data = sweep.load(path)
    except UserError as error:
        raise UserError(f"--from-bench {error}") from None
    if data["knee"] is None:
        raise UserError(f"{where} has no knee (no step answered every request): measure again with fewer clients")
    known = sorted(models)
    if data["model"] not in known:
        raise UserError(
            f"{where} measured model '{data['model']}', which is not in the config's model_snapshot "
            f"({', '.join(known)}): measure the model you export"
        )
    return data


# ---- the plan: every number, and where it came from ----------------------------------------------------
@dataclass
class Autoscaling:
    mode: str
    concurrency: int  # one replica's operating point: requests in flight it is sized for
    min_replicas: int
    max_replicas: int
    scale_down_seconds: int
    capacity: Optional[dict] = None  # the result file read (None: --target by hand)
    step: Optional[dict] = None  # the measured step at the operating point
    step_index: Optional[int] = None
    numbers: Dict[str, object] = field(default_factory=dict)  # the values written, by setting
    sources: List[Tuple[str, str, str]] = field(default_factory=list)  # (setting, value, where it came from)
    model: str = ""
    queries: Dict[str, str] = field(default_factory=dict)  # KEDA's PromQL, by trigger: "rps", "in_flight"
    chosen: str = ""  # what set the operating point: --target, within_p99 or knee
    monitor: str = "podmonitor"  # podmonitor | servicemonitor: how Prometheus finds the pods (``monitor``)
    result_name: str = "RESULT.json"  # the --from-bench file's name, for messages

    def note(self, setting: str, value, source: str):
        self.sources.append((setting, str(value), source))


def check(
    options: ExportOptions, snapshot: dict, target: "targets.Target", notes: List[str], ports: Optional["targets.Ports"]
) -> Optional[Autoscaling]:
    """Every --autoscale flag checked, and the numbers derived; None without --autoscale. One UserError line
    for a bad value: a --target above the measured knee, --min-replicas above --max-replicas, KEDA on an
    engine without the in-flight gauge, a result file unreadable or of another model."""
    if not options.autoscale:
        given = [flag for flag, value in _autoscale_flags(options) if value]
        if given:
            raise UserError(f"{given[0]} sizes the autoscaling: add --autoscale knative|keda|hpa, or drop {given[0]}")
        return None
    mode = options.autoscale
    if mode not in MODES:
        raise UserError(f"--autoscale {mode!r} must be one of {', '.join(MODES)}")
    if mode == "keda" and not target.exports_load_gauge():
        raise UserError(
            f"--autoscale keda scales on the engine's {LOAD_GAUGE} gauge, which {target.title} does not export: "
            "export with --engine tsctl, or use --autoscale knative or hpa"
        )
    chosen_monitor = monitor(options, ports)
    check_names(options, mode, chosen_monitor)
    if options.scale_metric not in SCALE_METRICS or (options.scale_metric != "concurrency" and mode != "knative"):
        raise UserError(
            f"--scale-metric {options.scale_metric} is Knative's (concurrency or rps): use it with --autoscale knative"
        )
    if options.from_bench is None and options.target is None:
        raise UserError(f"--autoscale {mode} needs --from-bench RESULT.json (tsctl bench --capacity) or --target N")
    plan = Autoscaling(mode, 0, *replicas(options, mode), scale_down_seconds=seconds(options.scale_down_delay))
    plan.monitor = chosen_monitor
    if options.from_bench is not None:
        plan.capacity = read_capacity(options.from_bench, snapshot.get("models", {}))
        plan.result_name = Path(options.from_bench).name
        plan.model = plan.capacity["model"]
        operating_point(plan, options.target)
        notes.extend(measured_notes(plan, options, target, snapshot))
    else:
        measured = {"keda": "the answer-rate threshold", "hpa": "the CPU target"}.get(mode)
        if measured or options.scale_metric == "rps":
            what = measured or "the rps target"
            raise UserError(f"--autoscale {mode}: {what} comes from a measured step: give --from-bench RESULT.json")
        if options.target < 1:
            raise UserError(f"--target {options.target} must be a whole number of requests above 0")
        plan.concurrency = options.target
        plan.model = next(iter(snapshot.get("models", {})), "")
    if options.peak_rps is not None:
        peak_replicas(plan, options)
    {"knative": knative_numbers, "keda": keda_numbers, "hpa": hpa_numbers}[mode](plan, options)
    return plan


def monitor(options: ExportOptions, ports: "targets.Ports") -> str:
    """--monitor, by default a PodMonitor where the pod declares its metrics port, else a Service and a
    ServiceMonitor: the Prometheus Operator drops a PodMonitor's target on a port the pod does not declare
    (its CRD's podMetricsEndpoints.portNumber), and KServe's TorchServe pod declares only 8080."""
    chosen = options.monitor or ("podmonitor" if ports.metrics_declared else "servicemonitor")
    if chosen not in MONITORS:
        raise UserError(f"--monitor {chosen!r} must be podmonitor or servicemonitor")
    if chosen == "podmonitor" and not ports.metrics_declared:
        raise UserError(
            f"--monitor podmonitor: the pod does not declare its metrics port {ports.metrics}, and the Prometheus "
            "Operator drops a PodMonitor's target on such a port: use --monitor servicemonitor (this engine's default)"
        )
    return chosen


def check_names(options: ExportOptions, mode: str, monitor: str):
    """What the cluster would refuse of the names the manifests carry: the metrics Service's name (and its
    label) NAME-metrics, a DNS label of 63 characters at most; KEDA's Prometheus address, an http(s) URL."""
    service = f"{options.name}-metrics"
    if monitor == "servicemonitor" and len(service) > 63:
        raise UserError(
            f"--monitor servicemonitor names a Service {service}, {len(service)} characters, above Kubernetes' 63: "
            f"give a --name of {63 - len('-metrics')} characters at most, or --monitor podmonitor"
        )
    if mode == "keda" and not http_address(options.prometheus_url or ""):
        raise UserError(
            f"--prometheus-url {options.prometheus_url!r} is not an address KEDA can query: give "
            "http(s)://HOST[:PORT], e.g. http://prometheus-operated.monitoring.svc:9090"
        )


def http_address(url: str) -> bool:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises)
    except ValueError:
        return False
    quoted = any(c.isspace() or c in "\"'`" for c in url)
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not quoted


def _autoscale_flags(options: ExportOptions) -> List[Tuple[str, object]]:
    return [
        ("--from-bench", options.from_bench),
        ("--target", options.target is not None),
        ("--peak-rps", options.peak_rps is not None),
    ]


def replicas(options: ExportOptions, mode: str) -> Tuple[int, int]:
    low, high = options.min_replicas, options.max_replicas
    high = DEFAULT_MAX_REPLICAS if high is None else high
    floor = 1 if mode == "hpa" else 0  # Knative and KEDA scale to zero; KServe's HPA keeps one
    if low < floor:
        raise UserError(
            f"--min-replicas {low}: --autoscale {mode} keeps at least {floor} replica (scale to zero: knative or keda)"
        )
    if high < 1:
        raise UserError(f"--max-replicas {high} must be at least 1")
    if high > INT32:
        raise UserError(f"--max-replicas {high} is above {INT32}, the most KServe's maxReplicas (int32) takes")
    if low > high:
        raise UserError(f"--min-replicas {low} is above --max-replicas {high}: give a minimum at or below the maximum")
    return low, high


def seconds(delay: str) -> int:
    """--scale-down-delay: Ns, Nm or Nh, at most 1h (Knative's bound for scale-down-delay)."""
    match = DURATION.match(delay or "")
    if not match:
        raise UserError(f"--scale-down-delay {delay!r} must look like 300s, 5m or 1h")
    value = int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]
    if value > 3600:
        raise UserError(f"--scale-down-delay {delay} is above 1h, Knative's limit for scale-down-delay")
    return value


def operating_point(plan: Autoscaling, target: Optional[int]):
    """One replica's concurrency: --target, else the largest step holding the p99 target, else the knee;
    never above the knee (more concurrency there adds queueing, not throughput). The step read for the
    throughput and queue depth is the measured one at that concurrency, or the largest below it."""
    capacity = plan.capacity
    knee = capacity["knee"]["concurrency"]
    where = f"--from-bench {plan.result_name}"
    if target is not None:
        if target < 1:
            raise UserError(f"--target {target} must be a whole number of requests above 0")
        if target > knee:
            raise UserError(
                f"--target {target} is above the measured knee ({knee} concurrent requests, {where}): past it a "
                f"replica answers no faster, requests only wait; give --target {knee} or less"
            )
        plan.concurrency, chosen = target, "--target"
    elif capacity.get("within_p99") is not None:
        within = capacity["within_p99"]["concurrency"]
        plan.concurrency, chosen = min(within, knee), ("within_p99" if within <= knee else "knee below within_p99")
    else:
        plan.concurrency, chosen = knee, "knee"
    below = [(i, s) for i, s in enumerate(capacity["steps"]) if s["concurrency"] <= plan.concurrency]
    if not below:
        first = capacity["steps"][0]["concurrency"]
        raise UserError(f"--target {target} is below the smallest concurrency measured ({first}): measure from 1")
    plan.step_index, plan.step = max(below, key=lambda pair: pair[1]["concurrency"])
    plan.chosen = chosen
    if not 0 < plan.step["throughput_rps"] <= INT32:  # 0: nothing sizes on it; past int32: no scaleTarget
        raise UserError(
            f"{where}: steps[{plan.step_index}] (concurrency {plan.step['concurrency']}) has a "
            f"throughput of {plan.step['throughput_rps']:g} requests/s, which no replica has: measure again"
        )


def step_source(plan: Autoscaling) -> str:
    """Where a number came from: the file, model, engine, date and step."""
    c, step = plan.capacity, plan.step
    target, p99 = c.get("p99_target_ms"), step["p99_ms"]
    held = (
        "" if target is None or p99 is None else (" <=" if p99 <= target else ", above the") + f" {target:g} ms target"
    )
    p99 = f", p99 {p99:g} ms{held}" if p99 is not None else ""
    return (
        f"{CAPACITY_FILE} ({c['model']} on {c['engine']}, measured {c['measured_at']}), steps[{plan.step_index}]: "
        f"concurrency {step['concurrency']}, {step['throughput_rps']:g} rps{p99}"
    )


def chosen_source(plan: Autoscaling) -> str:
    if plan.capacity is None:
        return "--target (by hand, no measurement)"
    c = plan.capacity
    why = {
        "--target": f"--target, at or below the knee ({c['knee']['concurrency']})",
        "within_p99": f"within_p99: the largest concurrency holding p99 <= {c.get('p99_target_ms')} ms",
        "knee": "knee: where more concurrency stops adding throughput (no within_p99 point)",
        "knee below within_p99": f"knee: where more concurrency stops adding throughput, below within_p99's "
        f"{(c.get('within_p99') or {}).get('concurrency')} (past the knee requests only wait)",
    }[plan.chosen]
    return f"{why}; {step_source(plan)}"


def peak_replicas(plan: Autoscaling, options: ExportOptions):
    """--peak-rps R: maxReplicas = ceil(R / one replica's throughput at the operating point)."""
    if plan.capacity is None:
        raise UserError("--peak-rps divides by a measured throughput: give --from-bench RESULT.json")
    if options.max_replicas is not None:
        raise UserError("--peak-rps derives --max-replicas: give one of them")
    per_replica = plan.step["throughput_rps"]
    if not 0 < options.peak_rps < math.inf or per_replica <= 0:
        raise UserError(
            f"--peak-rps {options.peak_rps:g} and the step's throughput ({per_replica:g} rps) must be finite "
            "numbers above 0"
        )
    plan.max_replicas = max(1, math.ceil(options.peak_rps / per_replica))
    if plan.max_replicas > INT32:
        raise UserError(
            f"--peak-rps {options.peak_rps:g} needs {plan.max_replicas} replicas of {per_replica:g} rps, above "
            f"{INT32}, the most KServe's maxReplicas (int32) takes: give the peak you plan for"
        )
    if plan.min_replicas > plan.max_replicas:
        raise UserError(
            f"--min-replicas {plan.min_replicas} is above the {plan.max_replicas} replicas --peak-rps needs"
        )


def common_numbers(plan: Autoscaling, options: ExportOptions):
    plan.note("operating point", f"{plan.concurrency} concurrent requests per replica", chosen_source(plan))
    plan.note("minReplicas", plan.min_replicas, "--min-replicas")
    if options.peak_rps is not None:
        source = (
            f"ceil(--peak-rps {options.peak_rps:g} / {plan.step['throughput_rps']:g} rps per replica): at the peak "
            f"every replica at its operating point, the {100 - UTILIZATION}% headroom of the targets spent"
        )
    else:
        source = (
            "--max-replicas" if options.max_replicas is not None else f"default {DEFAULT_MAX_REPLICAS}, not measured"
        )
    plan.note("maxReplicas", plan.max_replicas, source)


def knative_numbers(plan: Autoscaling, options: ExportOptions):
    if plan.concurrency > KNATIVE_MAX_CONCURRENCY:
        raise UserError(
            f"--autoscale knative: the operating point, {plan.concurrency} concurrent requests, is above "
            f"{KNATIVE_MAX_CONCURRENCY}, Knative's container-concurrency-max-limit (its webhook refuses a larger "
            f"containerConcurrency): give --target {KNATIVE_MAX_CONCURRENCY} or less"
        )
    common_numbers(plan, options)
    plan.numbers["containerConcurrency"] = plan.concurrency
    plan.note(
        "containerConcurrency",
        plan.concurrency,
        "the operating point (a hard limit: more requests wait in queue-proxy)",
    )
    if options.scale_metric == "rps":
        plan.numbers["scaleTarget"] = max(1, math.floor(plan.step["throughput_rps"]))
        plan.note("scaleTarget (rps)", plan.numbers["scaleTarget"], f"the throughput of {step_source(plan)}")
    else:
        plan.numbers["scaleTarget"] = plan.concurrency
        plan.note("scaleTarget (concurrency)", plan.concurrency, "the operating point")
    plan.note(
        "target-utilization-percentage", UTILIZATION, "Knative's default, written: scale up at 70% of scaleTarget"
    )
    plan.note("scale-down-delay", f"{plan.scale_down_seconds}s", "--scale-down-delay (not measured)")


def keda_numbers(plan: Autoscaling, options: ExportOptions):
    """Two triggers, the HPA taking the larger count: the answer rate (grows with the load) against 70% of the
    throughput at the operating point, and the requests in flight (jump when replicas fall behind) against
    70% of it. Why both, and not ts_queue_size: docs/kserve.md, "Autoscaling"."""
    common_numbers(plan, options)
    rps = plan.step["throughput_rps"] * UTILIZATION / 100
    plan.numbers["rps_threshold"] = quantity(rps)
    plan.note(
        f"threshold (rate of {ANSWERS} per replica)",
        plan.numbers["rps_threshold"],
        f"{UTILIZATION}% (Knative's target utilisation) x the throughput of {step_source(plan)}",
    )
    plan.numbers["threshold"] = quantity(plan.concurrency * UTILIZATION / 100)
    plan.note(
        f"threshold ({LOAD_GAUGE} per replica)",
        plan.numbers["threshold"],
        f"{UTILIZATION}% (Knative's target utilisation) x the operating point {plan.concurrency}",
    )
    plan.queries = {"rps": rate_query(options, plan.model), "in_flight": load_query(options, plan.model)}
    plan.note("scale-down stabilizationWindowSeconds", plan.scale_down_seconds, "--scale-down-delay (not measured)")


def quantity(value: float) -> str:
    """A threshold as a Kubernetes quantity, two decimals at most (KServe hands its text to KEDA unchanged)."""
    return f"{max(0.01, round(value, 2)):g}"


def hpa_numbers(plan: Autoscaling, options: ExportOptions):
    common_numbers(plan, options)
    knee = next(s for s in plan.capacity["steps"] if s["concurrency"] == plan.capacity["knee"]["concurrency"])
    share = plan.step["throughput_rps"] / knee["throughput_rps"] if knee["throughput_rps"] > 0 else 1.0
    plan.numbers["cpu"] = min(100, max(1, round(CPU_HEADROOM * min(share, 1.0))))
    plan.note(
        "scaleTarget (cpu %)",
        plan.numbers["cpu"],
        f"{CPU_HEADROOM}% x throughput {plan.step['throughput_rps']:g} / knee's {knee['throughput_rps']:g} rps "
        f"(CPU taken to track throughput, saturated at the knee); {step_source(plan)}",
    )
    plan.note("scale-down stabilizationWindowSeconds", plan.scale_down_seconds, "--scale-down-delay (not measured)")


def _selector(options: ExportOptions, model: str) -> str:
    """The model's series on the predictor's pods (the Prometheus Operator labels every scraped series
    with its namespace and pod)."""
    return f'{{namespace="{options.namespace}",pod=~"{options.name}-predictor-.*",model_name="{model}"}}'


def load_query(options: ExportOptions, model: str) -> str:
    """The PromQL of the in-flight trigger: the model's requests in flight over the predictor's pods."""
    return f"sum({LOAD_GAUGE}{_selector(options, model)})"


def rate_query(options: ExportOptions, model: str) -> str:
    """The PromQL of the answer-rate trigger: the model's requests answered a second over the pods."""
    return f"sum(rate({ANSWERS}{_selector(options, model)}[{RATE_WINDOW}]))"


def check_metrics_config(metrics: Optional[bytes], where: str):
    """KEDA's rate trigger reads ts_inference_requests_total, which the engine exports only if the workers'
    metrics.yaml (the config's ``metrics_config``, ``metrics`` here; None: TorchServe's own, which has it)
    declares it in ``ts_metrics``."""
    import yaml

    if metrics is None:
        return
    doc = yaml.safe_load(metrics)
    groups = doc.get("ts_metrics") if isinstance(doc, dict) else None
    names = {m.get("name") for group in (groups or {}).values() if isinstance(group, list) for m in group
             if isinstance(m, dict)}  # fmt: skip
    if ANSWERS not in names:
        raise UserError(
            f"{where} does not declare {ANSWERS} under ts_metrics, which --autoscale keda scales on: add it "
            "(TorchServe's metrics.yaml has it), or use --autoscale knative or hpa"
        )


# ---- the manifests --------------------------------------------------------------------------------------
def apply(isvc: dict, plan: Autoscaling, options: ExportOptions, ports: "targets.Ports"):
    """The InferenceService's autoscaling: annotations, the predictor's fields, readiness on every worker."""
    annotations = isvc["metadata"].setdefault("annotations", {})
    annotations["serving.kserve.io/deploymentMode"] = "Knative" if plan.mode == "knative" else "Standard"
    annotations["serving.kserve.io/enable-prometheus-scraping"] = "true"
    annotations["prometheus.kserve.io/port"] = str(ports.metrics)
    annotations["prometheus.kserve.io/path"] = "/metrics"
    predictor = isvc["spec"]["predictor"]
    predictor["minReplicas"] = plan.min_replicas
    predictor["maxReplicas"] = plan.max_replicas
    if plan.mode == "knative":
        annotations["autoscaling.knative.dev/target-utilization-percentage"] = str(UTILIZATION)
        annotations["autoscaling.knative.dev/scale-down-delay"] = f"{plan.scale_down_seconds}s"
        predictor["scaleMetric"] = options.scale_metric
        predictor["scaleTarget"] = plan.numbers["scaleTarget"]
        predictor["containerConcurrency"] = plan.numbers["containerConcurrency"]
    elif plan.mode == "keda":
        annotations["serving.kserve.io/autoscalerClass"] = "keda"
        predictor["autoScaling"] = {
            "metrics": [
                external(options, plan.queries["rps"], plan.numbers["rps_threshold"]),
                external(options, plan.queries["in_flight"], plan.numbers["threshold"]),
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": plan.scale_down_seconds}},
        }
    else:
        annotations["serving.kserve.io/autoscalerClass"] = "hpa"
        predictor["scaleMetric"] = "cpu"
        predictor["scaleTarget"] = plan.numbers["cpu"]
        cpu = {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": plan.numbers["cpu"]}}
        predictor["autoScaling"] = {"metrics": [{"type": "Resource", "resource": cpu}], "behavior": hpa_behavior(plan)}
    predictor["model"]["readinessProbe"] = readiness(ports)


def external(options: ExportOptions, query: str, value: str) -> dict:
    metric = {"backend": "prometheus", "serverAddress": options.prometheus_url, "query": query}
    return {"type": "External", "external": {"metric": metric, "target": {"type": "Value", "value": value}}}


def hpa_behavior(plan: Autoscaling) -> dict:
    """Scale up as Kubernetes' HPA does by default (no stabilization; +100% or +4 pods per 15 s, the larger),
    written out; scale down after --scale-down-delay, at most half the replicas a minute."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": 15},
                {"type": "Pods", "value": 4, "periodSeconds": 15},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": plan.scale_down_seconds,
            "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}],
        },
    }


def readiness(ports: "targets.Ports") -> dict:
    """A probe on the engine's /ping, which answers 200 only once every worker of every model is up."""
    return {
        "httpGet": {"path": "/ping", "port": ports.ready},
        "periodSeconds": 5,
        "timeoutSeconds": 2,
        "failureThreshold": 3,
    }


def selector(options: ExportOptions) -> Dict[str, str]:
    return {POD_LABELS[0]: options.name, POD_LABELS[1]: "predictor"}


def manifests(plan: Autoscaling, options: ExportOptions, ports: "targets.Ports") -> Dict[str, dict]:
    """pdb.yaml, and podmonitor.yaml or metrics-service.yaml + servicemonitor.yaml, by file name."""
    meta = {"name": f"{options.name}-predictor", "namespace": options.namespace}
    out = {
        "pdb.yaml": {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": dict(meta),
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": selector(options)},
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
        }
    }
    if plan.monitor == "podmonitor":
        endpoint = {"portNumber": ports.metrics, "path": "/metrics", "interval": SCRAPE_INTERVAL}
        out["podmonitor.yaml"] = {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": dict(meta),
            "spec": {"selector": {"matchLabels": selector(options)}, "podMetricsEndpoints": [endpoint]},
        }
        return out
    labels = {"app.kubernetes.io/name": f"{options.name}-metrics"}
    out["metrics-service.yaml"] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{options.name}-metrics", "namespace": options.namespace, "labels": labels},
        "spec": {
            "clusterIP": "None",
            "selector": selector(options),
            "ports": [{"name": "metrics", "port": ports.metrics, "targetPort": ports.metrics, "protocol": "TCP"}],
        },
    }
    endpoint = {"port": "metrics", "path": "/metrics", "interval": SCRAPE_INTERVAL}
    out["servicemonitor.yaml"] = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": dict(meta),
        "spec": {"selector": {"matchLabels": labels}, "endpoints": [endpoint]},
    }
    return out


def kserve_scaled_object(isvc: dict) -> dict:
    """The ScaledObject KServe makes from a keda InferenceService (kserve/kserve, pkg/controller/v1beta1/
    inferenceservice/reconcilers/keda/keda_reconciler.go: a prometheus trigger of the External metric's
    serverAddress, query and threshold, min/maxReplicaCount, the scale-down stabilization window), so that
    the export validates it against KEDA's CRD too."""
    predictor = isvc["spec"]["predictor"]
    name = f"{isvc['metadata']['name']}-predictor"
    triggers = []
    for metric in predictor["autoScaling"]["metrics"]:
        source = metric["external"]["metric"]
        value = str(metric["external"]["target"]["value"])  # getOriginalStringMQ: the text as written
        meta = {"serverAddress": source["serverAddress"], "query": source["query"], "threshold": value}
        triggers.append({"type": source["backend"], "metadata": meta})
    spec = {
        "scaleTargetRef": {"name": name},
        "triggers": triggers,
        "minReplicaCount": predictor["minReplicas"],
        "maxReplicaCount": max(predictor["maxReplicas"], predictor["minReplicas"]),
    }
    window = predictor["autoScaling"].get("behavior", {}).get("scaleDown", {}).get("stabilizationWindowSeconds")
    if window is not None:
        behavior = {"scaleDown": {"stabilizationWindowSeconds": window}}
        spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": behavior}}
    meta = {"name": name, "namespace": isvc["metadata"]["namespace"]}
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": meta, "spec": spec}


def validated(plan: Autoscaling, isvc: dict, extra: Dict[str, dict]) -> List[Tuple[str, dict]]:
    """What to check against the CRDs beside the InferenceService: the extra manifests but the Service
    (core v1, no schema here), and with keda the ScaledObject KServe will make."""
    checked = [(name, manifest) for name, manifest in extra.items() if manifest["kind"] != "Service"]
    if plan.mode == "keda":
        checked.append(("the ScaledObject KServe makes from inferenceservice.yaml", kserve_scaled_object(isvc)))
    return checked


# ---- the result file beside the manifests -----------------------------------------------------------------
def capacity_copy(plan: Optional[Autoscaling]) -> Optional[bytes]:
    """OUT/capacity.json: the result the numbers came from, as read (DEPLOY.md names it)."""
    if plan is None or plan.capacity is None:
        return None
    return (json.dumps(plan.capacity, indent=2) + "\n").encode("utf-8")
