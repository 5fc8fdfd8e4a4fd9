"""TorchServe's own gRPC API and streamed answers on the tsctl engine (serving/engine/ts_grpc.py,
serving/engine/streams.py), one engine for the module serving the archives of samples/ts_streaming.py
(``max_response_size`` 1 MB): a client generated from pytorch/serve's protos and its example client
script as processes, HTTP chunks and gRPC messages as they arrive, and the hostile cases (many tiny
parts, a part above max_response_size, a slow reader, a client that leaves, a worker that dies
mid-stream), the engine's and the workers' pids checked before and after. TorchServe 0.12 side by side:
tests/conformance/test_ts_grpc_parity.py.
"""

import concurrent.futures
import json
import re
import subprocess
import sys
import time

import grpc
import pytest

from archiver import properties, server
from helpers import streams, ts_grpc, waiting
from helpers.engine import Engine
from samples import ts_streaming
from serving.engine import ts_protos as pb

MAX_RESPONSE = 1_000_000
INFERENCE = "/" + pb.INFERENCE_SERVICE + "/"
DETAILS = {
    "unknown": "Model not found: nope\norg.pytorch.serve.archive.model.ModelNotFoundException",
    "fail": "Prediction failed\norg.pytorch.serve.http.InternalServerException",
    "disabled": "Model API disabled\norg.pytorch.serve.archive.model.ModelException",
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("tsgrpc")
    store = root / "model-store"
    ts_streaming.build(store, token_seconds=0.01, max_new_tokens=20)
    config = root / "config" / "config.properties"
    properties.write_config(store, config, extra={"max_response_size": str(MAX_RESPONSE)})
    running = Engine(root).wait_ready()
    running.stubs = ts_grpc.generate(root / "stubs")
    running.address = f"127.0.0.1:{running.ts_grpc}"
    yield running
    assert running.stop() == 0


def without_cause(details: str) -> str:
    """gRPC details as TorchServe words them: the engine puts the handler's error after "Prediction failed"."""
    return re.sub(r"^Prediction failed: [^\n]*", "Prediction failed", details)


def pids(engine) -> dict:
    return {"engine": engine.process.pid, **{m: [w["pid"] for w in engine.workers(m)] for m in ("probe", "streaming")}}


def channel(engine):
    return grpc.insecure_channel(engine.address)


def predict(engine, body: bytes, model: str = "probe", stream: bool = False, **kwargs):
    """(messages, times, error) of Predictions or StreamPredictions with ``{"data": body}``."""
    with channel(engine) as open_channel:
        kind = open_channel.unary_stream if stream else open_channel.unary_unary
        method = kind(
            INFERENCE + ("StreamPredictions" if stream else "Predictions"),
            response_deserializer=pb.PredictionResponse.FromString,
        )
        request = pb.PredictionsRequest(model_name=model, input={"data": body}).SerializeToString()
        if stream:
            return streams.grpc_stream(lambda r, timeout: method(r, timeout=timeout), request, **kwargs)
        try:
            return [method(request, timeout=60)], None, None
        except grpc.RpcError as exc:
            return [], None, (exc.code(), exc.details())


def test_the_vendored_protos_are_what_the_engine_serves(tmp_path):
    """serving/engine/ts_protos.py's descriptors are serving/engine/protos compiled (and a checkout's protos, with
    TSCTL_PYTORCH_SERVE, are the vendored ones); a process holding the engine's messages and a client's
    generated stubs has both (the same descriptors: no conflict in protobuf's pool)."""
    assert pb.compiled() == pb.DESCRIPTORS, "run: python -m serving.engine.ts_protos --write"
    if ts_grpc.checkout() is not None:
        for name in ("inference.proto", "management.proto"):
            assert (ts_grpc.protos() / name).read_bytes() == (ts_grpc.VENDORED / name).read_bytes(), name
    stubs = ts_grpc.generate(tmp_path / "stubs")
    both = "import inference_pb2, management_pb2, google.rpc.status_pb2; from serving.engine import ts_protos; print(1)"
    done = subprocess.run(
        [sys.executable, "-c", both],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": f"{stubs}:{ts_grpc.ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert done.stdout.strip() == "1", done.stderr


def test_a_generated_client_gets_torchserves_answers(engine):
    """Statuses and bodies as TorchServe 0.12 gives them (test_ts_grpc_parity.py compares them live)."""
    call = ts_grpc.call
    results = ts_grpc.calls(
        engine.stubs,
        engine.address,
        f"127.0.0.1:{engine.ts_grpc_management}",
        [
            call("Ping"),
            call("Predictions", model_name="probe", input={"data": b"hello there", "more": b"x"}),
            call("Predictions", model_name="nope", input={"data": b"x"}),
            call("Predictions", model_name="probe", input={"data": b"fail"}),
            call("Predictions", model_name="probe", input={"data": b"status 418"}),
            call("StreamPredictions", model_name="probe", input={"data": b"stream 3 2 0"}),
            call("ListModels", limit=1),
            call("DescribeModel", model_name="probe", model_version="9"),
            call("RegisterModel", url="probe.mar"),
        ],
    )
    codes = [r["code"] for r in results]
    assert codes == ["OK", "OK", "INTERNAL", "UNAVAILABLE", "OK", "OK", "OK", "NOT_FOUND", "PERMISSION_DENIED"]
    assert results[0]["messages"] == [{"health": '{\n  "status": "Healthy"\n}'}]
    echo = json.loads(results[1]["messages"][0]["prediction"])
    assert echo == {"echo": ["hello", "there"], "inputs": ["data", "more"]}
    assert results[2]["details"] == DETAILS["unknown"] and without_cause(results[3]["details"]) == DETAILS["fail"]
    assert results[3]["details"].startswith("Prediction failed: ")  # the handler's error after TorchServe's words
    assert json.loads(results[4]["messages"][0]["prediction"]) == {"status": 418}  # the handler's status is dropped
    assert [m["prediction"] for m in results[5]["messages"]] == ["00", "11", "22"]
    assert json.loads(results[6]["messages"][0]["msg"]) == {
        "nextPageToken": "1",
        "models": [{"modelName": "probe", "modelUrl": "probe.mar"}],
    }
    assert results[7]["details"] == (
        "Model version: 9 does not exist for model: probe\n"
        "org.pytorch.serve.archive.model.ModelVersionNotFoundException"
    )
    assert results[8]["details"] == DETAILS["disabled"]


def test_the_example_client_script_runs_unchanged_against_the_engine(engine, tmp_path):
    prompt = tmp_path / "request.json"
    prompt.write_bytes(ts_streaming.PROMPT)
    where = (engine.stubs, engine.address, f"127.0.0.1:{engine.ts_grpc_management}")
    code, out, err = ts_grpc.example(*where, "infer_stream", "streaming", str(prompt))
    assert code == 0 and len(out.splitlines()) == 51 and out.splitlines()[0].startswith(" w"), (out, err)
    code, out, err = ts_grpc.example(*where, "infer", "streaming", str(prompt))
    assert code == 0 and out == out.splitlines()[0] + "\n", (out, err)  # the first part, as TorchServe answers
    code, out, err = ts_grpc.example(*where, "register", "probe")
    assert code == 1 and out.endswith(f"Failed to register model probe.\n{DETAILS['disabled']}\n"), (out, err)


def test_a_streamed_answer_arrives_part_by_part_over_http_and_grpc(engine):
    """Each part as the handler sends it (0.4 s apart): the first long before the last; the same bytes,
    TorchServe's status and ``ts_stream_next`` header, chunked."""
    before = pids(engine)
    answer = streams.post(engine.http, "/predictions/probe", b"stream 3 2 0.4")
    assert answer.status == 200 and answer.complete and answer.chunks == [b"00", b"11", b"22"], answer
    assert answer.header("transfer-encoding") == "chunked" and answer.header("ts_stream_next") == "true"
    assert answer.header("content-type") == "text/plain"
    assert answer.times[1] - answer.times[0] > 0.3 and answer.times[2] - answer.times[1] > 0.3, answer.times
    messages, times, error = predict(engine, b"stream 3 2 0.4", stream=True)
    assert error is None and [m.prediction for m in messages] == [b"00", b"11", b"22"]
    assert times[1] - times[0] > 0.3 and times[2] - times[1] > 0.3, times
    assert pids(engine) == before


@pytest.mark.matrix
def test_many_tiny_parts(engine):
    """10,000 one-byte parts (each 51 bytes against max_response_size, with its content type and headers):
    every byte arrives, one chunk each, over HTTP and gRPC; 20,000 pass max_response_size together and are
    cut there, after the parts below it; the engine and the workers as before."""
    before = pids(engine)
    started = time.perf_counter()
    answer = streams.post(engine.http, "/predictions/probe", b"stream 10000 1 0", timeout=120)
    took = time.perf_counter() - started
    assert answer.complete and answer.chunks == [b"%d" % (n % 10) for n in range(10000)], len(answer.chunks)
    messages, _, error = predict(engine, b"stream 10000 1 0", stream=True, timeout=120)
    assert error is None and b"".join(m.prediction for m in messages) == b"0123456789" * 1000
    answer = streams.post(engine.http, "/predictions/probe", b"stream 20000 1 0", timeout=120)
    assert not answer.complete and len(answer.chunks) == MAX_RESPONSE // 51, len(answer.chunks)
    print(f"10,000 parts over HTTP: {took:.2f} s")
    assert pids(engine) == before


def test_parts_above_max_response_size(engine):
    """A first part above it: TorchServe's 500 whole (gRPC INTERNAL); a part above it midway, or parts
    passing it together: the parts before it, then the connection cut (gRPC: INTERNAL with the message);
    the worker kept, its next answer whole."""
    before = pids(engine)
    answer = streams.post(engine.http, "/predictions/probe", b"sizes 2000000,5")
    assert answer.status == 500 and answer.complete and b"Message size exceed limit" in answer.body, answer
    for body in (b"sizes 10,2000000,5", b"stream 5 300000 0"):
        answer = streams.post(engine.http, "/predictions/probe", body)
        assert answer.status == 200 and not answer.complete and len(answer.body) < MAX_RESPONSE, (body, answer.status)
        messages, _, error = predict(engine, body, stream=True)
        assert error[0] == grpc.StatusCode.INTERNAL and error[1].startswith("Message size exceed limit"), error
        assert sum(len(m.prediction) for m in messages) < MAX_RESPONSE
    messages, _, error = predict(engine, b"sizes 2000000,5", stream=True)
    assert messages == [] and error[0] == grpc.StatusCode.INTERNAL
    assert streams.post(engine.http, "/predictions/probe", b"stream 2 1 0").chunks == [b"0", b"1"]
    assert pids(engine) == before


@pytest.mark.matrix
def test_a_slow_reader_does_not_hold_the_worker(engine):
    """A client with a 4 KiB receive buffer reading 4 KiB every 5 ms of a 500 KB stream: the worker has
    sent every part long before the client has read them, and answers the next request meanwhile."""
    before = pids(engine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        body = b"stream 10 50000 0"
        slow = pool.submit(streams.post, engine.http, "/predictions/probe", body, pause=0.005, size=4096)
        time.sleep(0.5)
        started = time.perf_counter()
        answer = streams.post(engine.http, "/predictions/probe", b"pid")
        waited = time.perf_counter() - started
        assert not slow.done(), "the slow client read faster than expected"
        reading = slow.result()
    assert answer.status == 200 and waited < 2, (answer.status, waited)
    assert reading.complete and reading.body == b"".join(b"%d" % n * 50000 for n in range(10))
    print(f"the next request answered in {waited:.2f} s; the slow client took {reading.times[-1]:.1f} s")
    assert pids(engine) == before


def test_a_client_that_leaves_mid_stream(engine):
    """Over HTTP (closed after the first chunk) and gRPC (cancelled after the first message), each during
    a 1 s stream: the handler runs on (as on TorchServe) and its parts are dropped; the next request is
    answered by the same worker once the handler is done; the engine logs no error of its own."""
    before, logged = pids(engine), len(engine.output())
    answer = streams.post(engine.http, "/predictions/probe", b"stream 10 10 0.1", leave_after=1)
    assert answer.chunks == [b"0" * 10]
    messages, _, error = predict(engine, b"stream 10 10 0.1", stream=True, leave_after=1)
    assert len(messages) == 1 and error is None
    started = time.perf_counter()
    messages, _, error = predict(engine, b"pid")
    took = time.perf_counter() - started
    assert error is None and json.loads(messages[0].prediction)["pid"] == before["probe"][0]
    print(f"after two clients left: answered in {took:.2f} s")
    assert took < 2 * 1 + 2, took  # both handlers' 1 s at most (the first may still run), and a margin
    assert pids(engine) == before
    own = [line for line in engine.output()[logged:].splitlines() if "tsctl.worker" not in line]
    assert not any("Traceback" in line or "ERROR" in line or "Exception" in line for line in own), own


def test_a_worker_that_dies_mid_stream(engine):
    """Two parts, then the worker's process ends: the client has both parts, then a cut connection (gRPC:
    UNAVAILABLE naming the death); the worker is started again and answers."""
    before = pids(engine)
    answer = streams.post(engine.http, "/predictions/probe", b"die 2")
    assert answer.status == 200 and answer.chunks == [b"part0", b"part1"] and not answer.complete, answer
    wait_ready(engine)
    messages, _, error = predict(engine, b"die 2", stream=True)
    assert [m.prediction for m in messages] == [b"part0", b"part1"]
    assert error[0] == grpc.StatusCode.UNAVAILABLE and "Worker died" in error[1], error
    wait_ready(engine)
    assert streams.post(engine.http, "/predictions/probe", b"stream 2 1 0").chunks == [b"0", b"1"]
    after = pids(engine)
    assert after["engine"] == before["engine"] and after["streaming"] == before["streaming"]


def wait_ready(engine, timeout: float = 60):
    """Until the probe's worker is back, as long as the engine makes progress (helpers/waiting.py)."""
    waiting.until(
        lambda: engine.get("/v2/models/probe/ready")[0],
        lambda status: status == 200,
        "the probe's worker did not come back",
        engine.out,
        engine.alive,
        timeout,
    )


def test_the_authorization_seam_guards_every_call(tmp_path):
    """``engine.authorize(api, authorization)`` (what token authorization will set) is asked for every call
    of both APIs, unary and streaming, with the call's ``authorization`` metadata: no means TorchServe's
    PERMISSION_DENIED. A real Engine of the probe archive (no worker started: a request let through gets
    the stopping engine's UNAVAILABLE) and the real listeners, in this process."""
    import argparse
    import asyncio

    from serving import ts_config
    from serving.engine import ts_grpc as engine_ts_grpc
    from serving.engine.app import Engine as EngineObject

    store = tmp_path / "model-store"
    ts_streaming.archive("probe", ts_streaming.write_probe(tmp_path), store)
    specs, frontend = ts_config.models(None, store)
    engine = EngineObject(specs, frontend)
    engine.begin_stop()  # no worker runs: a request that gets through is answered 503 at once
    asked = []
    engine.authorize = lambda api, token: asked.append((api, token)) or token == "Bearer right"
    ports = {f"grpc_{api}_port": server.free_port() for api in ("inference", "management")}
    args = argparse.Namespace(**ports, grpc_inference_address=None, grpc_management_address=None)

    async def scenario():
        servers = await engine_ts_grpc.start(engine, args)
        try:
            return await asyncio.get_running_loop().run_in_executor(None, calls_with_tokens, ports)
        finally:
            for grpc_server in servers:
                await grpc_server.stop(0)

    try:
        results = asyncio.run(scenario())
    finally:
        engine.close()
    denied = (grpc.StatusCode.PERMISSION_DENIED, engine_ts_grpc.TOKEN_DENIED)
    assert results["none"] == [denied] * 3 and results["wrong"] == [denied] * 3, results
    assert results["right"][0] == "Unhealthy" and results["right"][1][0] == grpc.StatusCode.UNAVAILABLE
    assert json.loads(results["right"][2])["models"] == [{"modelName": "probe", "modelUrl": "probe.mar"}]
    assert {api for api, _ in asked} == {"inference", "management"} and ("inference", None) in asked


def calls_with_tokens(ports: dict) -> dict:
    """Ping, StreamPredictions and ListModels with no token, a wrong one and the right one."""
    results = {}
    for name, metadata in (
        ("none", ()),
        ("wrong", (("authorization", "Bearer wrong"),)),
        ("right", (("authorization", "Bearer right"),)),
    ):
        answers = []
        with (
            grpc.insecure_channel(f"127.0.0.1:{ports['grpc_inference_port']}") as inference,
            grpc.insecure_channel(f"127.0.0.1:{ports['grpc_management_port']}") as management,
        ):
            health = pb.TorchServeHealthResponse.FromString
            ping = inference.unary_unary(INFERENCE + "Ping", response_deserializer=health)
            stream = inference.unary_stream(
                INFERENCE + "StreamPredictions", response_deserializer=pb.PredictionResponse.FromString
            )
            listing = management.unary_unary(
                f"/{pb.MANAGEMENT_SERVICE}/ListModels", response_deserializer=pb.ManagementResponse.FromString
            )
            request = pb.PredictionsRequest(model_name="probe", input={"data": b"hi"}).SerializeToString()
            for make in (
                lambda: json.loads(ping(b"", metadata=metadata, timeout=10).health)["status"],
                lambda: list(stream(request, metadata=metadata, timeout=10)),
                lambda: listing(pb.ListModelsRequest(limit=5).SerializeToString(), metadata=metadata, timeout=10).msg,
            ):
                try:
                    answers.append(make())
                except grpc.RpcError as exc:
                    answers.append((exc.code(), exc.details()))
        results[name] = answers
    return results
