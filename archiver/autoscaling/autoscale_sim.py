"""What an autoscaler will do with one replica's measured capacity: a simulator of the control loops
``tsctl export kserve --autoscale knative|keda|hpa`` configures, fed by a ``tsctl-capacity/1`` result
(docs/capacity.md) and a load trace. No server: plain arithmetic on the measured curve.

The model (BENCHMARKS.md, "Autoscaling, simulated", lists the same assumptions):

- **A replica** is its measured curve: with ``n`` requests in it, it answers ``throughput(n)`` requests a
  second (linear between measured steps, ``n x throughput(1)`` below one, flat past the last step), and a
  request admitted while ``n`` are in it takes the p50/p90/p99 latency measured at ``n`` (past the last
  step: that step's latency times ``n / n_last``, more waiting behind a flat throughput). Every ready
  replica gets an equal share of the requests in the replicas (a balancer sending to the least loaded).
- **The requests** are a fluid, in cohorts (one per time step) that keep their order (FIFO): a cohort's
  latency is its wait outside the replicas plus the replica's latency at the concurrency it found.
- **Knative** (``KPA``): ``containerConcurrency`` is a hard limit per replica; what exceeds it waits in
  the activator and the queue-proxies (their queues hold ``ACTIVATOR_QUEUE`` + ``QUEUE_PROXY_DEPTH`` x
  containerConcurrency per replica; more is shed with a 503). The autoscaler sees every request in the
  revision, in the replicas or waiting, each second.
- **Standard mode** (``HPA`` on CPU, ``HPA`` on KEDA's external in-flight metric): the Service spreads the
  requests over the ready replicas, each holding at most ``workers x batch_size + ENGINE_QUEUE`` (the
  engine's job queue, ``job_queue_size``: a full one answers 503); with no replica ready, a request fails.
- **A new replica** is ready ``startup_s`` after the autoscaler asks for it (default ``COLD_START_S``: the
  engine's measured cold start; scheduling and image pull come on top in a cluster).
- **CPU** of a replica: throughput at its concurrency over the best measured throughput (a CPU-bound
  replica saturates its CPU at the knee), the assumption ``export --autoscale hpa`` makes.

The autoscalers' rules are in autoscalers.py, each cited where it is coded; the load traces are in
load_traces.py.
"""

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

from .. import choices
from ..export.kserve.autoscale_numbers import RATE_WINDOW_S  # the answer rate KEDA's query reads: rate(...[1m])
from .autoscalers import ACTIVATOR_QUEUE, HPA, KPA, QUEUE_PROXY_DEPTH, SCRAPE_S, STABLE_WINDOW_S, Fixed, Seen

# ---- the engine and the measured start -----------------------------------------------------------------
ENGINE_QUEUE = 100  # serving/frontend_settings.py job_queue_size default: requests waiting per model version
COLD_START_S = choices.ENGINE_COLD_START_S  # BENCHMARKS.md "Cold start": the engine, launch to READY
SAMPLE_S = 1.0  # how often the simulator records the state (and Knative's metric is scraped: collector.go:37)
WINDOW_S = 10.0  # the p99 reported over time: per window of this many seconds


