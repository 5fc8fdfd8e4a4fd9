"""``tsctl simulate RESULT.json``: what the autoscaling ``tsctl export kserve --autoscale MODE --from-bench
RESULT.json`` writes would do with load, before a cluster sees it. One replica's measured curve (the
``tsctl-capacity/1`` file) goes through the autoscalers' control loops (archiver/autoscaling/autoscale_sim.py, each rule
cited there) with the numbers the export computes, under load traces: a ramp to ``--peak`` x one replica's
best throughput, a spike, a day compressed into two hours. For each trace and mode: the requests shed, p50
and p99, the most replicas, and the replica-hours spent against those a perfect autoscaler would spend.

``run`` simulates, ``table`` says it, ``plot`` draws replicas, p99 and requests waiting over time, a column
per trace. benchmarks/autoscale_sim.py writes BENCHMARKS.md's figures with the same functions.
"""

import math
from typing import Dict, List, Optional, Sequence

from ..errors import UserError
from ..output import quiet
from . import autoscale_sim as sim
from . import load_traces

FORMAT = "tsctl-simulation/1"
TRACES = tuple(load_traces.TRACES)  # ramp, spike, diurnal
SETTLE_S = 600.0  # the first load before the trace: longer than every window (300 s) and delay
MAX_PEAK = 1000.0  # x one replica: past it the simulated replica count is beyond any one model's
COLORS = {
    "knative": "tab:blue",
    "hpa": "tab:green",
    "keda": "tab:red",
    "keda-rate": "tab:purple",
    "keda-in-flight": "tab:orange",
    "keda-queue": "tab:gray",
}


def load(path: str) -> dict:
    """The capacity result, read by ``capacity.load``, with a knee to size the autoscaling from."""
    from ..capacity import sweep

    doc = sweep.load(path)
    if doc["knee"] is None or not any(s["errors"] == 0 and s["p99_ms"] is not None for s in doc["steps"]):
        raise UserError(f"{path} has no knee (no step answered every request): measure again with fewer clients")
    if sim.Curve(doc).best <= 0:
        raise UserError(f"{path}: no step answered a request a second; measure again")
    return doc


def trace(name: str, best: float, peak: Optional[float] = None):
    """The load trace ``name`` for a replica whose best throughput is ``best``, peaking at ``peak`` x it."""
    if peak is None:
        return load_traces.TRACES[name](best)
    if not 0 < peak <= MAX_PEAK:
        raise UserError(f"--peak {peak:g} must be above 0 and at most {MAX_PEAK:g} (x one replica's best)")
    return load_traces.TRACES[name](best, peak=peak)


def needed(doc: dict, rate, duration: float) -> float:
    """Replica-seconds a perfect autoscaler spends: each second, the offered load over one replica's
    throughput at the operating point (no start-up, no headroom)."""
    per = sim.exported(doc, "knative", 1)["step_rps"]
    return sum(math.ceil(rate(t) / per) for t in range(int(duration)))


