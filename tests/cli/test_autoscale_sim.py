"""The autoscaling simulator (archiver/autoscaling/autoscale_sim.py): its reading of a measured curve, each autoscaler
rule it cites (Knative's KPA, the HPA that KEDA also drives) on hand-made metrics, the numbers it takes from
the export, and whole simulations on a hand-made curve (all pure: about 3 s). The check against real
replicas behind nginx is the matrix test at the end (about 2 minutes)."""

import math
import os
from collections import deque

import pytest

from archiver.autoscaling import autoscale_sim as sim
from archiver.autoscaling import autoscalers, load_traces
from archiver.capacity import sweep

# (concurrency, req/s, p50, p90, p99 ms, mean queue): resnet18 on the engine at 1 CPU (docs/capacity.md)
ROWS = [
    (1, 6.3, 158.4, 216.0, 324.8, 0.0),
    (2, 8.8, 224.1, 277.2, 318.0, 0.0),
    (4, 13.4, 303.5, 368.9, 426.5, 0.0),
    (8, 14.6, 549.1, 677.9, 814.2, 0.0),
    (16, 16.7, 984.6, 1198.1, 1226.5, 7.6),
]


def result(rows=ROWS, p99_target=1000) -> dict:
    steps = [
        {
            "concurrency": c,
            "requests": 100,
            "seconds": 5.0,
            "throughput_rps": x,
            "p50_ms": a,
            "p90_ms": b,
            "p99_ms": d,
            "errors": 0,
            "statuses": {"200": 100},
            "queue_depth": {"mean": q, "max": q, "samples": 9},
        }
        for c, x, a, b, d, q in rows
    ]
    return {
        "format": sweep.FORMAT,
        "model": "resnet18",
        "engine": "tsctl",
        "server": {
            "workers": 1,
            "max_workers": 1,
            "batch_size": 8,
            "max_batch_delay_ms": 20,
            "cpu": 1.0,
            "memory_bytes": None,
        },
        "input": {"files": ["k.jpg"], "bytes": [1]},
        "p99_target_ms": p99_target,
        "steps": steps,
        "knee": sweep.knee(steps),
        "within_p99": sweep.within_p99(steps, p99_target),
        "stopped": "flat",
        "queue_gauge": "ts_queue_size",
        "notes": [],
        "measured_at": "2026-11-26T00:00:00Z",
    }


def seen(now, replicas, ready=None, concurrency=(), cpu=(), queue=0.0, in_flight=0.0, rps=0.0):
    ready = replicas if ready is None else ready
    return autoscalers.Seen(now, replicas, ready, deque(concurrency), deque(cpu), queue, in_flight, rps)


def history(now, level, seconds=60, recent=None, recent_s=0):
    """One sample a second over ``seconds`` up to ``now`` at ``level``, the last ``recent_s`` at ``recent``."""
    return [(now - i, recent if i < recent_s else level) for i in range(seconds)][::-1]


def test_the_curve_is_read_as_measured_and_extended_honestly():
    curve = sim.Curve(result())
    assert curve.throughput(4) == 13.4 and curve.throughput(6) == pytest.approx((13.4 + 14.6) / 2)
    assert curve.throughput(0.5) == pytest.approx(6.3 / 2)  # below one in flight: proportional
    assert curve.throughput(64) == 16.7 and curve.throughput(0) == 0  # past the last step: flat
    assert curve.latency(8)[99] == pytest.approx(0.8142) and curve.latency(8)[50] == pytest.approx(0.5491)
    assert curve.latency(32)[99] == pytest.approx(1.2265 * 2)  # twice the last step's clients: twice its wait
    assert curve.waiting(12) == pytest.approx(3.8) and curve.waiting(20) == pytest.approx(7.6 + 4)
    assert curve.best == 16.7 and curve.in_service == 8
    shedding = result()
    shedding["steps"][4]["errors"] = 3  # a step with errors is not part of the curve
    assert sim.Curve(shedding).n[-1] == 8


