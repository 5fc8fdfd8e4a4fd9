"""What the exported autoscaling does with load, simulated (issue #33, item 3):

    .venv/bin/python benchmarks/autoscale_sim.py

Reads one replica's measured curve, ``benchmarks/data/resnet18-cpu0.4.json`` (written by
benchmarks/autoscale_check.py: ``tsctl bench --capacity --cpu 0.4``), takes the numbers
``tsctl export kserve --autoscale MODE --from-bench`` writes from it (maxReplicas as ``--peak-rps`` gives it
for each trace's peak), and replays three traces through archiver/autoscaling/autoscale_sim.py: a ramp to 50x one
replica's best throughput, a spike (5x to 30x for a minute), a day compressed into two hours (2x to 50x).
Modes: Knative's KPA, the HPA on CPU, KEDA on the answer rate and ``ts_requests_in_flight`` (as exported),
and beside them, not exported, KEDA on ``ts_requests_in_flight`` alone and on ``ts_queue_size`` (what the
export wrote before), with `tsctl simulate`'s functions (archiver/autoscaling/simulate.py). Plots in benchmarks/plots/, a BENCHMARKS.md
section with the assumptions.
"""

from common import PLOTS, ROOT, write_section

from archiver.autoscaling import autoscale_sim as sim  # noqa: E402
from archiver.autoscaling import simulate  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "resnet18-cpu0.4.json"
MODES = ("knative", "hpa", "keda", "keda-rate", "keda-in-flight", "keda-queue")
SLOW_START_S = 60.0  # a replica that needs a node, or an image pull, before the engine's own start


def run_all(doc: dict, startup_s: float, traces=simulate.TRACES) -> dict:
    """``tsctl simulate``'s run with the variants beside the export's modes: rows by (trace, mode), the runs."""
    done = simulate.run(doc, MODES, traces, start_s=startup_s, progress=print)
    return {"rows": {(r["trace"], r["mode"]): r for r in done["result"]["rows"]}, "runs": done["runs"]}


def plot(doc: dict, runs: dict, name: str) -> str:
    PLOTS.mkdir(parents=True, exist_ok=True)
    path = PLOTS / f"autoscale_{name}.png"
    simulate.plot(doc, runs["runs"], [name], MODES, str(path))
    return f"![{name}]({path.relative_to(ROOT)})"


def table(runs: dict, traces) -> str:
    lines = [
        "| trace | mode | maxReplicas | requests | shed | p50 ms | p99 ms | most replicas | replica-hours (needed) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in traces:
        for mode in MODES:
            r = runs["rows"][(name, mode)]
            lines.append(
                f"| {name} | {mode} | {r['max_replicas_allowed']} | {r['requests']:,} | {r['shed_percent']:.2f} % | "
                f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['max_replicas']} | {r['replica_hours']:.1f} "
                f"({r['needed_replica_hours']:.1f}) |"
            )
    return "\n".join(lines)


def main():
    doc = simulate.load(str(DATA))
    numbers = {mode: sim.exported(doc, mode, 10) for mode in ("knative", "keda", "hpa")}
    runs = run_all(doc, sim.COLD_START_S)
    slow = run_all(doc, SLOW_START_S, traces=("spike",))
    images = "\n\n".join(plot(doc, runs, name) for name in simulate.TRACES)
    write_section("AUTOSCALE-SIM", section(doc, numbers, runs, slow, images))


def reading(doc: dict, runs: dict, slow: dict) -> str:
    """What the tables say, with this run's numbers."""

    def shed(table, trace, mode):
        return table["rows"][(trace, mode)]["shed_percent"]

    knative = max(shed(runs, t, "knative") for t in ("ramp", "spike", "diurnal"))
    spike = ", ".join(f"{m} {shed(runs, 'spike', m):.1f} %" for m in MODES[1:])
    day = ", ".join(f"{m} {shed(runs, 'diurnal', m):.2f} %" for m in MODES)
    ramp = ", ".join(f"{m} {shed(runs, 'ramp', m):.2f} %" for m in MODES)
    base = {m: runs["runs"][("spike", m)][0].rows[200]["replicas"] for m in ("keda", "keda-in-flight")}
    slow_spike = ", ".join(f"{m} {shed(slow, 'spike', m):.1f} %" for m in MODES)
    return f"""Reading it:
- **Knative sheds {knative:.2f} % at most with the engine's own start**: the activator and the queue-proxies hold what exceeds
  `containerConcurrency` (10,000 + 10 x containerConcurrency per replica) while replicas start, so a
  spike costs latency (the p99 column), not errors; panic mode adds replicas at the next 2 s tick and
  does not let go of them for 60 s, and scale-down-delay (300 s) with the halving rule makes the way
  down slow (replica-hours above the needed).
- **Standard mode sheds during the spike** ({spike}): nothing buffers in front of the replicas, each
  engine holds its batch plus `job_queue_size` (100) and answers 503 past it, while the HPA acts every
  15 s by at most +100% (or +4 pods). With a 60 s start, every mode: {slow_spike} (Knative's
  buffers, 10,000 requests and 10 x containerConcurrency per replica, fill before the replicas come).
- **KEDA as exported holds the day and the ramp** (the day: {day}; the ramp: {ramp}): its two triggers
  are the answer rate (`rate(ts_inference_requests_total[1m])`, threshold 70% of the throughput at the
  operating point), which grows with the load as CPU does, and the requests in flight (threshold 70% of
  the operating point), which jump when replicas fall behind; the HPA runs the larger count. Either alone
  fails. **The queue gauge** (`ts_queue_size`, threshold the mean queue measured at the operating point,
  1, what the export wrote before) asks for nothing while replicas keep the queue empty, so 300 s later
  the HPA's default policy (-100% in 15 s) takes replicas away, the queue comes back and it scales up
  again (the plots' saw-tooth). **The answer rate alone** (keda-rate) sees only what the replicas answer,
  averaged over a minute: once they fall behind it asks for the answered rate over its threshold and no more,
  so the ramp sheds {shed(runs, "ramp", "keda-rate"):.2f} % and the spike {shed(runs, "spike", "keda-rate"):.2f} %. **Requests in flight alone** under-count a batching model's load when
  replicas are spare (fewer in flight per replica answer faster), so its count swings the same way, less
  deeply; its lower spike figure comes from that swing: it went into the spike with {base["keda-in-flight"]} replicas where
  the load before needed {base["keda"]} (the exported KEDA's count), having shed on the way.
  `tests/cli/test_autoscale_sim.py` shows each on a hand-made curve."""


