"""The numbers ``tsctl export kserve --autoscale`` writes, each with where it came from, and what the
autoscaling simulator (archiver/autoscaling/autoscale_sim.py) computes them with: the plan (``Autoscaling``), one
replica's operating point on a measured capacity curve (``operating_point``), the replica bounds
(``peak_replicas``) and the numbers every mode shares (``common_numbers``). Each mode's own numbers are its
object's (autoscale_modes.py); what the export writes of them, autoscale.py.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ...errors import UserError
from ..options import Service

UTILIZATION = 70  # percent: Knative's container-concurrency-target-percentage default, written per revision
CPU_HEADROOM = 70  # percent of the knee's CPU the HPA aims at, the same headroom as Knative's utilisation
LOAD_GAUGE = "ts_requests_in_flight"  # KEDA's overload signal: queued or in a batch (docs/engines.md)
ANSWERS = "ts_inference_requests_total"  # KEDA's load signal: its rate, requests answered a second
RATE_WINDOW_S = 60  # the rate's range: four scrapes at SCRAPE_INTERVAL (the simulator reads it too)
RATE_WINDOW = f"{RATE_WINDOW_S // 60}m"
SCRAPE_INTERVAL = "15s"
DEFAULT_MAX_REPLICAS = 10
INT32 = 2**31 - 1  # KServe's replica counts and scaleTarget are int32: its webhook cannot decode more
KNATIVE_MAX_CONCURRENCY = 1000  # Knative's config-defaults container-concurrency-max-limit, its webhook's bound
CAPACITY_FILE = "capacity.json"


@dataclass
class Autoscaling:
    mode: object  # an autoscale_modes.Mode: Knative, KEDA, HPA, or NO_AUTOSCALING
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
    service: Optional[Service] = None  # the InferenceService scaled: its manifests' names and KEDA's queries
    scale_metric: str = "concurrency"  # Knative's metric: concurrency | rps
    prometheus_url: str = ""  # what KEDA queries
    peak_rps: Optional[float] = None  # --peak-rps: the load maxReplicas is sized for
    max_given: bool = False  # --max-replicas was given (else DEFAULT_MAX_REPLICAS or --peak-rps's)

    def note(self, setting: str, value, source: str):
        self.sources.append((setting, str(value), source))


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


def peak_replicas(plan: Autoscaling):
    """--peak-rps R: maxReplicas = ceil(R / one replica's throughput at the operating point)."""
    if plan.capacity is None:
        raise UserError("--peak-rps divides by a measured throughput: give --from-bench RESULT.json")
    if plan.max_given:
        raise UserError("--peak-rps derives --max-replicas: give one of them")
    per_replica = plan.step["throughput_rps"]
    if not 0 < plan.peak_rps < math.inf or per_replica <= 0:
        raise UserError(
            f"--peak-rps {plan.peak_rps:g} and the step's throughput ({per_replica:g} rps) must be finite "
            "numbers above 0"
        )
    plan.max_replicas = max(1, math.ceil(plan.peak_rps / per_replica))
    if plan.max_replicas > INT32:
        raise UserError(
            f"--peak-rps {plan.peak_rps:g} needs {plan.max_replicas} replicas of {per_replica:g} rps, above "
            f"{INT32}, the most KServe's maxReplicas (int32) takes: give the peak you plan for"
        )
    if plan.min_replicas > plan.max_replicas:
        raise UserError(
            f"--min-replicas {plan.min_replicas} is above the {plan.max_replicas} replicas --peak-rps needs"
        )


def common_numbers(plan: Autoscaling):
    plan.note("operating point", f"{plan.concurrency} concurrent requests per replica", chosen_source(plan))
    plan.note("minReplicas", plan.min_replicas, "--min-replicas")
    if plan.peak_rps is not None:
        source = (
            f"ceil(--peak-rps {plan.peak_rps:g} / {plan.step['throughput_rps']:g} rps per replica): at the peak "
            f"every replica at its operating point, the {100 - UTILIZATION}% headroom of the targets spent"
        )
    else:
        source = "--max-replicas" if plan.max_given else f"default {DEFAULT_MAX_REPLICAS}, not measured"
    plan.note("maxReplicas", plan.max_replicas, source)


def quantity(value: float) -> str:
    """A threshold as a Kubernetes quantity, two decimals at most (KServe hands its text to KEDA unchanged)."""
    return f"{max(0.01, round(value, 2)):g}"
