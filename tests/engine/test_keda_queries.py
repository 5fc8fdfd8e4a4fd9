"""The Prometheus queries ``tsctl export kserve --autoscale keda`` writes, run by a real Prometheus
(Debian's 2.42) scraping two real tsctl engine replicas, each labelled as the Prometheus Operator labels
a predictor pod's series: the answer rate and the requests in flight must be what the clients see, so
that KEDA's thresholds (measured by ``tsctl bench --capacity``) compare like with like.
"""

import threading
import time

import pytest
import yaml

from archiver import engines
from archiver.capacity import sweep
from archiver.export.kserve import export as kserve
from helpers.balancer import resnet_tree
from helpers.paths import short_tmp
from helpers.prometheus import prometheus, prometheus_available, query

pytestmark = pytest.mark.matrix  # about 100 s: two replicas, a minute and more of load for rate(...[1m])

CLIENTS = 4
LOAD_SECONDS = 75.0
QUERY_AT = 68.0  # past the rate's minute of load, while the load runs


def predictions(srv) -> str:
    return f"{srv.inference}/predictions/resnet18"


def exported_queries(tmp_path, store, config, bench: dict) -> list:
    """The export's two KEDA metrics (query, threshold), from the real export of this store."""
    result = tmp_path / "bench.json"
    sweep.write(bench, str(result))
    options = kserve.ExportOptions(
        out=str(tmp_path / "out"),
        name="vision",
        storage_uri="pvc://models/tsctl",
        config=str(config),
        model_store=str(store),
        from_bench=str(result),
        autoscale="keda",
        engine="tsctl",
        image="registry.example/tsctl-engine:1",
    )
    kserve.export(options)
    isvc = yaml.safe_load((tmp_path / "out" / "inferenceservice.yaml").read_text())
    metrics = isvc["spec"]["predictor"]["autoScaling"]["metrics"]
    return [(m["external"]["metric"]["query"], float(m["external"]["target"]["value"])) for m in metrics]


def test_the_keda_queries_read_the_engines_load_through_a_real_prometheus(tmp_path):
    if not prometheus_available():
        pytest.skip("no prometheus: apt-get install -y prometheus")
    (tmp_path / "tree").mkdir()
    store, config, inputs = resnet_tree(tmp_path / "tree", images=4)
    bodies = [(p.read_bytes(), "image/jpeg") for p in inputs]
    servers = []
    try:
        for _ in range(2):
            servers.append(engines.serve("tsctl", str(config), str(store), str(short_tmp("rep-")), 300))
        bench = sweep.document(
            "resnet18",
            "tsctl",
            {
                "workers": 1,
                "max_workers": 1,
                "batch_size": 8,
                "max_batch_delay_ms": 20,
                "cpu": None,
                "memory_bytes": None,
            },
            [(p.name, p.stat().st_size) for p in inputs],
            None,
            [sweep.step(predictions(servers[0]), bodies, 2, 40, 10, metrics_url=servers[0].metrics, model="resnet18")],
            "measured one step",
        )
        (rate_query, _), (load_query, _) = exported_queries(tmp_path, store, config, bench)
        assert rate_query.startswith("sum(rate(ts_inference_requests_total{") and rate_query.endswith("[1m]))")
        targets = {
            srv.metrics.split("//")[1]: {"namespace": "default", "pod": f"vision-predictor-{i}-abcde"}
            for i, srv in enumerate(servers)
        }
        with prometheus(targets) as prom:
            deadline = time.monotonic() + 30
            while query(prom, 'sum(up{job="pods"})') != 2.0:  # both replicas scraped
                assert time.monotonic() < deadline, "prometheus did not scrape both replicas in 30 s"
                time.sleep(0.5)
            assert query(prom, load_query) == 0.0
            seen = {}

            def sample():
                time.sleep(QUERY_AT)
                seen["rate"], seen["in_flight"] = query(prom, rate_query), query(prom, load_query)

            sampler = threading.Thread(target=sample)
            sampler.start()
            half = CLIENTS // 2
            steps = [None, None]

            def load(index):
                srv = servers[index]
                steps[index] = sweep.step(predictions(srv), bodies, half, 100000, LOAD_SECONDS)

            loaders = [threading.Thread(target=load, args=(i,)) for i in range(2)]
            for thread in loaders:
                thread.start()
            for thread in loaders + [sampler]:
                thread.join(LOAD_SECONDS + 60)
            answered = sum(s["throughput_rps"] for s in steps)
            print(f"prometheus: rate {seen['rate']:.2f}/s (clients {answered:.2f}/s), in flight {seen['in_flight']:g}")
            assert all(s["errors"] == 0 for s in steps), steps
            # rate(...[1m]) at 68 s is the last minute's answers a second: the clients' own rate
            assert seen["rate"] == pytest.approx(answered, rel=0.15), (seen, answered)
            # in flight, summed over both pods: the clients' requests, less those between two requests
            assert 0.5 * CLIENTS <= seen["in_flight"] <= CLIENTS, seen
            time.sleep(3)
            assert query(prom, load_query) == 0.0  # idle again: nothing left counted
    finally:
        for srv in servers:
            engines.engine_of(srv).stop(srv)
