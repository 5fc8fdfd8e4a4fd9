"""The ways ``tsctl export kserve --autoscale MODE`` scales the predictor, each an object owning what differs
between them: its refusals, its numbers, what it writes into the InferenceService, what the export validates
beside it, its DEPLOY.md section (templates/kserve-autoscale-MODE.md) and whether KServe's canary runs on it.

    knative   Knative mode (KPA): scaleMetric concurrency|rps, scaleTarget, containerConcurrency, the
              target-utilization-percentage and scale-down-delay annotations; scales to zero; canaries
    keda      Standard mode, autoscalerClass keda: two External metrics (Prometheus queries over the
              predictor's pods), the HPA taking the larger count: the answer rate against 70% of the measured
              throughput at the operating point, the engine's in-flight gauge against 70% of the operating point
    hpa       Standard mode, autoscalerClass hpa: scaleMetric cpu, its target and behavior; keeps one replica

``NO_AUTOSCALING`` stands for an export without --autoscale: the export asks it what it asks the others, and
it adds nothing. ``named`` gives the object of a mode's name.
"""

import math
from typing import Dict, List, Optional, Tuple

from ...errors import UserError
from ..options import ExportOptions, Service
from .autoscale_numbers import (
    ANSWERS,
    CAPACITY_FILE,
    CPU_HEADROOM,
    KNATIVE_MAX_CONCURRENCY,
    LOAD_GAUGE,
    RATE_WINDOW,
    UTILIZATION,
    Autoscaling,
    common_numbers,
    quantity,
    step_source,
)

SCALE_METRICS = ("concurrency", "rps")  # Knative's KPA metrics (--scale-metric)


class Mode:
    """What one mode does; the base is what every mode shares."""

    name = ""
    scales = True  # False: no --autoscale, nothing written
    deploy_steps = 1  # the headings its DEPLOY.md section adds
    deployment_mode = "Standard"  # KServe's serving.kserve.io/deploymentMode
    floor = 1  # the fewest replicas it keeps (0: it scales to zero)
    scale_metrics: Tuple[str, ...] = ("concurrency",)  # the --scale-metric values it takes
    canary = False  # KServe's canary needs Knative's revisions
    crds: Tuple[str, ...] = ()  # what must be in the cluster beside the monitor's CRD

    def __str__(self) -> str:
        return self.name

    def check(self, options: ExportOptions, target) -> None:
        """Its own refusals of the flags, before anything is read."""

    def measured(self, options: ExportOptions) -> Optional[str]:
        """What of its numbers needs a measurement (--from-bench), None when --target alone sizes it."""
        return None

    def numbers(self, plan: Autoscaling) -> None:
        common_numbers(plan)

    def apply(self, annotations: dict, predictor: dict, plan: Autoscaling) -> None:
        """Its annotations and the predictor's fields."""

    def validated(self, isvc: dict) -> List[Tuple[str, dict]]:
        """What else the export checks against the CRDs because of it."""
        return []

    def check_metrics(self, metrics: Optional[bytes], where: str) -> None:
        """Its needs of the workers' metrics.yaml (the config's ``metrics_config``)."""

    def check_canary(self, isvc: dict) -> None:
        if not self.canary:
            raise UserError(
                f"--canary needs KServe's Knative mode (revisions; older KServe calls it Serverless), but --autoscale "
                f"{self.name} deploys in Standard mode, which has no canary: use --autoscale knative, or drop --canary"
            )

    def check_line(self, service: Service, ns: str) -> str:
        """DEPLOY.md's command that shows what the autoscaler made of the InferenceService."""
        return f"kubectl get hpa {ns} {service.name}-predictor -o yaml"

    # ---- DEPLOY.md ----
    def prerequisites(self, plan: Autoscaling) -> List[str]:
        """What must be in the cluster before the autoscaling's files apply: the Prometheus Operator's CRD of
        the monitor, and the mode's own."""
        return [f"kubectl get crd {name}" for name in (f"{plan.monitor}s.monitoring.coreos.com", *self.crds)]

    def apply_lines(self, plan: Autoscaling, ns: str) -> List[str]:
        files = ["pdb.yaml"] + (
            ["podmonitor.yaml"] if plan.monitor == "podmonitor" else ["metrics-service.yaml", "servicemonitor.yaml"]
        )
        return [f"kubectl apply {ns} -f {name}" for name in files]

    def section(self, plan: Autoscaling, ns: str) -> str:
        """DEPLOY.md's "Autoscaling" section (templates/kserve-autoscale-MODE.md): the numbers, each with its
        source."""
        from ..core import lines, render

        rows = [f"| {setting} | {value} | {source} |" for setting, value, source in plan.sources]
        return render(
            f"kserve-autoscale-{self.name}",
            name=plan.service.name,
            rows=lines(rows),
            capacity=CAPACITY_FILE if plan.capacity else "no result file (--target by hand)",
            simulate=self.simulate_line(plan),
            check=self.check_line(plan.service, ns),
            monitor=f"kubectl get {plan.monitor} {ns} {plan.service.name}-predictor",
            rate_query=plan.queries.get("rps", ""),
            load_query=plan.queries.get("in_flight", ""),
            prometheus=plan.prometheus_url,
            min_replicas=plan.min_replicas,
        )

    def simulate_line(self, plan: Autoscaling) -> str:
        """The section's pointer to ``tsctl simulate`` on the result copied beside it (none without a result)."""
        if plan.capacity is None:
            return ""
        return (
            f"What these numbers do under a ramp, a spike and a day of load, before a cluster sees them: "
            f"`tsctl simulate {CAPACITY_FILE} --autoscale {self.name}` here, with `--start-seconds` set to "
            'how long a new pod takes to be ready on your cluster (docs/kserve.md, "Before a cluster sees them").\n\n'
        )