def test_the_kpa_targets_70_percent_of_the_smaller_of_target_and_container_concurrency():
    assert autoscalers.KPA(8, 8, 1, 100).target == pytest.approx(5.6)  # target.go:54,61
    assert autoscalers.KPA(20, 8, 1, 100).target == pytest.approx(5.6)
    kpa = autoscalers.KPA(8, 8, 1, 100)
    assert kpa.desired(seen(10, 1)) is None  # no data: no decision
    assert kpa.desired(seen(60, 3, concurrency=history(60, 28))) == 5  # ceil(28 / 5.6); 5 / 3 under 2: no panic
    down = autoscalers.KPA(8, 8, 1, 100)  # ceil(11.2 / 5.6) = 2, but at most halved (max-scale-down-rate 2): 3
    assert down.desired(seen(62, 6, concurrency=history(62, 11.2))) == 3
    assert autoscalers.KPA(8, 8, 1, 4).desired(seen(60, 3, concurrency=history(60, 300))) == 4  # maxReplicas
    assert autoscalers.KPA(8, 8, 2, 9).desired(seen(60, 3, concurrency=history(60, 0))) == 2  # minReplicas


def test_the_kpa_panics_on_twice_its_capacity_in_6_seconds_and_holds_60():
    kpa = autoscalers.KPA(8, 8, 1, 100)
    # 4 ready replicas; the last 6 s at 50 in flight: ceil(50/5.6) = 9 >= 2 x 4, the stable 60 s mean is lower
    calm = history(100, 5, recent=50, recent_s=6)
    assert kpa.desired(seen(100, 4, concurrency=calm)) == 9 and kpa.panicking
    # the panic window back to calm: no scale-down while panicking (autoscaler.go:247-254)
    assert kpa.desired(seen(102, 9, concurrency=history(102, 5))) == 9 and kpa.panicking
    # 60 s after the last time over the threshold it ends, and the stable count (ceil(5/5.6)=1, at most halved) rules
    assert kpa.desired(seen(160, 9, concurrency=history(160, 5))) == 9  # 60 s not yet past
    assert kpa.desired(seen(161, 9, concurrency=history(161, 5))) == 4 and not kpa.panicking
    # under the threshold (dppc/ready < 2) it does not panic: 20 in flight, 3 ready: ceil(20/5.6) = 4 < 6;
    # the stable mean (54 s at 5, 6 s at 20: 6.5) rules: ceil(6.5/5.6) = 2
    quiet = autoscalers.KPA(8, 8, 1, 100)
    assert quiet.desired(seen(100, 3, concurrency=history(100, 5, recent=20, recent_s=6))) == 2
    assert not quiet.panicking


def test_the_kpa_scale_down_delay_keeps_the_largest_count_of_the_delay():
    kpa = autoscalers.KPA(8, 8, 1, 100, scale_down_delay_s=30)
    assert kpa.desired(seen(60, 3, concurrency=history(60, 28))) == 5 and not kpa.panicking
    assert kpa.desired(seen(70, 5, concurrency=history(70, 6))) == 5  # wants 2 (halving allows 2): delayed
    assert kpa.desired(seen(89, 5, concurrency=history(89, 6))) == 5
    assert kpa.desired(seen(90, 5, concurrency=history(90, 6))) == 2  # 30 s after the 5: the largest since