def section(doc: dict, numbers: dict, runs: dict, slow: dict, images: str) -> str:
    kn, keda, hpa = numbers["knative"], numbers["keda"], numbers["hpa"]
    best = sim.Curve(doc).best
    return f"""## Autoscaling, simulated (issue #33)

`benchmarks/autoscale_sim.py` replays three traces through `archiver/autoscaling/autoscale_sim.py`, fed by one replica's
measured curve: resnet18 on the tsctl engine at {doc["server"]["cpu"]:g} CPU (`benchmarks/data/{DATA.name}`, measured
{doc["measured_at"]}; best {best:.1f} req/s). The autoscaling is what `tsctl export kserve --autoscale MODE
--from-bench` writes from that file: Knative `containerConcurrency` {kn["containerConcurrency"]}, `scaleTarget`
{kn["scaleTarget"]} at 70% utilisation, scale-down-delay 300 s; KEDA thresholds {keda["rps_threshold"]} on
`sum(rate(ts_inference_requests_total[1m]))` and {keda["threshold"]} on `sum(ts_requests_in_flight)`, the larger count;
HPA CPU target {hpa["cpu"]}%. maxReplicas is `--peak-rps`'s for each trace's peak. Not exported, beside them:
**keda-in-flight**, the in-flight trigger alone, and **keda-queue**, `sum(ts_queue_size)` with the mean queue at
the operating point rounded up (at least 1) as the threshold, what the export wrote before.
Each run starts with the replicas the first second's load needs at the operating point, ready, after {simulate.SETTLE_S:g} s of that load with the autoscaler running (its windows filled). Traces: **ramp** from 0.5x to 50x one replica's best over 10 minutes, held 5, down in 5; **spike** 5x, then 30x for
60 s, then 5x; **diurnal** a day in 2 hours, 2x at 4 am to 50x at 4 pm.

{table(runs, simulate.TRACES)}

With replicas ready {SLOW_START_S:g} s after they are asked for (a new node or an image pull; above, the engine's own
cold start, {sim.COLD_START_S} s):

{table(slow, ("spike",))}

{images}

{reading(doc, runs, slow)}

Assumptions (archiver/autoscaling/autoscale_sim.py's docstring has them with the code):
- a replica is its measured curve: with n requests in it, throughput(n) (linear between steps, flat past the
  last), and a request that finds n in it takes the latency measured at n (p50/p90/p99; past the last step
  that latency x n / n_last); every ready replica gets an equal share (a least-loaded balancer);
- requests are a fluid in per-0.2 s cohorts kept in order; a cohort's latency is its wait outside the
  replicas plus the replica's at the concurrency it found; p99 is over the mixture of those distributions;
- a replica is ready the engine's measured cold start ({sim.COLD_START_S} s, BENCHMARKS' cold start section)
  after the autoscaler asks (scheduling and image pull on top: the second table); scale-down is graceful;
- CPU of a replica = its throughput over the best measured (a CPU-bound replica saturates at the knee);
  the HPA reads it averaged over 15 s; KEDA's queries see the gauges as Prometheus scraped them (every 15 s)
  and the answer rate as the mean of the last 60 s;
- Knative's metric is every request of the revision (in replicas or waiting), one sample a second; the KPA
  decides every 2 s; the HPA every 15 s; KServe passes the HPA no `behavior` (Kubernetes' defaults) and
  KEDA only the scale-down window (docs/kserve.md);
- not modelled: scale to zero (minReplicas 1), request timeouts (a request waits as long as it takes),
  the activator leaving the path, per-pod imbalance, node autoscaling, and the network.

Each rule's source: knative/serving at 98e5ef90 (`pkg/autoscaler/scaling/autoscaler.go` lines 161-276,
`pkg/reconciler/autoscaling/resources/target.go` 54-61, `config/core/configmaps/autoscaler.yaml`,
`pkg/activator/net/throttler.go` 55, `pkg/queue/sharedmain/main.go` 413); the HPA: the "Algorithm details",
"Stabilization window" and "Default Behavior" sections of
https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/ and kubernetes/kubernetes
`pkg/apis/autoscaling/v2/defaults.go` (1adaa753) lines 27-65.

Reproduce: `.venv/bin/python benchmarks/autoscale_check.py` (the curve), then `.venv/bin/python benchmarks/autoscale_sim.py`."""


if __name__ == "__main__":
    main()