class Curve:
    """One replica's service curve from a ``tsctl-capacity/1`` document: its clean steps (no errors)."""

    def __init__(self, doc: dict):
        steps = sorted(
            (s for s in doc["steps"] if s["errors"] == 0 and s["p99_ms"] is not None), key=lambda s: s["concurrency"]
        )
        if not steps:
            raise ValueError("the capacity result has no step that answered every request")
        self.n = [float(s["concurrency"]) for s in steps]
        self.x = [float(s["throughput_rps"]) for s in steps]
        self.lat = {q: [float(s[f"p{q}_ms"] or s["p99_ms"]) / 1000 for s in steps] for q in (50, 90, 99)}
        self.queue = [float((s.get("queue_depth") or {}).get("mean", 0.0)) for s in steps]
        self.best = max(self.x)
        server = doc.get("server") or {}
        self.in_service = (server.get("workers") or 1) * (server.get("batch_size") or 1)

    def _at(self, values: Sequence[float], n: float) -> float:
        """``values`` at concurrency ``n``: linear between steps, the ends held."""
        if n <= self.n[0]:
            return values[0]
        for i in range(1, len(self.n)):
            if n <= self.n[i]:
                share = (n - self.n[i - 1]) / (self.n[i] - self.n[i - 1])
                return values[i - 1] + share * (values[i] - values[i - 1])
        return values[-1]

    def throughput(self, n: float) -> float:
        """Requests/s with ``n`` requests in the replica: ``n x throughput(1)`` below the first step, flat
        past the last."""
        if n <= 0:
            return 0.0
        if n < self.n[0]:
            return self.x[0] * n / self.n[0]
        return self._at(self.x, n)

    def latency(self, n: float) -> Dict[int, float]:
        """Seconds a request takes that finds ``n`` in the replica: {50: p50, 90: p90, 99: p99}; past the
        last step, that step's times ``n / n_last`` (waiting behind a flat throughput)."""
        scale = max(1.0, n / self.n[-1])
        return {q: self._at(values, n) * scale for q, values in self.lat.items()}

    def waiting(self, n: float) -> float:
        """The engine's queue gauge (requests waiting for a worker) at ``n``: measured, else past the last
        step the measured queue plus every request beyond it."""
        return self._at(self.queue, n) + max(0.0, n - self.n[-1])


# ---- the cluster ---------------------------------------------------------------------------------------------
@dataclass
class Run:
    """A simulation's record: one row a second (``rows``), p99 per ``WINDOW_S`` (``p99_s``), the totals."""

    mode: str
    rows: List[dict] = field(default_factory=list)  # t, offered/served rps, replicas, ready, in replicas, waiting
    p99_s: List[tuple] = field(default_factory=list)  # (window's end, p99 seconds)
    offered: float = 0.0
    served: float = 0.0
    shed: float = 0.0
    pieces: List[tuple] = field(default_factory=list)  # (weight, wait s, concurrency found): every answer

    def summary(self, curve: Curve) -> dict:
        p = quantiles(curve, self.pieces, (0.5, 0.99))
        return {
            "requests": round(self.offered),
            "answered": round(self.served),
            "shed": round(self.shed),
            "shed_percent": round(100 * self.shed / self.offered, 2) if self.offered else 0.0,
            "p50_ms": round(p[0] * 1000, 1),
            "p99_ms": round(p[1] * 1000, 1),
            "max_replicas": max(r["replicas"] for r in self.rows),
            "replica_seconds": round(sum(r["replicas"] for r in self.rows) * SAMPLE_S),
            "max_waiting": round(max(r["waiting"] for r in self.rows), 1),
        }