def test_the_hpa_formula_its_tolerance_and_its_unready_pods():
    hpa = autoscalers.HPA({"cpu": 50}, 1, 100)
    cpu = [(t, 0.8) for t in range(46, 61)]  # 80% against 50%: ceil(4 x 1.6) = 7
    assert hpa.recommend(seen(60, 4, cpu=cpu)) == 7
    assert hpa.recommend(seen(60, 4, cpu=[(t, 0.545) for t in range(46, 61)])) == 4  # 1.09: within 10%
    assert hpa.recommend(seen(60, 4, cpu=[(t, 0.56) for t in range(46, 61)])) == 5  # 1.12: ceil(4.48)
    # 2 of 6 not ready: counted at 0% on a scale-up; 90% over 4 ready = 60% over 6 -> ceil(6 x 1.2) = 8
    assert hpa.recommend(seen(60, 6, ready=4, cpu=[(t, 0.9) for t in range(46, 61)])) == 8
    # ... and no change when that brings it within the tolerance (80% over 4 of 6 = 53.3%: 1.067)
    assert hpa.recommend(seen(60, 6, ready=4, cpu=cpu)) == 6
    keda = autoscalers.HPA({"queue": 2}, 1, 100)  # AverageValue 2: ceil(total / 2) unless within 10% of current x 2
    assert keda.recommend(seen(60, 3, queue=13)) == 7
    assert keda.recommend(seen(60, 3, queue=6.5)) == 3
    assert keda.recommend(seen(60, 3, queue=0)) == 0
    # two triggers: each its own count, the largest runs (30 rps / 10 = 3 and 20 in flight / 4 = 5)
    both = autoscalers.HPA({"rps": 10, "in_flight": 4}, 1, 100)
    assert both.recommend(seen(60, 3, in_flight=20, rps=30)) == 5
    assert both.recommend(seen(60, 3, in_flight=2, rps=70)) == 7


def test_the_hpa_default_policies_and_the_scale_down_window():
    hpa = autoscalers.HPA({"queue": 1}, 1, 1000)
    assert hpa.desired(seen(15, 2, queue=100)) == 6  # +4 pods beats +100% from 2
    assert hpa.desired(seen(30, 6, queue=100)) == 12  # the next period: +100% beats +4
    assert hpa.desired(seen(45, 12, queue=100)) == 24
    # a lower recommendation waits for the 300 s window: the highest of the window rules meanwhile
    assert hpa.desired(seen(60, 24, queue=0)) == 24
    assert hpa.desired(seen(344, 24, queue=0)) == 24  # 100 recommended at 45 s: still in the window
    assert hpa.desired(seen(360, 24, queue=0)) == 1  # then down by up to 100% in 15 s, to minReplicas


def test_the_numbers_are_the_exports():
    doc = result()
    assert sim.exported(doc, "knative", 10) == {
        "containerConcurrency": 8,
        "scaleTarget": 8,
        "concurrency": 8,
        "step_rps": 14.6,
    }
    keda = sim.exported(doc, "keda", 10)
    assert (keda["threshold"], keda["rps_threshold"]) == ("5.6", "10.22")  # 70% of 8 and of 14.6 rps
    assert sim.exported(doc, "hpa", 10)["cpu"] == round(70 * 14.6 / 16.7)
    assert sim.peak_replicas(doc, 50 * 16.7) == math.ceil(50 * 16.7 / 14.6)
    kpa = sim.scaler_for(doc, "knative", 10)
    assert (kpa.cc, kpa.target, kpa.delay_s) == (8, pytest.approx(5.6), 300)


def test_fixed_replicas_under_closed_loop_clients_scale_the_curve():
    doc = result()
    for replicas, per in ((1, 1), (2, 4), (3, 8)):
        got = sim.steady(doc, replicas, replicas * per, seconds=40)
        step = next(s for s in doc["steps"] if s["concurrency"] == per)
        assert got["throughput_rps"] == pytest.approx(replicas * step["throughput_rps"], rel=0.03)
        assert got["p99_ms"] == pytest.approx(step["p99_ms"], rel=0.02)


