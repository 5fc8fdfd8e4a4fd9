"""``tsctl export kserve --autoscale knative|keda|hpa``: the InferenceService's autoscaling, sized from one
replica's measured capacity (``--from-bench RESULT.json``, written by ``tsctl bench --capacity``; or
``--target N`` by hand), and what every mode adds beside it: a readiness probe on the engine's every-worker
endpoint (/ping), the prometheus.kserve.io annotations, OUT/pdb.yaml (policy/v1 PodDisruptionBudget),
OUT/podmonitor.yaml or OUT/metrics-service.yaml + OUT/servicemonitor.yaml (--monitor), OUT/capacity.json (the
result read). What each mode writes of its own is its object's (autoscale_modes.py); the numbers and their
sources, autoscale_numbers.py.

The rule each number follows, and the documents it rests on, are in docs/kserve.md ("Autoscaling"); DEPLOY.md
names, for each number, the measurement it came from (file, model, date, step). ``check`` refuses bad values in
one line before anything is written and makes the plan (without --autoscale, ``NO_AUTOSCALING``'s, which adds
nothing); ``apply`` and ``manifests`` build what ``kserve.export`` validates and writes.
"""

import json
import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from ...errors import UserError
from ..options import ExportOptions, Service
from . import autoscale_modes, targets
from .autoscale_modes import NO_AUTOSCALING, Mode
from .autoscale_numbers import (
    DEFAULT_MAX_REPLICAS,
    INT32,
    SCRAPE_INTERVAL,
    Autoscaling,
    operating_point,
    peak_replicas,
)
from .measured_notes import measured_notes

MONITORS = ("podmonitor", "servicemonitor")
DURATION = re.compile(r"^(\d+)(s|m|h)$")
POD_LABELS = ("serving.kserve.io/inferenceservice", "component")  # what KServe labels the predictor's pods with


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
def check(
    options: ExportOptions, snapshot: dict, target: "targets.Target", notes: List[str], ports: Optional["targets.Ports"]
) -> Autoscaling:
    """Every --autoscale flag checked, and the numbers derived; without --autoscale, KServe's own bounds checked
    and NO_AUTOSCALING's plan. One UserError line for a bad value: a --target above the measured knee,
    --min-replicas above --max-replicas, KEDA on an engine without the in-flight gauge, a result file unreadable
    or of another model."""
    if not options.autoscale:
        return unscaled(options)
    mode = autoscale_modes.named(options.autoscale)
    chosen_monitor = monitor(options.monitor, ports)
    check_service_name(options.name, chosen_monitor)
    mode.check(options, target)
    if options.scale_metric not in mode.scale_metrics:
        raise UserError(
            f"--scale-metric {options.scale_metric} is Knative's (concurrency or rps): use it with --autoscale knative"
        )
    if options.from_bench is None and options.target is None:
        raise UserError(f"--autoscale {mode} needs --from-bench RESULT.json (tsctl bench --capacity) or --target N")
    plan = Autoscaling(mode, 0, *replicas(options, mode), scale_down_seconds=seconds(options.scale_down_delay))
    plan.monitor, plan.service = chosen_monitor, options.service
    plan.scale_metric, plan.prometheus_url = options.scale_metric, options.prometheus_url
    plan.peak_rps, plan.max_given = options.peak_rps, options.max_replicas is not None
    if options.from_bench is not None:
        plan.capacity = read_capacity(options.from_bench, snapshot.get("models", {}))
        plan.result_name = Path(options.from_bench).name
        plan.model = plan.capacity["model"]
        operating_point(plan, options.target)
        notes.extend(measured_notes(plan, options.pod, target, snapshot))
    else:
        measured = mode.measured(options)
        if measured:
            raise UserError(f"--autoscale {mode}: {measured} comes from a measured step: give --from-bench RESULT.json")
        if options.target < 1:
            raise UserError(f"--target {options.target} must be a whole number of requests above 0")
        plan.concurrency = options.target
        plan.model = next(iter(snapshot.get("models", {})), "")
    if options.peak_rps is not None:
        peak_replicas(plan)
    mode.numbers(plan)
    return plan


def unscaled(options: ExportOptions) -> Autoscaling:
    """Without --autoscale: no flag that sizes the autoscaling, and --min-replicas and --max-replicas within
    KServe's own autoscaler's bounds (minReplicas 0 lets the predictor scale to zero)."""
    given = [flag for flag, value in _autoscale_flags(options) if value]
    if given:
        raise UserError(f"{given[0]} sizes the autoscaling: add --autoscale knative|keda|hpa, or drop {given[0]}")
    if not 0 <= options.min_replicas <= INT32:
        raise UserError(
            f"--min-replicas {options.min_replicas} must be 0 or more (KServe's minReplicas, an int32; 0 lets the "
            "predictor scale to zero): give the fewest replicas to keep running, e.g. --min-replicas 2"
        )
    low, high = options.min_replicas, options.max_replicas
    if high is not None:
        low, high = replicas(options, NO_AUTOSCALING)
    plan = Autoscaling(NO_AUTOSCALING, 0, low, high or DEFAULT_MAX_REPLICAS, 0, service=options.service)
    plan.max_given = high is not None  # KServe's default autoscaler's bound, written only when given
    return plan