class Cluster:
    """Replicas of one model behind Knative's activator (``buffered``) or a Service (Standard mode)."""

    def __init__(self, curve: Curve, scaler, startup_s: float, buffered: bool, cc: Optional[int], initial: int):
        self.curve, self.scaler, self.startup_s = curve, scaler, startup_s
        self.buffered, self.cc = buffered, cc
        self.pods: List[float] = [-math.inf] * initial  # the time each is (or will be) ready
        self.inside: deque = deque()  # [arrived, admitted, amount, concurrency found] in the replicas
        self.waiting: deque = deque()  # [arrived, amount] outside them (Knative's activator/queue-proxies)
        self.in_total = self.wait_total = 0.0

    def ready(self, now: float) -> int:
        return sum(1 for t in self.pods if t <= now)

    def room(self, ready: int) -> float:
        """How many more requests the ready replicas take now."""
        per = self.cc if self.buffered else self.curve.in_service + ENGINE_QUEUE
        return max(0.0, ready * per - self.in_total)

    def admit(self, now: float, amount: float, ready: int) -> float:
        """Take ``amount`` arriving requests: into the replicas while they have room (waiting ones first),
        the rest waits (Knative, up to its queues) or is shed; returns the amount shed."""
        room = self.room(ready)
        while self.waiting and room > 1e-9:
            arrived, left = self.waiting[0]
            take = min(left, room)
            self._enter(arrived, now, take, ready)
            room -= take
            self.wait_total -= take
            if take >= left - 1e-12:
                self.waiting.popleft()
            else:
                self.waiting[0][1] = left - take
        take = min(amount, room) if ready else 0.0
        if take > 0:
            self._enter(now, now, take, ready)
        rest = amount - take
        if not self.buffered:
            return rest
        limit = ACTIVATOR_QUEUE + QUEUE_PROXY_DEPTH * self.cc * ready
        queued = min(rest, max(0.0, limit - self.wait_total))
        if queued > 0:
            self.waiting.append([now, queued])
            self.wait_total += queued
        return rest - queued

    def _enter(self, arrived: float, now: float, amount: float, ready: int):
        self.in_total += amount
        self.inside.append([arrived, now, amount, self.in_total / max(1, ready)])

    def serve(self, now: float, dt: float, ready: int, run: Run) -> float:
        """The ready replicas answer for ``dt`` seconds, first in first out; returns the amount answered."""
        if not ready or self.in_total <= 0:
            return 0.0
        done = min(self.in_total, ready * self.curve.throughput(self.in_total / ready) * dt)
        left = done
        while left > 1e-12 and self.inside:
            arrived, admitted, amount, found = self.inside[0]
            take = min(amount, left)
            run.pieces.append((take, admitted - arrived, found))
            left -= take
            if take >= amount - 1e-12:
                self.inside.popleft()
            else:
                self.inside[0][2] = amount - take
        self.in_total = max(0.0, self.in_total - done)
        return done

    def scale(self, now: float, want: int):
        """Ask for ``want`` replicas: new ones ready after the start-up time; fewer: the starting ones go
        first, then the newest ready ones (what they hold is still answered: a graceful stop)."""
        if want > len(self.pods):
            self.pods += [now + self.startup_s] * (want - len(self.pods))
        elif want < len(self.pods):
            self.pods = sorted(self.pods)[:want]