def test_an_open_load_under_capacity_is_answered_and_over_it_shed_without_a_buffer():
    curve = sim.Curve(result())
    calm = sim.simulate(curve, autoscalers.Fixed(2), lambda t: 20.0, 60)
    assert calm.shed == 0 and calm.served == pytest.approx(calm.offered, rel=0.02)
    # 3x one replica's best for 60 s on one: its queue (8 in batch + 100 waiting) fills, the rest is a 503
    over = sim.simulate(curve, autoscalers.Fixed(1), lambda t: 50.0, 60)
    assert over.served == pytest.approx(60 * 16.7, rel=0.05)
    assert over.shed == pytest.approx(over.offered - over.served - 108, rel=0.05)
    assert max(r["in_replicas"] for r in over.rows) == pytest.approx(108, abs=1)


def test_knative_buffers_a_spike_that_standard_mode_sheds_and_new_replicas_wait_for_their_start():
    doc = result()
    curve = sim.Curve(doc)
    rate = load_traces.spike(curve.best, base=2, peak=12, at_s=60, for_s=60)
    knative = sim.simulate(curve, sim.scaler_for(doc, "knative", 20), rate, 300, startup_s=5)
    hpa = sim.simulate(curve, sim.scaler_for(doc, "hpa", 20), rate, 300, startup_s=5)
    assert knative.shed == 0 and hpa.shed > 0
    assert max(r["waiting"] for r in knative.rows) > 0  # the activator held what the replicas could not
    first = next(r for r in knative.rows if r["replicas"] > 1)
    later = next(r for r in knative.rows if r["t"] == first["t"] + 4)
    assert later["ready"] < later["replicas"]  # asked for, not ready within the 5 s start


def test_keda_holds_a_steady_load_where_the_queue_or_in_flight_alone_do_not():
    """The export's KEDA (the answer rate and requests in flight, the larger count) settles on one count
    under a steady 8x one replica's best, as CPU does. The queue gauge the export wrote before asks for
    nothing while replicas keep the queue empty, so after the 300 s window the HPA goes down to minReplicas
    and sheds again; requests in flight alone under-count once over-provisioned (fewer in flight per
    replica answer faster on this batching curve), so the count does not settle either."""
    doc = result()
    curve = sim.Curve(doc)

    def steady(mode):
        return sim.simulate(curve, sim.scaler_for(doc, mode, 20), lambda t: 8 * curve.best, 900)

    def shed_after_start(r):
        return r.rows[-1]["shed"] - r.rows[119]["shed"]

    keda, cpu = steady("keda"), steady("hpa")
    # from one replica: requests in flight ask for the most at once (20), the answer rate brings it down to
    # CPU's count (14) once the 300 s window has passed; it sheds less than CPU while the replicas come
    assert {r["replicas"] for r in cpu.rows[120:]} == {14} and {r["replicas"] for r in keda.rows[400:]} == {14}
    assert max(r["replicas"] for r in keda.rows[:120]) == 20 and keda.shed < cpu.shed
    assert shed_after_start(keda) == shed_after_start(cpu) == 0
    queue = steady("keda-queue")
    counts = [r["replicas"] for r in queue.rows]
    assert max(counts) >= 9 and 1 in counts[400:] and shed_after_start(queue) > 1000
    in_flight = steady("keda-in-flight")
    assert len({r["replicas"] for r in in_flight.rows[400:]}) > 1


def test_quantiles_of_one_concurrency_are_its_measured_latencies():
    curve = sim.Curve(result())
    p50, p99 = sim.quantiles(curve, [(10.0, 0.0, 4.0)], (0.5, 0.99))
    assert (p50, p99) == (pytest.approx(0.3035, abs=1e-4), pytest.approx(0.4265, abs=1e-4))
    p50, p99 = sim.quantiles(curve, [(10.0, 1.0, 4.0)], (0.5, 0.99))  # a second's wait before
    assert (p50, p99) == (pytest.approx(1.3035, abs=1e-4), pytest.approx(1.4265, abs=1e-4))
    assert math.isnan(sim.quantiles(curve, [], (0.99,))[0])