class NoAutoscaling(Mode):
    """An export without --autoscale: KServe's own defaults, nothing written, nothing in DEPLOY.md."""

    scales = False
    deploy_steps = 0
    floor = 0  # KServe's own autoscaler: minReplicas 0 scales the predictor to zero
    canary = True  # the InferenceService's deployment mode is the cluster's default

    def check_canary(self, isvc: dict) -> None:
        pass

    def numbers(self, plan: Autoscaling) -> None:
        pass

    def prerequisites(self, plan: Autoscaling) -> List[str]:
        return []

    def apply_lines(self, plan: Autoscaling, ns: str) -> List[str]:
        return []

    def section(self, plan: Autoscaling, ns: str) -> str:
        return ""


class Knative(Mode):
    name = "knative"
    deployment_mode = "Knative"
    floor = 0
    scale_metrics = SCALE_METRICS
    canary = True

    def measured(self, options: ExportOptions) -> Optional[str]:
        return "the rps target" if options.scale_metric == "rps" else None

    def numbers(self, plan: Autoscaling) -> None:
        if plan.concurrency > KNATIVE_MAX_CONCURRENCY:
            raise UserError(
                f"--autoscale knative: the operating point, {plan.concurrency} concurrent requests, is above "
                f"{KNATIVE_MAX_CONCURRENCY}, Knative's container-concurrency-max-limit (its webhook refuses a larger "
                f"containerConcurrency): give --target {KNATIVE_MAX_CONCURRENCY} or less"
            )
        common_numbers(plan)
        plan.numbers["containerConcurrency"] = plan.concurrency
        plan.note(
            "containerConcurrency",
            plan.concurrency,
            "the operating point (a hard limit: more requests wait in queue-proxy)",
        )
        if plan.scale_metric == "rps":
            plan.numbers["scaleTarget"] = max(1, math.floor(plan.step["throughput_rps"]))
            plan.note("scaleTarget (rps)", plan.numbers["scaleTarget"], f"the throughput of {step_source(plan)}")
        else:
            plan.numbers["scaleTarget"] = plan.concurrency
            plan.note("scaleTarget (concurrency)", plan.concurrency, "the operating point")
        plan.note(
            "target-utilization-percentage", UTILIZATION, "Knative's default, written: scale up at 70% of scaleTarget"
        )
        plan.note("scale-down-delay", f"{plan.scale_down_seconds}s", "--scale-down-delay (not measured)")

    def apply(self, annotations: dict, predictor: dict, plan: Autoscaling) -> None:
        annotations["autoscaling.knative.dev/target-utilization-percentage"] = str(UTILIZATION)
        annotations["autoscaling.knative.dev/scale-down-delay"] = f"{plan.scale_down_seconds}s"
        predictor["scaleMetric"] = plan.scale_metric
        predictor["scaleTarget"] = plan.numbers["scaleTarget"]
        predictor["containerConcurrency"] = plan.numbers["containerConcurrency"]

    def check_canary(self, isvc: dict) -> None:
        if isvc["spec"]["predictor"].get("minReplicas") == 0:
            raise UserError(
                "--canary with --min-replicas 0: Knative scales the candidate's revision to zero while it has none "
                "of the traffic (the shadow step), and tsctl shadow finds no pod to compare: give --min-replicas 1 "
                "or more"
            )

    def check_line(self, service: Service, ns: str) -> str:
        return f"kubectl get podautoscaler {ns} -l serving.kserve.io/inferenceservice={service.name}"