def simulate(
    curve: Curve,
    scaler,
    rate: Callable[[float], float],
    duration: float,
    dt: float = 0.2,
    startup_s: float = COLD_START_S,
    clients: Optional[int] = None,
    initial: Optional[int] = None,
    settle_s: float = 0.0,
) -> Run:
    """Replay the load ``rate(t)`` (requests/s, open loop) for ``duration`` seconds, or with ``clients``
    a closed loop of that many clients each sending its next request as the last is answered. It starts
    with ``initial`` replicas ready (default: minReplicas) that have served ``rate(0)`` for ``settle_s``
    seconds before, the autoscaler running (its windows filled; nothing of it recorded)."""
    buffered = scaler.mode == "knative"
    first = min(max(initial or 0, scaler.min_replicas), scaler.max_replicas)
    cluster = Cluster(curve, scaler, startup_s, buffered, getattr(scaler, "cc", None), first)
    run = Run(scaler.mode)
    concurrency, cpu, answers = deque(), deque(), deque()
    queue_seen = in_flight_seen = rps_seen = 0.0
    next_decision, next_sample, next_window = scaler.interval - settle_s, SAMPLE_S - settle_s, WINDOW_S
    window_start, served_since = 0, 0.0
    for i in range(-int(round(settle_s / dt)), int(round(duration / dt))):
        now = i * dt
        ready = cluster.ready(now)
        if i <= 0:  # settling: what is measured starts at 0
            run.offered = run.served = run.shed = served_since = 0.0
            run.pieces.clear()
        if clients is None:
            arriving = rate(max(0.0, now)) * dt
        else:
            arriving = max(0.0, clients - cluster.in_total - cluster.wait_total)
        run.offered += arriving
        run.shed += cluster.admit(now, arriving, ready)
        held = cluster.in_total  # what the replicas hold this step (sampled before it is answered)
        answered = cluster.serve(now, dt, ready, run)
        run.served += answered
        served_since += answered
        now += dt
        if now >= next_sample - 1e-9:
            next_sample += SAMPLE_S
            per = held / ready if ready else 0.0
            concurrency.append((now, held + cluster.wait_total))
            cpu.append((now, min(1.0, curve.throughput(per) / curve.best) if ready else 0.0))
            answers.append((now, served_since))
            for samples in (concurrency, cpu, answers):
                while samples[0][0] < now - STABLE_WINDOW_S - SAMPLE_S:
                    samples.popleft()
            if now % SCRAPE_S < SAMPLE_S - 1e-9:  # Prometheus scrapes the engines' gauges and counters
                queue_seen, in_flight_seen = ready * curve.waiting(per), held
                recent = [n for t, n in answers if t > now - RATE_WINDOW_S]
                rps_seen = sum(recent) / (len(recent) * SAMPLE_S)
            if now > 0:
                run.rows.append(
                    {
                        "t": round(now, 3),
                        "offered_rps": rate(now) if clients is None else None,
                        "served_rps": served_since / SAMPLE_S,
                        "replicas": len(cluster.pods),
                        "ready": ready,
                        "in_replicas": held,
                        "waiting": cluster.wait_total + ready * curve.waiting(per),
                        "shed": run.shed,
                        "panic": getattr(scaler, "panicking", False),
                    }
                )
            served_since = 0.0
        if now >= next_window - 1e-9 and now > 0:
            run.p99_s.append((now, quantiles(curve, run.pieces[window_start:], (0.99,))[0]))
            window_start, next_window = len(run.pieces), next_window + WINDOW_S
        if now >= next_decision - 1e-9:
            next_decision += scaler.interval
            seen = Seen(
                now, len(cluster.pods), cluster.ready(now), concurrency, cpu, queue_seen, in_flight_seen, rps_seen
            )
            want = scaler.desired(seen)
            if want is not None:
                cluster.scale(now, want)
    return run


def quantiles(curve: Curve, pieces: Sequence[tuple], qs: Sequence[float]) -> List[float]:
    """The latency quantiles (seconds) of the answers ``pieces`` (weight, wait, concurrency found): each
    piece's latency is its wait plus the replica's measured distribution at that concurrency (piecewise
    linear through 0 at p50/2, 0.5 at p50, 0.9 at p90, 0.99 at p99, 1 at p99 + (p99 - p90))."""
    import numpy as np

    merged: Dict[tuple, float] = {}
    for weight, wait, found in pieces:  # answers alike within 10 ms of wait and 0.1 of concurrency
        key = (round(wait, 2), round(found, 1))
        merged[key] = merged.get(key, 0.0) + weight
    if not merged:
        return [float("nan")] * len(qs)
    weights = np.array(list(merged.values()))
    rows = []
    for wait, found in merged:
        at = curve.latency(found)
        rows.append([wait + v for v in (at[50] / 2, at[50], at[90], at[99], 2 * at[99] - at[90])])
    knots = np.array(rows)
    rises = np.diff(np.array([0.0, 0.5, 0.9, 0.99, 1.0]))
    widths = np.maximum(np.diff(knots, axis=1), 1e-12)
    total = weights.sum()

    def share_below(x: float) -> float:
        filled = np.clip((x - knots[:, :-1]) / widths, 0.0, 1.0)
        return float((weights * (filled * rises).sum(axis=1)).sum() / total)

    return [_solve(share_below, q, 0.0, float(knots[:, -1].max())) for q in qs]


def _solve(f: Callable[[float], float], q: float, low: float, high: float) -> float:
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if f(middle) < q else (low, middle)
    return high


