"""Sequence batching on the tsctl engine (serving/engine/sequences.py), served: one engine, pytorch/serve's
stateful example (its stand-in, or the checkout's own with TSCTL_PYTORCH_SERVE) and this project's
running-sum handler, packaged with torch-model-archiver. TorchServe 0.12 side by side is
tests/conformance/test_sequence_parity.py (make matrix)."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from archiver import properties
from helpers import sequences, ts_grpc
from helpers.engine import Engine
from helpers.engine_limits import engine_rss
from samples import ts_stateful

IDLE_MS = 1500


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("sequences")
    store = root / "model-store"
    ts_stateful.build(store, idle_ms=IDLE_MS, queue=2)
    ts_stateful.running_sum(store, "many", idle_ms=60_000, workers=1, batch=8, sequences=2000, queue=1)
    properties.write_config(store, root / "config" / "config.properties", extra={"disable_token_authorization": "true"})
    running = Engine(root).wait_ready()
    running.stubs = ts_grpc.generate(root / "stubs")
    yield running
    assert running.stop() == 0


def post(engine, model: str, body, sequence=None, end=False):
    return sequences.post(engine.url, model, body, sequence, end)


def idle():
    time.sleep(IDLE_MS / 1000 + 0.7)


def test_concurrent_sequences_keep_their_state_over_two_workers(engine):
    """4 sequences at once on each model, 6 requests each, over 2 workers with batchSize 4: every running sum
    is its own (before, any worker took each request: sums such as 4 for 6)."""
    answers = {}

    def sequence(model, name):
        answers[(model, name)] = [post(engine, model, value, name) for value in range(1, 7)]

    models = ("stateful", "running_sum")
    threads = [threading.Thread(target=sequence, args=(m, f"c{k}")) for k in range(4) for m in models]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    sums = [1, 3, 6, 10, 15, 21]
    for k in range(4):
        assert answers[("stateful", f"c{k}")] == [(200, s) for s in sums]
        assert [a["sum"] for _, a in answers[("running_sum", f"c{k}")]] == sums
        assert [a["count"] for _, a in answers[("running_sum", f"c{k}")]] == list(range(1, 7))
    idle()


def test_open_sequences_are_bounded_and_expire(engine):
    """maxNumSequence 4: a fifth sequence gets TorchServe's 503 while four are open, and is taken once they
    have been idle sequenceMaxIdleMSec; a request without an id opens one of its own, start header set."""
    assert [post(engine, "stateful", k, f"b{k}")[0] for k in range(4)] == [200] * 4
    status, answer = post(engine, "stateful", 1, "b4")
    assert status == 503 and "has no worker to serve inference request" in answer[1]
    idle()
    assert post(engine, "stateful", 1, "b4") == (200, 1)
    assert post(engine, "running_sum", 7)[1] == {"sum": 7, "count": 1, "start": True, "end": False}
    idle()


def test_an_ended_sequence_frees_its_place_at_once(engine):
    for k in range(4):
        assert post(engine, "running_sum", 2, f"e{k}")[0] == 200
        assert post(engine, "running_sum", 3, f"e{k}", end=True)[1] == {
            "sum": 5,
            "count": 2,
            "start": False,
            "end": True,
        }
    assert post(engine, "running_sum", 1, "e9")[0] == 200  # no wait for expiry
    idle()


def test_a_sequence_queue_is_bounded(engine):
    """maxSequenceJobQueueSize 2: while its worker holds one request, two wait and the rest get 503."""
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(post, engine, "running_sum", "sleep 2", "q1")
        time.sleep(0.5)
        rest = [pool.submit(post, engine, "running_sum", 1, "q1") for _ in range(4)]
        assert first.result()[0] == 200
        assert sorted(f.result()[0] for f in rest) == [200, 200, 503, 503]
    idle()


def test_a_worker_dying_mid_sequence_loses_its_state_not_the_sequence(engine):
    """The request held by a worker that dies gets 503 with the cause; the sequence stays on that worker's
    slot, started again, its state gone (as on TorchServe, which answers that request 507)."""
    assert post(engine, "running_sum", 4, "d1")[1]["sum"] == 4
    status, answer = post(engine, "running_sum", "die", "d1")
    assert status == 503 and "Worker died" in answer[1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, answer = post(engine, "running_sum", 3, "d1")
        if status == 200:
            break
        time.sleep(0.5)
    assert (status, answer) == (200, {"sum": 3, "count": 1, "start": False, "end": False})
    idle()


def test_stream_predictions2_carries_a_sequence(engine):
    calls = [
        ts_grpc.stream2(
            [{"model_name": "running_sum", "sequence_id": "g1", "input": {"data": str(i).encode()}} for i in (1, 2, 3)]
            + [
                {
                    "model_name": "running_sum",
                    "sequence_id": "g1",
                    "input": {"data": b"4", "ts_request_sequence_end": b"true"},
                }
            ]
        ),
        ts_grpc.stream2([{"model_name": "running_sum", "input": {"data": b"5"}}]),
    ]
    inference, management = f"127.0.0.1:{engine.ts_grpc}", f"127.0.0.1:{engine.ts_grpc_management}"
    streamed, unnamed = ts_grpc.calls(engine.stubs, inference, management, calls)
    assert [json.loads(m["prediction"])["sum"] for m in streamed["messages"]] == [1, 3, 6, 10]
    assert json.loads(streamed["messages"][-1]["prediction"])["end"] is True
    assert unnamed["messages"][0]["status"]["message"] == "Parameter sequenceId is required."
    idle()


def test_describe_shows_the_sequence_settings_in_force(engine):
    status, [described] = engine.get("/models/stateful")
    assert status == 200
    assert {
        k: described[k]
        for k in ("stateful", "sequenceMaxIdleMSec", "sequenceTimeoutMSec", "maxNumSequence", "maxSequenceJobQueueSize")
    } == {
        "stateful": True,
        "sequenceMaxIdleMSec": IDLE_MS,
        "sequenceTimeoutMSec": 0,
        "maxNumSequence": 4,
        "maxSequenceJobQueueSize": 2,
    }


def test_clients_that_never_end_their_sequences_do_not_grow_the_engine(engine):
    """2,400 requests, each opening a sequence it never ends (60 s idle), on a model allowing 2,000: 2,000
    answered, the rest 503 at once; the engine's memory stays within a few MiB."""
    before = engine_rss(engine)
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda k: post(engine, "many", 1, f"open-{k}")[0], range(2400)))
    grown = engine_rss(engine) - before
    assert statuses.count(200) == 2000 and statuses.count(503) == 400
    assert grown < 48 * 2**20, f"the engine grew {grown / 2**20:.0f} MiB"
    print(f"2,400 unended sequences: 2,000 open, 400 refused, engine +{grown / 2**20:.1f} MiB")
