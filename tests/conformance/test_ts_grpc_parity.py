"""TorchServe 0.12 and the tsctl engine side by side, the same calls to both: TorchServe's gRPC APIs from a
client generated from pytorch/serve's protos and from its example client script (both as processes),
and streamed answers over HTTP and gRPC (samples/ts_streaming.py's archives, pytorch/serve's mnist
example on a real model: its stand-in, or its own files with TSCTL_PYTORCH_SERVE). Statuses and
bodies must be equal, but where docs/engines.md lists a difference, which is then asserted as it is.

One TorchServe and one engine for the module (TorchServe takes ~20 s to start): all of it under
``matrix``; tests/engine/test_ts_grpc.py is the engine's own smoke in the default run. The last test
breaks TorchServe's workers (its bugs), so it runs last.
"""

import json
import re
from pathlib import Path

import pytest

from archiver import properties, server
from helpers import side_by_side, streams, ts_grpc, waiting
from samples import ts_examples, ts_streaming

pytestmark = pytest.mark.matrix

MAX_RESPONSE = 1_000_000
TORCHSERVE_ONLY_HEADERS = {"x-request-id", "pragma", "cache-control", "expires", "connection"}  # on every answer
ENGINE_ONLY_HEADERS = {"date", "server"}  # uvicorn's, on every answer


class Side:
    """One server: its HTTP inference port, its REST management address, its gRPC APIs' addresses."""

    def __init__(self, http: int, rest_management: str, inference: str, management: str, stubs: Path):
        self.http, self.rest_management, self.stubs = http, rest_management, stubs
        self.inference, self.management = inference, management

    def wait_ready(self, model: str = "probe", timeout: float = 60):
        """Until the model's workers are READY again (after a worker died), as long as their states move
        (helpers/waiting.py)."""

        def workers():
            status, body = server.request(f"{self.rest_management}/models/{model}", timeout=10)
            return tuple((w["status"], w["pid"]) for w in body[0]["workers"]) if status == 200 else (status, body)

        def ready(shown):
            return bool(shown) and all(isinstance(w, tuple) and w[0] == "READY" and w[1] > 0 for w in shown)

        waiting.until(workers, ready, f"{model} not ready again", timeout=timeout)

    def calls(self, wanted: list) -> list:
        return ts_grpc.calls(self.stubs, self.inference, self.management, wanted)

    def example(self, *args: str):
        return ts_grpc.example(self.stubs, self.inference, self.management, *args)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    store = root / "model-store"
    ts_streaming.build(store, max_new_tokens=20)
    mnist = ts_examples.build_mnist(root / "mnist", ts_examples.checkout())
    ts_examples.package(mnist, "torch-model-archiver", store)
    properties.write_config(
        store, root / "config" / "config.properties", extra={"max_response_size": str(MAX_RESPONSE)}
    )
    (root / "digit.png").write_bytes(mnist.inputs[2][0])
    (root / "request.json").write_bytes(ts_streaming.PROMPT)
    (root / "hi.txt").write_bytes(b"hi")
    return root


@pytest.fixture(scope="module")
def sides(tree):
    stubs = ts_grpc.generate(tree / "stubs")
    with side_by_side.started(tree, "tsgp-") as (torchserve, engine):
        yield {
            "TorchServe": Side(
                side_by_side.http_port(torchserve),
                torchserve.management,
                torchserve.ts_grpc_inference,
                torchserve.ts_grpc_management,
                stubs,
            ),
            "engine": Side(
                engine.http, engine.url, f"127.0.0.1:{engine.ts_grpc}", f"127.0.0.1:{engine.ts_grpc_management}", stubs
            ),
        }


def without_cause(details: str) -> str:
    """The engine's details as TorchServe words them: without the handler's error after "Prediction failed"."""
    return re.sub(r"^Prediction failed: [^\n]*", "Prediction failed", details)


def both(sides, run):
    """{side: run(side)}."""
    return {name: run(side) for name, side in sides.items()}