def test_the_simulate_command_on_a_measured_curve(tmp_path):
    """``tsctl simulate RESULT --trace spike``: each mode's row, the same load offered to each, Knative's
    buffers shedding nothing where Standard mode sheds; --json, --plot; a later start sheds more."""
    import json

    from click.testing import CliRunner

    from archiver.cli import main

    path = tmp_path / "result.json"
    path.write_text(json.dumps(result()))
    args = ["simulate", str(path), "--trace", "spike", "--peak", "12"]
    done = CliRunner().invoke(main, args + ["--json", "--plot", str(tmp_path / "spike.png")])
    assert done.exit_code == 0, done.output
    rows = {r["mode"]: r for r in json.loads(done.output)["rows"]}
    assert list(rows) == ["knative", "keda", "hpa"] and len({r["requests"] for r in rows.values()}) == 1
    assert rows["knative"]["shed"] == 0 and rows["hpa"]["shed"] > 0
    assert rows["hpa"]["max_replicas_allowed"] == math.ceil(12 * 16.7 / 14.6)  # --peak-rps's for the peak
    assert (tmp_path / "spike.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    slow = CliRunner().invoke(main, args + ["--json", "--start-seconds", "60", "--autoscale", "hpa"])
    assert json.loads(slow.output)["rows"][0]["shed"] > rows["hpa"]["shed"]
    text = CliRunner().invoke(main, args + ["--autoscale", "keda"])
    assert text.exit_code == 0 and "replicas ready 5.06 s after" in text.output and "spike    keda" in text.output


@pytest.mark.parametrize(
    "extra, data, words",
    [
        ([], result(ROWS[:1]) | {"knee": None}, "knee is not what its steps give concurrency 1; the file was changed"),
        ([], "{not json", "not JSON"),
        (["--peak", "0"], None, "--peak 0 must be above 0 and at most 1000"),
        (["--peak", "inf"], None, "--peak inf must be above 0 and at most 1000"),
        (["--start-seconds", "-1"], None, "--start-seconds -1 must be from 0 to 3600"),
        (["--max-replicas", "0"], None, "--max-replicas 0 must be from 1 to 10000"),
        (["--plot", "/nonexistent/x.png"], None, "--plot /nonexistent/x.png: its directory does not exist"),
    ],
)
def test_the_simulate_command_refuses_in_one_line(tmp_path, extra, data, words):
    import json

    from click.testing import CliRunner

    from archiver.cli import main

    path = tmp_path / "result.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data or result()))
    done = CliRunner().invoke(main, ["simulate", str(path), "--trace", "spike", *extra])
    assert done.exit_code == 2 and words in done.output and len(done.output.strip().splitlines()) == 1, done.output


@pytest.mark.matrix  # 97 s: the sweep, the replicas' starts and 2 load steps of 10 s through nginx
def test_two_real_replicas_behind_nginx_do_what_the_simulator_predicts(tmp_path):
    from archiver.capacity.cgroup_limits import PodLimits
    from helpers.balancer import bench_capacity, nginx_available, resnet_tree, through_nginx

    if not nginx_available():
        pytest.skip("no nginx: apt-get install -y nginx-light")
    probe = PodLimits.make(0.4, None)
    probe.release()
    if probe.reason:
        pytest.skip(probe.describe())
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    (tmp_path / "tree").mkdir()
    store, config, inputs = resnet_tree(tmp_path / "tree", images=4)
    doc = bench_capacity(store, config, inputs, tmp_path / "one.json", 0.4, 10, most=4)
    for row in through_nginx(2, 0.4, store, config, inputs, (1, 4), 10):
        predicted = sim.steady(doc, 2, row["clients"])
        assert row["errors"] == 0
        # wider than the benchmark's 15%: 10 s steps on a shared machine
        assert row["throughput_rps"] == pytest.approx(predicted["throughput_rps"], rel=0.3), (row, predicted)
