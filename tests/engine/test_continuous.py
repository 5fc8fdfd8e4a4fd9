"""Continuous batching on the tsctl engine (serving/engine/continuous.py), served: a token handler in the shape
of pytorch/serve's continuous-batching test handler (samples/ts_continuous.py), one worker, batchSize 4, a
step 50 ms. TorchServe 0.12 side by side: tests/conformance/test_continuous_parity.py (make matrix)."""

import json
import threading
import time

import pytest

from archiver import properties
from helpers import streams, ts_grpc
from helpers.engine import Engine
from samples import ts_continuous


def prompt(word: str, tokens: int) -> bytes:
    return json.dumps({"prompt": word, "max_new_tokens": tokens}).encode()


def tokens(word: str, count: int) -> list:
    return [json.dumps({"text": f" {word}{k}"}).encode() for k in range(1, count + 1)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("continuous")
    ts_continuous.build(root / "model-store", batch=4, step=0.05)
    properties.write_config(
        root / "model-store", root / "config" / "config.properties", extra={"disable_token_authorization": "true"}
    )
    running = Engine(root).wait_ready()
    running.stubs = ts_grpc.generate(root / "stubs")
    yield running
    assert running.stop() == 0


def test_each_step_is_a_chunk(engine):
    answer = streams.post(engine.http, "/predictions/tokens", prompt("hello", 5), "application/json")
    assert (answer.status, answer.complete, answer.chunks) == (200, True, tokens("hello", 5))


def test_a_request_joins_the_running_batch(engine):
    """A 3-token request sent 0.5 s into a 60-token one ends long before it (it joined the running batch
    between two steps; before, the first reply's ts_stream_next left the batch waiting for replies that
    never came: both failed at responseTimeout)."""
    got = {}

    def send(word, count, delay):
        time.sleep(delay)
        started = time.perf_counter()
        got[word] = (started, streams.post(engine.http, "/predictions/tokens", prompt(word, count), "application/json"))

    threads = [threading.Thread(target=send, args=args) for args in (("long", 60, 0), ("late", 3, 0.5))]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    (long_start, long), (late_start, late) = got["long"], got["late"]
    assert long.chunks == tokens("long", 60) and late.chunks == tokens("late", 3)
    late_end, long_end = late_start + late.times[-1], long_start + long.times[-1]
    assert late_end < long_end - 1.0, (late_end - long_start, long_end - long_start)


def test_grpc_streams_each_step(engine):
    call = ts_grpc.call("StreamPredictions", model_name="tokens", input={"data": prompt("a", 3)})
    inference, management = f"127.0.0.1:{engine.ts_grpc}", f"127.0.0.1:{engine.ts_grpc_management}"
    [answer] = ts_grpc.calls(engine.stubs, inference, management, [call])
    assert answer["code"] == "OK" and [m["prediction"].encode() for m in answer["messages"]] == tokens("a", 3)


def test_clients_leaving_midway_leave_the_batch(engine):
    """4 clients (the whole batch) leave after 2 chunks of 200 each: their requests are not sent again, and
    the next request is answered at once (else it would wait behind them: 198 steps, about 10 s)."""
    leaving = [
        threading.Thread(
            target=streams.post,
            args=(engine.http, "/predictions/tokens", prompt(f"gone{k}", 200), "application/json"),
            kwargs={"leave_after": 2},
        )
        for k in range(4)
    ]
    [t.start() for t in leaving]
    [t.join(60) for t in leaving]
    started = time.perf_counter()
    answer = streams.post(engine.http, "/predictions/tokens", prompt("next", 4), "application/json")
    took = time.perf_counter() - started
    assert answer.chunks == tokens("next", 4)
    assert took < 5, f"the next request waited {took:.1f} s behind requests whose clients had left"
    status, [described] = engine.get("/models/tokens")
    assert described["continuousBatching"] is True
    print(f"after 4 clients left: 4 tokens in {took:.2f} s")