def test_the_same_grpc_calls_get_the_same_answers(sides):
    call = ts_grpc.call
    digit = ts_examples.digit_png(7, -1)
    wanted = [
        call("Ping"),
        call("Predictions", model_name="mnist", input={"data": digit}),
        call("Predictions", model_name="mnist", model_version="1.0", input={"data": digit}),
        call("Predictions", model_name="nope", input={"data": b"x"}),
        call("Predictions", model_name="mnist", model_version="9", input={"data": digit}),
        call("Predictions", input={"data": b"x"}),
        call("Predictions", model_name="probe", input={"data": b"fail"}),
        call("Predictions", model_name="probe", input={"data": b"status 418"}),
        call("Predictions", model_name="probe", input={"data": b"hello there", "more": b"x"}),
        call("StreamPredictions", model_name="streaming", input={"data": ts_streaming.PROMPT}),
        call("StreamPredictions", model_name="probe", input={"data": b"stream 3 2 0.1"}),
        call("StreamPredictions", model_name="probe", input={"data": b"fail"}),
        call("StreamPredictions", model_name="nope", input={"data": b"x"}),
        call("ListModels"),
        call("ListModels", limit=2),
        call("ListModels", limit=2, next_page_token=2),
        call("ListModels", limit=500, next_page_token=-3),
        call("DescribeModel", model_name="nope"),
        call("DescribeModel", model_name="probe", model_version="9"),
        call("RegisterModel", url="probe.mar"),
        call("UnregisterModel", model_name="probe"),
        call("ScaleWorker", model_name="nope", min_worker=1),
        call("SetDefault", model_name="probe", model_version="9"),
    ]
    answers = both(sides, lambda side: side.calls(wanted))
    for wanted_call, torchserve, engine in zip(wanted, answers["TorchServe"], answers["engine"]):
        if engine.get("details", "").startswith("Prediction failed: "):  # the engine adds the handler's error
            engine = {**engine, "details": without_cause(engine["details"])}
        assert torchserve == engine, (wanted_call["rpc"], wanted_call["request"], torchserve, engine)
    print(f"{len(wanted)} calls, the same statuses and bodies: {[a['code'] for a in answers['engine']]}")


def test_describe_answers_torchserves_fields_where_the_engine_has_them(sides):
    """DescribeModel: TorchServe's describe, as the engine's REST describe makes it (the fields it has
    are TorchServe's, with TorchServe's values; it leaves out the ones listed in docs/engines.md)."""
    wanted = [
        ts_grpc.call("DescribeModel", model_name="mnist"),
        ts_grpc.call("DescribeModel", model_name="mnist", model_version="all"),
    ]
    answers = both(sides, lambda side: side.calls(wanted))
    for torchserve, engine in zip(answers["TorchServe"], answers["engine"]):
        assert torchserve["code"] == engine["code"] == "OK"
        [theirs], [ours] = json.loads(torchserve["messages"][0]["msg"]), json.loads(engine["messages"][0]["msg"])
        for key in set(ours) - {"workers", "jobQueueStatus", "loadedAtStartup"}:
            assert ours[key] == theirs[key], key
        assert set(ours["workers"][0]) <= set(theirs["workers"][0])


def test_writes_the_engine_does_not_do_yet(sides):
    """ScaleWorker and SetDefault on a served model: TorchServe 0.12 does them even with the model API
    disabled; the engine answers PERMISSION_DENIED as for every write (docs/engines.md)."""
    wanted = [
        ts_grpc.call("ScaleWorker", model_name="probe", min_worker=1, max_worker=1, synchronous=True),
        ts_grpc.call("SetDefault", model_name="probe", model_version="1.0"),
    ]
    answers = both(sides, lambda side: side.calls(wanted))
    assert [a["messages"][0]["msg"] for a in answers["TorchServe"]] == [
        "Workers scaled to 1 for model: probe",
        'Default version successfully updated for model "probe" to "1.0"',
    ]
    disabled = "Model API disabled\norg.pytorch.serve.archive.model.ModelException"
    assert [(a["code"], a["details"]) for a in answers["engine"]] == [("PERMISSION_DENIED", disabled)] * 2


def test_the_example_client_script_prints_the_same(sides, tree):
    """pytorch/serve's ts_scripts/torchserve_grpc_client.py (or its stand-in) as a process, unchanged:
    the same exit codes and output for infer, infer_stream, a model that does not exist, register and
    unregister (its infer_stream2 fails on its own before any call)."""
    runs = [
        ("infer", "mnist", str(tree / "digit.png")),
        ("infer_stream", "streaming", str(tree / "request.json")),
        ("infer", "nope", str(tree / "digit.png")),
        ("register", "probe"),
        ("unregister", "probe"),
    ]
    for args in runs:
        torchserve, engine = (side.example(*args) for side in sides.values())
        if args[1] == "nope":  # the script does not catch the error: compare the error's details
            assert torchserve[0] == engine[0] == 1
            assert "Model not found: nope" in torchserve[2] and "Model not found: nope" in engine[2]
            continue
        assert torchserve[:2] == engine[:2], (args, torchserve, engine)


