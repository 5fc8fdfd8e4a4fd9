"""The engine's load metrics, the signal to scale on (issue #32, item 4): ``ts_queue_size``,
``ts_requests_in_flight``, ``ts_batch_size_limit``, ``ts_batch_fill_ratio``, ``ts_batches_total`` and
``ts_batched_requests_total`` on ``/metrics``, per model version, for requests over REST and gRPC alike.

A real engine (one worker, batchSize 4, maxBatchDelay 500 ms) serves a handler that sleeps 2 s per
batch; ten requests are sent at once (eight over REST, two over v2 gRPC from tritonclient, each in a
process of its own) and ``/metrics`` is read, by prometheus_client's parser, while they wait and once
they are answered. About 15 s.
"""

import concurrent.futures
import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import grpc_client
from helpers.engine import Engine, snapshot_entry, write_config
from helpers.engine_limits import archive_handler

SLOW = '''\
import json
import time

from ts.metrics.metric_type_enum import MetricTypes


def handle(data, context):
    """Each batch sleeps 2 s, then answers each of its requests with the batch's size, in a v2 answer; a body "forge"
    emits metrics under the engine's load names instead."""
    if data is None:
        return None
    if any(row.get("body") in (b"forge", bytearray(b"forge"), "forge") for row in data):
        for name in ("ts_queue_size", "ts_requests_in_flight", "ts_batches_total", "ts_batched_requests"):
            context.metrics.add_counter(name, 99)
        context.metrics.add_metric("ts_batch_fill_ratio", 99, "ratio", metric_type=MetricTypes.GAUGE)
        return [{"forged": True} for _ in data]
    time.sleep(2)
    size = json.dumps({"batch": len(data)})  # a v2 answer, which gRPC needs and REST passes on as it is
    return [{"outputs": [{"name": "output-0", "datatype": "BYTES", "shape": [1], "data": [size]}]} for _ in data]
'''
REST, GRPC = 8, 2
NAMES = (
    "ts_queue_size",
    "ts_requests_in_flight",
    "ts_batch_size_limit",
    "ts_batch_fill_ratio",
    "ts_batches_total",
    "ts_batched_requests_total",
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    (root / "slow.py").write_text(SLOW)
    (root / "model-store").mkdir()
    archive_handler(root / "slow.py", ["slow"], root / "model-store")
    (root / "config").mkdir()
    write_config(root / "config" / "config.properties", {"slow": snapshot_entry("slow.mar", 1, 4, 500, 60)})
    running = Engine(root).wait_ready()
    yield running
    running.stop()


def load(engine) -> dict:
    """The load metrics of model slow 1.0: name -> value."""
    status, text = engine.get("/metrics")
    assert status == 200, text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model_name") == "slow" and sample.name in NAMES:
                assert sample.labels == {
                    "model_name": "slow",
                    "model_version": "1.0",
                    "hostname": sample.labels["hostname"],
                }, sample
                values[sample.name] = sample.value
    return values


def until(engine, wanted, seconds: float = 20) -> dict:
    """The load metrics once ``wanted`` holds of them (or the last read, after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while True:
        got = load(engine)
        if wanted(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_queue_in_flight_and_batch_fill_over_rest_and_grpc(engine):
    idle = load(engine)
    assert idle == {
        "ts_queue_size": 0,
        "ts_requests_in_flight": 0,
        "ts_batch_size_limit": 4,
        "ts_batch_fill_ratio": 0,
        "ts_batches_total": 0,
        "ts_batched_requests_total": 0,
    }, idle
    with concurrent.futures.ThreadPoolExecutor(REST + GRPC) as pool:
        # gRPC first (tritonclient starts in a process of its own): its two requests in the worker's batch
        grpc = [
            pool.submit(grpc_client.call, f"127.0.0.1:{engine.grpc}", "slow", [b"x"], timeout=60) for _ in range(GRPC)
        ]
        busy = until(engine, lambda got: got["ts_requests_in_flight"] >= 1)
        rest = [pool.submit(engine.post, "/predictions/slow", b"x", "text/plain", 60) for _ in range(REST)]
        busy = until(engine, lambda got: got["ts_requests_in_flight"] == REST + GRPC)
        # all ten taken; at most one batch of four in the worker, the rest waiting
        assert busy["ts_requests_in_flight"] == REST + GRPC, busy
        assert REST + GRPC - 4 <= busy["ts_queue_size"] <= REST + GRPC - 1, busy
        answers = [f.result() for f in rest]
        assert all(status == 200 for status, _ in answers), answers
        assert all(got["answers"] for got in (f.result() for f in grpc))
    done = load(engine)
    sizes = [json.loads(body["outputs"][0]["data"][0])["batch"] for _, body in answers]
    assert done["ts_queue_size"] == 0 and done["ts_requests_in_flight"] == 0, done
    assert done["ts_batched_requests_total"] == REST + GRPC, done
    assert 3 <= done["ts_batches_total"] <= REST + GRPC and max(sizes) == 4, (done, sizes)
    assert 0 < done["ts_batch_fill_ratio"] <= 1, done


def test_a_worker_cannot_write_the_load_metrics(engine):
    """The names are the engine's: a handler's metric lines under them are not recorded, and the load
    metrics stay one series each (the test above ran first: ten requests answered)."""
    before = load(engine)
    status, body = engine.post("/predictions/slow", b"forge", "application/octet-stream")
    assert status == 200 and body == {"forged": True}, body
    time.sleep(1)  # the worker's metric lines come on a channel of their own
    status, text = engine.get("/metrics")
    lines = [line for line in text.splitlines() if line.partition("{")[0].partition(" ")[0] in NAMES]
    assert len(lines) == len(NAMES) and not any(line.endswith(" 99.0") for line in lines), lines
    after = load(engine)
    assert after["ts_batched_requests_total"] == before["ts_batched_requests_total"] + 1, (before, after)
    assert after["ts_queue_size"] == after["ts_requests_in_flight"] == 0, after