def run(
    doc: dict,
    modes: Sequence[str],
    traces: Sequence[str] = TRACES,
    peak: Optional[float] = None,
    start_s: float = sim.COLD_START_S,
    max_replicas: Optional[int] = None,
    progress=quiet,
) -> dict:
    """Every trace through every mode; the result as ``--json`` prints it, and the runs (``runs``: by
    (trace, mode), the Run and its trace) for ``plot``."""
    if not 0 <= start_s <= 3600:
        raise UserError(f"--start-seconds {start_s:g} must be from 0 to 3600")
    if max_replicas is not None and not 1 <= max_replicas <= 10000:
        raise UserError(f"--max-replicas {max_replicas} must be from 1 to 10000")
    curve = sim.Curve(doc)
    rows, runs = [], {}
    for name in traces:
        rate = trace(name, curve.best, peak)
        top = max(rate(t) for t in range(int(rate.duration)))
        most = max_replicas or sim.peak_replicas(doc, top)
        warm = min(most, sim.peak_replicas(doc, rate(0)))  # ready at the start: what the first load needs
        needed_hours = round(needed(doc, rate, rate.duration) / 3600, 2)  # the trace's, whatever the mode
        for mode in modes:
            progress(f"{name}: {mode}")
            scaler = sim.scaler_for(doc, mode, most)
            result = sim.simulate(
                curve, scaler, rate, rate.duration, startup_s=start_s, initial=warm, settle_s=SETTLE_S
            )
            runs[(name, mode)] = (result, rate)
            summary = result.summary(curve)
            rows.append(
                {
                    "trace": name,
                    "mode": mode,
                    "max_replicas_allowed": most,
                    **summary,
                    "replica_hours": round(summary["replica_seconds"] / 3600, 2),
                    "needed_replica_hours": needed_hours,
                }
            )
    out = {
        "format": FORMAT,
        "model": doc["model"],
        "engine": doc["engine"],
        "measured_at": doc["measured_at"],
        "best_rps": round(curve.best, 2),
        "start_seconds": start_s,
        "peak": peak,
        "rows": rows,
    }
    return {"result": out, "runs": runs}


def table(result: dict) -> List[str]:
    """The result as text: a line of what it is, then a row per trace and mode."""
    lines = [
        f"{result['model']} on {result['engine']} (measured {result['measured_at']}; one replica's best "
        f"{result['best_rps']:g} req/s), replicas ready {result['start_seconds']:g} s after they are asked for",
        f"{'trace':<8} {'mode':<15} {'max':>4} {'requests':>10} {'shed':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'most':>5} {'replica-h':>10} {'needed':>7}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['trace']:<8} {r['mode']:<15} {r['max_replicas_allowed']:>4} {r['requests']:>10,} "
            f"{r['shed_percent']:>7.2f}% {r['p50_ms']:>8.0f} {r['p99_ms']:>8.0f} {r['max_replicas']:>5} "
            f"{r['replica_hours']:>10.1f} {r['needed_replica_hours']:>7.1f}"
        )
    return lines


def plot(doc: dict, runs: Dict[tuple, tuple], traces: Sequence[str], modes: Sequence[str], path: str):
    """Replicas (with the offered load over one replica's throughput), p99 per 10 s and requests waiting
    over time, a column per trace, a line per mode, as a PNG."""
    from ..capacity.plotting import pyplot, save

    plt = pyplot()

    per = sim.exported(doc, "knative", 1)["step_rps"]
    figure, axes = plt.subplots(3, len(traces), figsize=(9 * len(traces), 8), sharex="col", squeeze=False)
    for column, name in enumerate(traces):
        top, middle, bottom = axes[:, column]
        first = runs[(name, modes[0])][0]
        t = [r["t"] / 60 for r in first.rows]
        top.plot(
            t,
            [math.ceil(r["offered_rps"] / per) for r in first.rows],
            color="gray",
            linestyle=":",
            label="offered / one replica's rps",
        )
        for mode in modes:
            result = runs[(name, mode)][0]
            color = COLORS.get(mode)
            top.plot(t, [r["replicas"] for r in result.rows], color=color, label=mode)
            middle.plot([w / 60 for w, _ in result.p99_s], [p * 1000 for _, p in result.p99_s], color=color)
            bottom.plot(t, [r["waiting"] for r in result.rows], color=color)
        top.set_ylabel("replicas")
        top.legend(fontsize=8, loc="upper left")
        middle.set_ylabel("p99 per 10 s (ms)")
        middle.set_yscale("log")
        bottom.set_ylabel("requests waiting")
        bottom.set_xlabel("minutes")
        cpu = doc["server"].get("cpu")
        limit = f" at {cpu:g} CPU per replica" if cpu else ""
        top.set_title(f"{name}: {doc['model']}{limit}, simulated", fontsize=10)
    save(figure, path, 90)