def monitor(given: Optional[str], ports: "targets.Ports") -> str:
    """--monitor, by default a PodMonitor where the pod declares its metrics port, else a Service and a
    ServiceMonitor: the Prometheus Operator drops a PodMonitor's target on a port the pod does not declare
    (its CRD's podMetricsEndpoints.portNumber), and KServe's TorchServe pod declares only 8080."""
    chosen = given or ("podmonitor" if ports.metrics_declared else "servicemonitor")
    if chosen not in MONITORS:
        raise UserError(f"--monitor {chosen!r} must be podmonitor or servicemonitor")
    if chosen == "podmonitor" and not ports.metrics_declared:
        raise UserError(
            f"--monitor podmonitor: the pod does not declare its metrics port {ports.metrics}, and the Prometheus "
            "Operator drops a PodMonitor's target on such a port: use --monitor servicemonitor (this engine's default)"
        )
    return chosen


def check_service_name(name: str, monitor: str):
    """The metrics Service's name (and its label) NAME-metrics, as the cluster takes it: a DNS label of 63
    characters at most."""
    service = f"{name}-metrics"
    if monitor == "servicemonitor" and len(service) > 63:
        raise UserError(
            f"--monitor servicemonitor names a Service {service}, {len(service)} characters, above Kubernetes' 63: "
            f"give a --name of {63 - len('-metrics')} characters at most, or --monitor podmonitor"
        )


def _autoscale_flags(options: ExportOptions) -> List[Tuple[str, object]]:
    return [
        ("--from-bench", options.from_bench),
        ("--target", options.target is not None),
        ("--peak-rps", options.peak_rps is not None),
    ]


def replicas(options: ExportOptions, mode: Mode) -> Tuple[int, int]:
    low, high = options.min_replicas, options.max_replicas
    high = DEFAULT_MAX_REPLICAS if high is None else high
    if low < mode.floor:  # Knative and KEDA scale to zero; KServe's HPA keeps one
        raise UserError(
            f"--min-replicas {low}: --autoscale {mode} keeps at least {mode.floor} replica (scale to zero: knative "
            "or keda)"
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


# ---- the manifests --------------------------------------------------------------------------------------
def apply(isvc: dict, plan: Autoscaling, ports: "targets.Ports"):
    """The InferenceService's autoscaling: annotations, the predictor's fields, readiness on every worker; the
    mode's own (``Mode.apply``). Nothing without --autoscale."""
    if not plan.mode.scales:
        return
    annotations = isvc["metadata"].setdefault("annotations", {})
    annotations["serving.kserve.io/deploymentMode"] = plan.mode.deployment_mode
    annotations["serving.kserve.io/enable-prometheus-scraping"] = "true"
    annotations["prometheus.kserve.io/port"] = str(ports.metrics)
    annotations["prometheus.kserve.io/path"] = "/metrics"
    predictor = isvc["spec"]["predictor"]
    predictor["minReplicas"] = plan.min_replicas
    predictor["maxReplicas"] = plan.max_replicas
    plan.mode.apply(annotations, predictor, plan)
    predictor["model"]["readinessProbe"] = readiness(ports)


def readiness(ports: "targets.Ports") -> dict:
    """A probe on the engine's /ping, which answers 200 only once every worker of every model is up."""
    return {
        "httpGet": {"path": "/ping", "port": ports.ready},
        "periodSeconds": 5,
        "timeoutSeconds": 2,
        "failureThreshold": 3,
    }


def selector(service: Service) -> Dict[str, str]:
    return {POD_LABELS[0]: service.name, POD_LABELS[1]: "predictor"}


def manifests(plan: Autoscaling, ports: "targets.Ports") -> Dict[str, dict]:
    """pdb.yaml, and podmonitor.yaml or metrics-service.yaml + servicemonitor.yaml, by file name; none without
    --autoscale."""
    if not plan.mode.scales:
        return {}
    service = plan.service
    meta = {"name": f"{service.name}-predictor", "namespace": service.namespace}
    out = {
        "pdb.yaml": {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": dict(meta),
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": selector(service)},
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
            "spec": {"selector": {"matchLabels": selector(service)}, "podMetricsEndpoints": [endpoint]},
        }
        return out
    labels = {"app.kubernetes.io/name": f"{service.name}-metrics"}
    out["metrics-service.yaml"] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{service.name}-metrics", "namespace": service.namespace, "labels": labels},
        "spec": {
            "clusterIP": "None",
            "selector": selector(service),
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


def validated(plan: Autoscaling, isvc: dict, extra: Dict[str, dict]) -> List[Tuple[str, dict]]:
    """What to check against the CRDs beside the InferenceService: the extra manifests but the Service
    (core v1, no schema here), and what the mode makes of the InferenceService (KEDA: its ScaledObject)."""
    checked = [(name, manifest) for name, manifest in extra.items() if manifest["kind"] != "Service"]
    return checked + plan.mode.validated(isvc)


# ---- the result file beside the manifests -----------------------------------------------------------------
def capacity_copy(plan: Autoscaling) -> Optional[bytes]:
    """OUT/capacity.json: the result the numbers came from, as read (DEPLOY.md names it); None without one."""
    if plan.capacity is None:
        return None
    return (json.dumps(plan.capacity, indent=2) + "\n").encode("utf-8")