# ---- what the export writes, the fixed-replica prediction ------------------------------------------
def exported(doc: dict, mode: str, max_replicas: int, min_replicas: int = 1, scale_down_s: int = 300) -> dict:
    """The numbers ``tsctl export kserve --autoscale MODE --from-bench`` writes for ``doc``, by the export's
    own functions (archiver/export/kserve/autoscale.py): the operating point and each mode's target."""
    from ..export.kserve import autoscale_modes, autoscale_numbers
    from ..export.options import Service

    chosen = autoscale_modes.named(mode)
    numbers = autoscale_numbers
    plan = numbers.Autoscaling(chosen, 0, min_replicas, max_replicas, scale_down_s, capacity=doc, model=doc["model"])
    plan.service, plan.max_given = Service(doc["model"], "default", "v1"), True
    numbers.operating_point(plan, None)
    chosen.numbers(plan)
    return dict(plan.numbers, concurrency=plan.concurrency, step_rps=plan.step["throughput_rps"])


def scaler_for(doc: dict, mode: str, max_replicas: int, min_replicas: int = 1, scale_down_s: int = 300):
    """The autoscaler the export's manifests set up. KServe (aaac4e29) gives the HPA an empty behavior and
    KEDA's ScaledObject only the scale-down window (docs/kserve.md): Kubernetes' defaults run otherwise.
    Beside what the export writes, to show why it writes two KEDA triggers: ``keda-rate`` and
    ``keda-in-flight`` (each of its triggers alone) and ``keda-queue`` (``sum(ts_queue_size)`` against the
    mean queue at the operating point, rounded up, at least 1: what the export wrote before)."""
    down = scale_down_s
    if mode == "keda-queue":
        numbers = exported(doc, "knative", max_replicas, min_replicas, scale_down_s)
        step = max(
            (s for s in doc["steps"] if s["concurrency"] <= numbers["concurrency"]), key=lambda s: s["concurrency"]
        )
        threshold = max(1, math.ceil((step.get("queue_depth") or {}).get("mean", 0.0)))
        return HPA({"queue": threshold}, min_replicas, max_replicas, down_window_s=down, mode=mode)
    numbers = exported(doc, mode.split("-")[0], max_replicas, min_replicas, scale_down_s)
    if mode == "knative":
        return KPA(numbers["scaleTarget"], numbers["containerConcurrency"], min_replicas, max_replicas, scale_down_s)
    if mode.startswith("keda"):
        targets = {"rps": float(numbers["rps_threshold"]), "in_flight": float(numbers["threshold"])}
        if mode != "keda":  # keda-rate, keda-in-flight: the one trigger named
            targets = {"rps": targets["rps"]} if mode == "keda-rate" else {"in_flight": targets["in_flight"]}
        return HPA(targets, min_replicas, max_replicas, down_window_s=down, mode=mode)
    return HPA({"cpu": numbers["cpu"]}, min_replicas, max_replicas)


def peak_replicas(doc: dict, peak_rps: float) -> int:
    """``--peak-rps``'s maxReplicas: ceil(peak / the throughput at the operating point)."""
    return max(1, math.ceil(peak_rps / exported(doc, "knative", 1)["step_rps"]))


def steady(doc: dict, replicas: int, clients: int, seconds: float = 120.0) -> dict:
    """``replicas`` replicas (no autoscaling) under ``clients`` closed-loop clients, simulated: the
    throughput and latency of the last half of the run, when the start has passed."""
    curve = Curve(doc)
    run = simulate(curve, Fixed(replicas), lambda t: 0.0, seconds, dt=0.01, clients=clients)
    half = [r for r in run.rows if r["t"] > seconds / 2]
    late = [p for p in run.pieces[len(run.pieces) // 2 :]]
    p50, p99 = quantiles(curve, late, (0.5, 0.99))
    return {
        "replicas": replicas,
        "clients": clients,
        "throughput_rps": round(sum(r["served_rps"] for r in half) / len(half), 2),
        "p50_ms": round(p50 * 1000, 1),
        "p99_ms": round(p99 * 1000, 1),
    }