class Keda(Mode):
    """Two triggers, the HPA taking the larger count: the answer rate (grows with the load) against 70% of the
    throughput at the operating point, and the requests in flight (jump when replicas fall behind) against
    70% of it. Why both, and not ts_queue_size: docs/kserve.md, "Autoscaling"."""

    name = "keda"
    floor = 0
    crds = ("scaledobjects.keda.sh",)  # KServe makes a ScaledObject of the InferenceService

    def check(self, options: ExportOptions, target) -> None:
        if not target.exports_load_gauge():
            raise UserError(
                f"--autoscale keda scales on the engine's {LOAD_GAUGE} gauge, which {target.title} does not export: "
                "export with --engine tsctl, or use --autoscale knative or hpa"
            )
        if not http_address(options.prometheus_url or ""):
            raise UserError(
                f"--prometheus-url {options.prometheus_url!r} is not an address KEDA can query: give "
                "http(s)://HOST[:PORT], e.g. http://prometheus-operated.monitoring.svc:9090"
            )

    def measured(self, options: ExportOptions) -> Optional[str]:
        return "the answer-rate threshold"

    def numbers(self, plan: Autoscaling) -> None:
        common_numbers(plan)
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
        plan.queries = {"rps": rate_query(plan.service, plan.model), "in_flight": load_query(plan.service, plan.model)}
        plan.note("scale-down stabilizationWindowSeconds", plan.scale_down_seconds, "--scale-down-delay (not measured)")

    def apply(self, annotations: dict, predictor: dict, plan: Autoscaling) -> None:
        annotations["serving.kserve.io/autoscalerClass"] = "keda"
        predictor["autoScaling"] = {
            "metrics": [
                external(plan.prometheus_url, plan.queries["rps"], plan.numbers["rps_threshold"]),
                external(plan.prometheus_url, plan.queries["in_flight"], plan.numbers["threshold"]),
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": plan.scale_down_seconds}},
        }

    def validated(self, isvc: dict) -> List[Tuple[str, dict]]:
        return [("the ScaledObject KServe makes from inferenceservice.yaml", kserve_scaled_object(isvc))]

    def check_metrics(self, metrics: Optional[bytes], where: str) -> None:
        """KEDA's rate trigger reads ts_inference_requests_total, which the engine exports only if the workers'
        metrics.yaml (``metrics``; None: TorchServe's own, which has it) declares it in ``ts_metrics``."""
        import yaml

        if metrics is None:
            return
        doc = yaml.safe_load(metrics)
        groups = doc.get("ts_metrics") if isinstance(doc, dict) else None
        declared = [m for group in (groups or {}).values() if isinstance(group, list) for m in group]
        if ANSWERS not in {m.get("name") for m in declared if isinstance(m, dict)}:
            raise UserError(
                f"{where} does not declare {ANSWERS} under ts_metrics, which --autoscale keda scales on: add it "
                "(TorchServe's metrics.yaml has it), or use --autoscale knative or hpa"
            )

    def check_line(self, service: Service, ns: str) -> str:
        return f"kubectl get scaledobject {ns} {service.name}-predictor -o yaml"


class Hpa(Mode):
    name = "hpa"

    def measured(self, options: ExportOptions) -> Optional[str]:
        return "the CPU target"

    def numbers(self, plan: Autoscaling) -> None:
        common_numbers(plan)
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

    def apply(self, annotations: dict, predictor: dict, plan: Autoscaling) -> None:
        annotations["serving.kserve.io/autoscalerClass"] = "hpa"
        predictor["scaleMetric"] = "cpu"
        predictor["scaleTarget"] = plan.numbers["cpu"]
        cpu = {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": plan.numbers["cpu"]}}
        predictor["autoScaling"] = {"metrics": [{"type": "Resource", "resource": cpu}], "behavior": hpa_behavior(plan)}


# ---- what the modes write ----
def _selector(service: Service, model: str) -> str:
    """The model's series on the predictor's pods (the Prometheus Operator labels every scraped series
    with its namespace and pod)."""
    return f'{{namespace="{service.namespace}",pod=~"{service.name}-predictor-.*",model_name="{model}"}}'


def load_query(service: Service, model: str) -> str:
    """The PromQL of the in-flight trigger: the model's requests in flight over the predictor's pods."""
    return f"sum({LOAD_GAUGE}{_selector(service, model)})"


def rate_query(service: Service, model: str) -> str:
    """The PromQL of the answer-rate trigger: the model's requests answered a second over the pods."""
    return f"sum(rate({ANSWERS}{_selector(service, model)}[{RATE_WINDOW}]))"


def external(prometheus_url: str, query: str, value: str) -> dict:
    metric = {"backend": "prometheus", "serverAddress": prometheus_url, "query": query}
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


def http_address(url: str) -> bool:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises)
    except ValueError:
        return False
    quoted = any(c.isspace() or c in "\"'`" for c in url)
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not quoted


NO_AUTOSCALING = NoAutoscaling()
MODES: Dict[str, Mode] = {mode.name: mode for mode in (Knative(), Keda(), Hpa())}


def named(name: str) -> Mode:
    """The mode --autoscale names; a UserError for any other name."""
    if name not in MODES:
        raise UserError(f"--autoscale {name!r} must be one of {', '.join(MODES)}")
    return MODES[name]
