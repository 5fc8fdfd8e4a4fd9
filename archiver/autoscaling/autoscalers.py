"""The autoscalers the simulator (autoscale_sim.py) runs, as their sources state them: Knative's Pod
Autoscaler (``KPA``) on concurrency, Kubernetes' HPA (``HPA``: on CPU, or on KEDA's external metrics, since
KEDA makes an HPA) and ``Fixed`` replicas. Each decides, at its ``interval``, a replica count from what it
has ``Seen``; each rule is cited where it is coded (knative/serving at 98e5ef90; Kubernetes' HPA
documentation, https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/, and
kubernetes/kubernetes' pkg/apis/autoscaling/v2/defaults.go at 1adaa753).
"""

import math
from collections import deque
from dataclasses import dataclass
from typing import Dict, Optional

# ---- Knative's KPA: config/core/configmaps/autoscaler.yaml (defaults) and pkg/autoscaler -----------------
KPA_TICK_S = 2.0  # pkg/autoscaler/scaling/multiscaler.go:36 tickInterval
STABLE_WINDOW_S = 60.0  # autoscaler.yaml:105 stable-window
PANIC_WINDOW_PERCENT = 10.0  # autoscaler.yaml:115 panic-window-percentage (of the stable window)
PANIC_THRESHOLD = 2.0  # autoscaler.yaml:119 panic-threshold-percentage 200; decider.go:57 divides by 100
TARGET_UTILIZATION = 0.70  # autoscaler.yaml:58 container-concurrency-target-percentage (the export writes 70)
MAX_SCALE_UP_RATE = 1000.0  # autoscaler.yaml:128
MAX_SCALE_DOWN_RATE = 2.0  # autoscaler.yaml:137
ACTIVATOR_QUEUE = 10000  # pkg/activator/net/throttler.go:55 breakerQueueDepth
QUEUE_PROXY_DEPTH = 10  # pkg/queue/sharedmain/main.go:413 queueDepth = 10 * ContainerConcurrency
# ---- Kubernetes' HPA (and KEDA, which makes one): the HPA documentation, "Algorithm details" -------------
HPA_SYNC_S = 15.0  # --horizontal-pod-autoscaler-sync-period, default 15 s
HPA_TOLERANCE = 0.1  # "within a globally-configurable tolerance, 0.1 by default"
HPA_DOWN_WINDOW_S = 300.0  # --horizontal-pod-autoscaler-downscale-stabilization, default 5 minutes
# "Default Behavior"; pkg/apis/autoscaling/v2/defaults.go:27-65: (type, value, periodSeconds), selectPolicy Max
HPA_UP_POLICIES = (("Pods", 4, 15), ("Percent", 100, 15))
HPA_DOWN_POLICIES = (("Percent", 100, 15),)
METRICS_WINDOW_S = 15.0  # the CPU the HPA reads: averaged over metrics-server's 15 s resolution (assumed)
SCRAPE_S = 15.0  # the gauge KEDA's query reads: Prometheus' scrape interval (the export's PodMonitor)


@dataclass
class Seen:
    """What an autoscaler reads at a decision: replicas asked for, ready, and the metric history."""

    now: float
    replicas: int  # pods asked for (ready or starting)
    ready: int
    concurrency: deque  # (t, requests in the revision: in replicas or waiting), one a second
    cpu: deque  # (t, mean CPU share of the ready replicas, 0-1)
    queue: float  # the queue gauge summed over the replicas at the last scrape
    in_flight: float = 0.0  # ts_requests_in_flight summed over the replicas at the last scrape
    served_rps: float = 0.0  # rate(ts_inference_requests_total[1m]) summed, as of the last scrape


class Fixed:
    """No autoscaling: ``replicas`` replicas all along (the check against real replicas)."""

    interval = 1e9
    mode = "fixed"

    def __init__(self, replicas: int):
        self.min_replicas = self.max_replicas = replicas

    def desired(self, seen: Seen) -> int:
        return self.min_replicas


class KPA:
    """Knative's Pod Autoscaler on concurrency, as pkg/autoscaler/scaling/autoscaler.go's Scale does it."""

    interval = KPA_TICK_S
    mode = "knative"

    def __init__(
        self,
        scale_target: float,
        container_concurrency: int,
        min_replicas: int,
        max_replicas: int,
        scale_down_delay_s: float = 0.0,
        utilization: float = TARGET_UTILIZATION,
    ):
        # pkg/reconciler/autoscaling/resources/target.go:54,61: min(target, containerConcurrency) x utilisation
        self.target = max(0.01, min(scale_target, container_concurrency) * utilization)
        self.cc = container_concurrency
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.delay_s = scale_down_delay_s
        self.panic_since: Optional[float] = None
        self.max_panic = 0
        self.delayed: deque = deque()  # (t, desired): pkg/autoscaler/aggregation/max/window.go, the max

    def desired(self, seen: Seen) -> Optional[int]:
        now = seen.now
        stable = _mean(seen.concurrency, now - STABLE_WINDOW_S)
        panic = _mean(seen.concurrency, now - STABLE_WINDOW_S * PANIC_WINDOW_PERCENT / 100)
        if stable is None:
            return None  # autoscaler.go:175-181: no data, no decision
        ready = max(1.0, seen.ready)  # autoscaler.go:161
        up = math.ceil(MAX_SCALE_UP_RATE * ready)  # autoscaler.go:189
        down = math.floor(ready / MAX_SCALE_DOWN_RATE)  # autoscaler.go:193
        dspc, dppc = math.ceil(stable / self.target), math.ceil(panic / self.target)  # autoscaler.go:196-197
        want_stable, want_panic = min(max(dspc, down), up), min(max(dppc, down), up)  # autoscaler.go:207-208
        over = dppc / ready >= PANIC_THRESHOLD  # autoscaler.go:220
        if over:
            self.panic_since = now  # autoscaler.go:222-229: start, or extend, the panic
        elif self.panic_since is not None and self.panic_since + STABLE_WINDOW_S < now:
            self.panic_since, self.max_panic = None, 0  # autoscaler.go:230-235
        want = want_stable
        if self.panic_since is not None:  # autoscaler.go:239-254: the larger, and never down while panicking
            self.max_panic = max(self.max_panic, want, want_panic)
            want = self.max_panic
        if self.delay_s > 0:  # autoscaler.go:265-276: the largest wanted within scale-down-delay
            self.delayed.append((now, want))
            while self.delayed and self.delayed[0][0] <= now - self.delay_s:
                self.delayed.popleft()
            want = max(w for _, w in self.delayed)
        return min(max(want, self.min_replicas), self.max_replicas)  # kpa/scaler.go:157 applyBounds

    @property
    def panicking(self) -> bool:
        return self.panic_since is not None