def test_streamed_answers_arrive_alike_over_http_and_grpc(sides):
    """The same chunks and gRPC messages, the same status, content type, ts_stream_next and chunked
    transfer; each side's headers of every answer (TorchServe's x-request-id, no-cache and connection
    headers, uvicorn's date and server) as docs/engines.md lists them."""
    for path, body in (("/predictions/streaming", ts_streaming.PROMPT), ("/predictions/probe", b"stream 3 2 0.2")):
        answers = both(sides, lambda side: streams.post(side.http, path, body))
        torchserve, engine = answers["TorchServe"], answers["engine"]
        assert torchserve.complete and engine.complete
        assert (torchserve.status, torchserve.chunks) == (engine.status, engine.chunks), (torchserve, engine)
        for name in ("ts_stream_next", "content-type", "transfer-encoding"):
            assert torchserve.header(name) == engine.header(name), name
        theirs, ours = {k for k, _ in torchserve.headers}, {k for k, _ in engine.headers}
        assert theirs - ours == TORCHSERVE_ONLY_HEADERS and ours - theirs == ENGINE_ONLY_HEADERS, (theirs, ours)
    wanted = [ts_grpc.call("StreamPredictions", model_name="streaming", input={"data": ts_streaming.PROMPT})]
    answers = both(sides, lambda side: side.calls(wanted))
    assert answers["TorchServe"] == answers["engine"]
    assert len(answers["engine"][0]["messages"]) == 51  # 50 tokens, then ""


def test_a_worker_that_dies_mid_stream(sides):
    """Two parts, then the worker's process ends: over HTTP both sides send the two chunks and end the
    connection without the last one; over gRPC both send the two messages, then an error: TorchServe's
    INTERNAL ``Worker died.``, the engine's UNAVAILABLE naming the cause (docs/engines.md)."""
    answers = both(sides, lambda side: streams.post(side.http, "/predictions/probe", b"die 2"))
    for answer in answers.values():
        assert answer.status == 200 and answer.chunks == [b"part0", b"part1"] and not answer.complete, answer
    for side in sides.values():  # both start the worker again (TorchServe after 1 s, the engine at once)
        side.wait_ready()
    wanted = [ts_grpc.call("StreamPredictions", model_name="probe", input={"data": b"die 2"})]
    answers = both(sides, lambda side: side.calls(wanted)[0])
    for answer in answers.values():
        assert [m["prediction"] for m in answer["messages"]] == ["part0", "part1"], answer
    assert (answers["TorchServe"]["code"], answers["TorchServe"]["details"]) == (
        "INTERNAL",
        "Worker died.\norg.pytorch.serve.http.InternalServerException",
    )
    assert answers["engine"]["code"] == "UNAVAILABLE" and answers["engine"]["details"].startswith(
        "Worker died (exit code 3) while it held this request.\n"
    )
    for side in sides.values():
        side.wait_ready()


def test_where_torchserve_breaks_and_the_engine_does_not(sides, tree):
    """Last: these leave TorchServe's probe worker broken. StreamPredictions of a whole answer: TorchServe
    sends it, then fails the call (``Worker died.``) and restarts its worker; the engine ends it OK (so
    the example script's infer_stream prints the same and exits 1 on TorchServe, 0 on the engine).
    Predictions of a streamed answer: both answer its first part, then TorchServe's worker hangs (its
    next request passes its deadline), the engine's answers the next. StreamPredictions2 on a model
    without sequence batching: TorchServe fails the call (UNKNOWN, a NullPointerException), the engine
    answers each request."""
    whole = [ts_grpc.call("StreamPredictions", model_name="probe", input={"data": b"hi"})]
    answers = both(sides, lambda side: side.calls(whole)[0])
    assert answers["TorchServe"]["messages"] == answers["engine"]["messages"] and answers["engine"]["code"] == "OK"
    assert answers["TorchServe"]["code"] == "INTERNAL" and answers["TorchServe"]["details"].startswith("Worker died.")
    sides["TorchServe"].wait_ready()
    torchserve, engine = (side.example("infer_stream", "probe", str(tree / "hi.txt")) for side in sides.values())
    assert (torchserve[0], engine[0]) == (1, 0) and torchserve[1] == engine[1], (torchserve, engine)
    sides["TorchServe"].wait_ready()
    sequence = [
        ts_grpc.stream2(
            [
                dict(model_name="probe", sequence_id="s1", input={"data": b"stream 2 1 0"}),
                dict(model_name="probe", sequence_id="s1", input={"data": b"hi"}),
            ]
        )
    ]
    answers = both(sides, lambda side: side.calls(sequence)[0])
    assert answers["TorchServe"]["code"] == "UNKNOWN", answers["TorchServe"]
    assert answers["engine"]["code"] == "OK" and [m["prediction"] for m in answers["engine"]["messages"][:2]] == [
        "0",
        "1",
    ]
    first = [
        ts_grpc.call("Predictions", model_name="probe", input={"data": b"stream 3 2 0"}),
        ts_grpc.call("Predictions", model_name="probe", input={"data": b"hi"}, timeout=10),
    ]
    answers = both(sides, lambda side: side.calls(first))
    assert answers["TorchServe"][0] == answers["engine"][0] and answers["engine"][0]["messages"] == [
        {"prediction": "00"}
    ]
    assert answers["TorchServe"][1]["code"] == "DEADLINE_EXCEEDED" and answers["engine"][1]["code"] == "OK"
