"""Continuous batching, TorchServe 0.12 and the tsctl engine side by side (make matrix): samples/ts_continuous.py's
token handler (pytorch/serve's continuous-batching test handler's shape), one worker, batchSize 4, a step
50 ms. The same chunks over HTTP; a request sent while a long one runs joins its batch on both; gRPC's
StreamPredictions: TorchServe 0.12 sends the first token and then nothing until the call's deadline
(docs/engines.md), the engine every token."""

import json
import threading
import time

import pytest

from archiver import properties
from helpers import side_by_side, streams, ts_grpc
from helpers.processes import run_alone
from samples import ts_continuous, ts_examples

pytestmark = pytest.mark.matrix


def prompt(word: str, tokens: int) -> bytes:
    return json.dumps({"prompt": word, "max_new_tokens": tokens}).encode()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = tmp_path_factory.mktemp("continuous-parity") / "model-store"
    ts_continuous.build(store, batch=4, step=0.05)
    return store


@pytest.fixture(scope="module")
def sides(store):
    root = store.parent
    properties.write_config(store, root / "config" / "config.properties", extra={"disable_token_authorization": "true"})
    stubs = ts_grpc.generate(root / "stubs")
    with side_by_side.started(root, "tscb-") as (torchserve, engine):
        yield {
            "TorchServe": (
                side_by_side.http_port(torchserve),
                torchserve.ts_grpc_inference,
                torchserve.ts_grpc_management,
                stubs,
            ),
            "engine": (engine.http, f"127.0.0.1:{engine.ts_grpc}", f"127.0.0.1:{engine.ts_grpc_management}", stubs),
        }


def test_the_same_chunks_over_http(sides):
    answers = {
        name: streams.post(side[0], "/predictions/tokens", prompt("hello", 6), "application/json")
        for name, side in sides.items()
    }
    assert answers["TorchServe"].chunks == answers["engine"].chunks and len(answers["engine"].chunks) == 6
    for name in ("ts_stream_next", "content-type", "transfer-encoding"):
        assert answers["TorchServe"].header(name) == answers["engine"].header(name), name


def test_a_late_request_joins_the_running_batch_on_both(sides):
    for name, side in sides.items():
        got = {}

        def send(word, count, delay, port=side[0]):
            time.sleep(delay)
            started = time.perf_counter()
            got[word] = (started, streams.post(port, "/predictions/tokens", prompt(word, count), "application/json"))

        threads = [threading.Thread(target=send, args=args) for args in (("long", 60, 0), ("late", 3, 0.5))]
        [t.start() for t in threads]
        [t.join(120) for t in threads]
        (long_start, long), (late_start, late) = got["long"], got["late"]
        assert len(long.chunks) == 60 and len(late.chunks) == 3, name
        assert late_start + late.times[-1] < long_start + long.times[-1] - 1.0, name


def test_grpc_stream_predictions(sides):
    call = ts_grpc.call("StreamPredictions", model_name="tokens", input={"data": prompt("a", 3)}, timeout=15)
    answers = {name: ts_grpc.calls(side[3], side[1], side[2], [call])[0] for name, side in sides.items()}
    assert answers["engine"]["code"] == "OK" and len(answers["engine"]["messages"]) == 3
    assert answers["TorchServe"]["code"] == "DEADLINE_EXCEEDED"
    assert answers["TorchServe"]["messages"] == answers["engine"]["messages"][:1]


def test_tsctl_run_answers_the_chunks_torchserve_streams_joined(sides, store, tmp_path):
    """``tsctl run`` on the continuous archive drives its steps to the end as TorchServe does (it waited for
    ever before): its answer is TorchServe's chunks joined, as a client reading the whole stream gets it."""
    torchserve = streams.post(sides["TorchServe"][0], "/predictions/tokens", prompt("hello", 6), "application/json")
    (tmp_path / "prompt.json").write_bytes(prompt("hello", 6))
    done = run_alone(
        [ts_examples.BIN / "tsctl", "run", "--json", store / "tokens.mar", tmp_path / "prompt.json"],
        cwd=tmp_path,
        timeout=120,
    )
    assert done.code == 0, done.stderr
    [result] = json.loads(done.stdout)["results"]
    assert (result["status"], result["answer"]) == (200, torchserve.body.decode()) and len(torchserve.chunks) == 6