class HPA:
    """Kubernetes' HPA on one or more metrics, each with its target (``targets``); it computes a count for
    each and runs the largest ("Algorithm details": "If multiple metrics are specified"). ``"cpu"``: target
    utilisation in percent of the request; the others are KEDA's external metrics with an AverageValue
    target, the total over the target per pod: ``"rps"`` (``sum(rate(ts_inference_requests_total[1m]))``)
    and ``"in_flight"`` (``sum(ts_requests_in_flight)``), the two the export writes, and ``"queue"``
    (``sum(ts_queue_size)``, what it wrote before: simulated beside it to show why not)."""

    interval = HPA_SYNC_S

    def __init__(
        self,
        targets: Dict[str, float],
        min_replicas: int,
        max_replicas: int,
        down_window_s: float = HPA_DOWN_WINDOW_S,
        mode: str = "hpa",
    ):
        self.targets, self.mode = dict(targets), mode
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.down_window_s = down_window_s
        self.recommendations: deque = deque()  # (t, recommendation): the stabilization window
        self.events: deque = deque()  # (t, change): the scaling policies' periods

    def recommend(self, seen: Seen) -> int:
        """The largest of the counts the metrics ask for."""
        return max(self.one(seen, metric, target) for metric, target in self.targets.items())

    def one(self, seen: Seen, metric: str, target: float) -> int:
        """The replica count one metric asks for ("Algorithm details"): ceil(replicas x metric / target)."""
        current = seen.replicas
        if metric != "cpu":  # an external metric's AverageValue: the total over the target per pod
            total = {"queue": seen.queue, "in_flight": seen.in_flight, "rps": seen.served_rps}[metric]
            ratio = total / (target * max(1, current))
            return current if abs(1 - ratio) <= HPA_TOLERANCE else math.ceil(total / target)
        cpu = _mean(seen.cpu, seen.now - METRICS_WINDOW_S)
        if cpu is None or seen.ready == 0:
            return current
        ratio = cpu * 100 / target
        unready = max(0, current - seen.ready)
        if ratio > 1 and unready:  # "not yet ready ... assume it uses 0% of the desired metric" on a scale-up
            counted = seen.ready + unready
            rebalanced = cpu * 100 * seen.ready / counted / target
            if abs(1 - rebalanced) <= HPA_TOLERANCE or rebalanced < 1:
                return current  # within tolerance, or it would reverse the direction: no change
            return math.ceil(rebalanced * counted)
        if abs(1 - ratio) <= HPA_TOLERANCE:
            return current
        return math.ceil(ratio * seen.ready)

    def desired(self, seen: Seen) -> int:
        now, current = seen.now, seen.replicas
        raw = self.recommend(seen)
        # "Stabilization window" (horizontal.go's stabilizeRecommendationWithBehaviors): up at once to the
        # recommendation (scale-up window 0), down only to the highest recommendation of the last 300 s
        while self.recommendations and self.recommendations[0][0] <= now - self.down_window_s:
            self.recommendations.popleft()
        highest = max([raw] + [r for _, r in self.recommendations])
        self.recommendations.append((now, raw))
        want = raw if raw > current else min(current, highest)
        want = self.rate_limited(now, current, want)
        want = min(max(want, self.min_replicas), self.max_replicas)
        if want != current:
            self.events.append((now, want - current))
        return want

    def rate_limited(self, now: float, current: int, want: int) -> int:
        """The scaling policies ("Scaling policies", selectPolicy Max): up by at most the larger of +4 pods
        and +100% of the replicas at the period's start per 15 s; down by at most 100% per 15 s."""
        if want == current:
            return want
        policies = HPA_UP_POLICIES if want > current else HPA_DOWN_POLICIES
        limits = []
        for kind, value, period in policies:
            changed = sum(d for t, d in self.events if t > now - period and (d > 0) == (want > current))
            start = current - changed
            if want > current:
                limits.append(start + value if kind == "Pods" else math.ceil(start * (1 + value / 100)))
            else:
                limits.append(start - value if kind == "Pods" else math.floor(start * (1 - value / 100)))
        return min(want, max(limits)) if want > current else max(want, min(limits))


def _mean(samples: deque, since: float) -> Optional[float]:
    values = [v for t, v in samples if t > since]
    return sum(values) / len(values) if values else None
