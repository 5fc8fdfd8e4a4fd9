"""Sequence batching, TorchServe 0.12 and the tsctl engine side by side: pytorch/serve's stateful example
(its stand-in, or the checkout's own with TSCTL_PYTORCH_SERVE) and this project's running-sum handler,
packaged with torch-model-archiver, 2 workers, batchSize 4, maxNumSequence 4, maxSequenceJobQueueSize 2.
The same calls to both; answers equal but where docs/engines.md lists a difference, asserted as it is.
Each case waits sequenceMaxIdleMSec after it on both sides, so the next starts with no sequence open.

make matrix (TorchServe takes ~20 s to start); tests/engine/test_sequences.py is the engine's own run.
The last case breaks TorchServe's model (unary gRPC calls to a stateful model), so it runs last."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from archiver import properties, server
from helpers import sequences, side_by_side, ts_grpc
from samples import ts_stateful

pytestmark = pytest.mark.matrix

IDLE_MS = 2000


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    root = tmp_path_factory.mktemp("sequence-parity")
    store = root / "model-store"
    ts_stateful.build(store, idle_ms=IDLE_MS, queue=2)
    properties.write_config(store, root / "config" / "config.properties", extra={"disable_token_authorization": "true"})
    stubs = ts_grpc.generate(root / "stubs")
    with side_by_side.started(root, "tsseq-") as (torchserve, engine):
        yield {
            "TorchServe": (
                torchserve.inference,
                torchserve.management,
                torchserve.ts_grpc_inference,
                torchserve.ts_grpc_management,
                stubs,
            ),
            "engine": (
                engine.url,
                engine.url,
                f"127.0.0.1:{engine.ts_grpc}",
                f"127.0.0.1:{engine.ts_grpc_management}",
                stubs,
            ),
        }


def post(side, model: str, body, sequence=None, end=False):
    return sequences.post(side[0], model, body, sequence, end)


def both(sides, run) -> dict:
    """{side: run(side)}, each side left with no sequence open (sequenceMaxIdleMSec waited)."""
    answers = {}
    for name, side in sides.items():
        answers[name] = run(side)
        time.sleep(IDLE_MS / 1000 + 1)
    return answers


def same(sides, run):
    answers = both(sides, run)
    assert answers["TorchServe"] == answers["engine"]
    return answers["engine"]


def test_concurrent_sequences_over_two_workers(sides):
    def run(side):
        answers = {}

        def sequence(model, name):
            answers[(model, name)] = [post(side, model, value, name) for value in range(1, 7)]

        threads = [
            threading.Thread(target=sequence, args=(m, f"c{k}")) for k in range(4) for m in ("stateful", "running_sum")
        ]
        [t.start() for t in threads]
        [t.join(120) for t in threads]
        return answers

    answers = same(sides, run)
    assert answers[("stateful", "c0")] == [(200, s) for s in (1, 3, 6, 10, 15, 21)]


def test_open_sequences_bound_and_expiry(sides):
    def run(side):
        opened = [post(side, "stateful", k, f"b{k}") for k in range(6)]
        time.sleep(IDLE_MS / 1000 + 0.8)
        return opened + [post(side, "stateful", 1, "b5"), post(side, "running_sum", 7)]

    answers = same(sides, run)
    assert [status for status, _ in answers] == [200] * 4 + [503] * 2 + [200, 200]


def test_the_end_header_and_a_later_request(sides):
    same(
        sides,
        lambda side: [
            post(side, "running_sum", 1, "e1"),
            post(side, "running_sum", 2, "e1", end=True),
            post(side, "running_sum", 3, "e1"),
        ],
    )


def test_a_full_sequence_queue(sides):
    def run(side):
        with ThreadPoolExecutor(6) as pool:
            first = pool.submit(post, side, "running_sum", "sleep 2", "q1")
            time.sleep(0.5)
            rest = [pool.submit(post, side, "running_sum", 1, "q1") for _ in range(4)]
            return [first.result()[0]] + sorted(f.result()[0] for f in rest)

    assert same(sides, run) == [200, 200, 200, 503, 503]


def test_describe_gives_the_same_settings(sides):
    def run(side):
        status, [described] = server.request(f"{side[1]}/models/stateful", timeout=10)
        return {k: v for k, v in described.items() if k not in ("workers", "jobQueueStatus", "loadedAtStartup")}

    assert same(sides, run)["stateful"] is True


def test_a_worker_killed_mid_sequence(sides):
    """The request whose worker dies: TorchServe 507, the engine 503 naming the cause (docs/engines.md); the
    sequence goes on, on the worker started again, its state lost, on both."""

    def run(side):
        before = post(side, "running_sum", 4, "d1")
        died = post(side, "running_sum", "die", "d1")[0]
        time.sleep(8)  # the worker started again (TorchServe's describe did not show both READY within 120 s)
        return before, died, post(side, "running_sum", 3, "d1")

    answers = both(sides, run)
    assert answers["TorchServe"][1] == 507 and answers["engine"][1] == 503
    for name in answers:
        assert answers[name][0] == (200, {"sum": 4, "count": 1, "start": False, "end": False})
        assert answers[name][2] == (200, {"sum": 3, "count": 1, "start": False, "end": False})


def test_stream_predictions2(sides):
    """TorchServe 0.12 answers a stateful model's StreamPredictions2 with its 'no worker' status and ends the
    stream; the engine answers each request of the sequence (docs/engines.md). A request without a
    sequence_id: 'Parameter sequenceId is required.' on both (TorchServe never reads a
    ts_request_sequence_start input as true)."""
    named = [{"model_name": "running_sum", "sequence_id": "g1", "input": {"data": str(i).encode()}} for i in (1, 2, 3)]
    started = {"data": b"6", "ts_request_sequence_start": b"true"}
    unnamed = [{"model_name": "running_sum", "input": {"data": b"5"}}, {"model_name": "running_sum", "input": started}]
    calls = [ts_grpc.stream2(named), ts_grpc.stream2(unnamed)]
    answers = both(sides, lambda side: ts_grpc.calls(side[4], side[2], side[3], calls))
    theirs, ours = answers["TorchServe"], answers["engine"]
    assert [json.loads(m["prediction"])["sum"] for m in ours[0]["messages"]] == [1, 3, 6]
    their_sums = [json.loads(m["prediction"])["sum"] for m in theirs[0]["messages"] if "prediction" in m]
    assert their_sums != [1, 3, 6], theirs[0]  # its first answer 'has no worker...', the stream ended
    assert theirs[1] == ours[1]
    assert [m["status"]["message"] for m in ours[1]["messages"]] == ["Parameter sequenceId is required."] * 2


def test_unary_grpc_calls_to_a_stateful_model(sides):
    """TorchServe 0.12 never answers them (each goes to a sequence named "", its dispatcher's own signal) and
    its model answers nothing after; the engine answers each as a sequence of its own. Last: it breaks
    TorchServe's model."""
    calls = [ts_grpc.call("Predictions", model_name="running_sum", input={"data": b"2"}, timeout=15)]
    answers = {name: ts_grpc.calls(side[4], side[2], side[3], calls) for name, side in sides.items()}
    assert answers["TorchServe"][0]["code"] == "DEADLINE_EXCEEDED"
    assert json.loads(answers["engine"][0]["messages"][0]["prediction"]) == {
        "sum": 2,
        "count": 1,
        "start": True,
        "end": False,
    }
