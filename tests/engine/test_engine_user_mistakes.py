"""A new user's slips on the engine (issue #47), each answered in one line naming the thing and the fix, or as
TorchServe 0.12 answers it with the cause added where the engine knows it:

1. A handler that fails a whole batch (TorchServe's own image_classifier given a JSON body): TorchServe's 503
   ``InternalServerException`` "Prediction failed", with the handler's error after it (the toolkit's handlers
   already refuse a wrong body per request with a 400 naming what they take: tests/toolkit).
2. TorchServe's gRPC Predictions with its input under ``features``: TorchServe's UNAVAILABLE (GRPCJob.sendError
   maps the worker's 503 so), the details naming the handler's error and the input's keys.
3. A port another process holds: one line naming the address, the config key and the fix, before any worker.
4. ``number_of_gpu=1`` on a machine without a GPU: one warning line at start naming the key.
5. A call to the wrong listener: TorchServe's status, the body saying which API the port serves and where
   the other one is.

One engine for the module (TorchServe's built-in image_classifier on resnet18, token authorization on,
management on a listener of its own): about 25 s on this shared 2-core machine; the port test about 2 s.
"""

import json
import os
import socket
import subprocess
import time

import grpc
import pytest

from archiver import server
from helpers.engine import Engine, engine_command, free_ports
from helpers.models import package_resnet
from helpers.paths import ROOT
from samples.image_model import sample_jpeg
from serving import gpus
from serving.engine import ts_protos as pb

ONE = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 1\nmaxBatchDelay: 10\nresponseTimeout: 60\n"


def write_config(path, management: int, extra: str = "") -> str:
    entry = {
        "1.0": {
            "defaultVersion": True,
            "marName": "builtin.mar",
            "minWorkers": 1,
            "maxWorkers": 1,
            "batchSize": 1,
            "maxBatchDelay": 10,
            "responseTimeout": 60,
        }
    }
    snapshot = {"name": "startup.cfg", "modelCount": 1, "models": {"builtin": entry}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"inference_address=http://127.0.0.1:8085\nmanagement_address=http://127.0.0.1:{management}\n"
        f"{extra}model_snapshot={json.dumps(snapshot)}\n"
    )
    return path


@pytest.fixture(scope="module")
def root(image_sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("slips")
    package_resnet(
        image_sample, root / "model-store", name="builtin", config_text=ONE, handler="ts.torch_handler.image_classifier"
    )
    return root


@pytest.fixture(scope="module")
def engine(root):
    [management] = free_ports(1)
    config = write_config(root / "config" / "config.properties", management, "number_of_gpu=1\n")
    running = Engine(root, config=config, env={"CUDA_VISIBLE_DEVICES": ""}).wait_ready()
    running.management = f"http://127.0.0.1:{management}"
    yield running
    assert running.stop() == 0


def predict(engine, body: bytes, kind: str):
    headers = {"Content-Type": kind, **engine.headers()}
    return server.request(engine.url + "/predictions/builtin", body, "POST", headers, 60)


def worker_pid(engine) -> int:
    status, body = server.request(engine.management + "/models/builtin", None, "GET", engine.headers("management"), 30)
    assert status == 200, body
    return body[0]["workers"][0]["pid"]


def test_a_batch_the_handler_fails_names_the_handlers_error(engine):
    """Before: 503 {"message": "Prediction failed"} and nothing more, the cause only in the engine's log."""
    pid = worker_pid(engine)
    status, body = predict(engine, b'{"data": "hello"}', "application/json")
    assert status == 503 and body["type"] == "InternalServerException", body
    assert body["message"].startswith("Prediction failed: ") and "Error" in body["message"], body
    assert predict(engine, sample_jpeg(1, (320, 240)), "image/jpeg")[0] == 200  # the next request is served
    assert worker_pid(engine) == pid


def test_grpc_input_under_another_key_is_answered_as_torchserve_with_the_cause(engine):
    """Before: UNAVAILABLE 'Prediction failed\\norg.pytorch.serve.http.InternalServerException' alone."""
    request = pb.PredictionsRequest(model_name="builtin", input={"features": sample_jpeg(1, (64, 64))})
    with grpc.insecure_channel(f"127.0.0.1:{engine.ts_grpc}") as channel:
        method = channel.unary_unary(
            "/" + pb.INFERENCE_SERVICE + "/Predictions", response_deserializer=pb.PredictionResponse.FromString
        )
        token = engine.headers().get("Authorization")
        with pytest.raises(grpc.RpcError) as failed:
            method(request.SerializeToString(), timeout=60, metadata=[("authorization", token)] if token else None)
    details = failed.value.details()
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, details  # TorchServe's code for the worker's 503
    reason = "\norg.pytorch.serve.http.InternalServerException"
    assert details.startswith("Prediction failed: ") and details.endswith(reason)
    assert "'features'" in details and "'data'" in details, details


def test_number_of_gpu_without_a_gpu_is_one_warning(engine):
    """Before: nothing in the engine's log (tsctl serve alone said so)."""
    if gpus.count_gpus({}) > 0:
        pytest.skip("this machine has a GPU")
    lines = [line for line in engine.output().splitlines() if "number_of_gpu=1" in line]
    assert len(lines) == 1 and "WARNING" in lines[0] and "no GPU" in lines[0], lines


def test_a_call_to_the_wrong_listener_says_which_listener_it_is(engine):
    """Before: TorchServe's token refusal or 404 alone, as if the key or the path were wrong."""
    inference, management = engine.headers("inference"), engine.headers("management")
    kind = {"Content-Type": "text/plain"}
    cases = [
        (engine.management + "/predictions/builtin", "POST", inference, 400, "InvalidKeyException", engine.url),
        (engine.management + "/predictions/builtin", "POST", management, 404, "ResourceNotFoundException", engine.url),
        (engine.url + "/models", "GET", {}, 400, "InvalidKeyException", engine.management),
        (engine.url + "/models", "GET", inference, 404, "ResourceNotFoundException", engine.management),
    ]
    assert inference and management, "token authorization is on (TorchServe 0.12's default)"
    for url, method, headers, status, kind_name, other in cases:
        got, body = server.request(url, b"x" if method == "POST" else None, method, {**kind, **headers}, 30)
        assert (got, body["type"]) == (status, kind_name), (url, got, body)
        api = "management" if url.startswith(engine.management) else "inference"
        assert f"this is the {api} API" in body["message"] and other in body["message"], (url, body)
    assert server.request(engine.url + "/ping", None, "GET", inference, 30)[0] == 200  # the right ones still answer


def test_a_port_in_use_is_one_line_before_any_worker_starts(root, tmp_path):
    """Before: uvicorn's bind error, four worker tracebacks and an asyncio traceback, exit 1 after 14 s."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        config = write_config(tmp_path / "config.properties", free_ports(1)[0], "disable_token_authorization=true\n")
        config.write_text(config.read_text().replace("127.0.0.1:8085", f"127.0.0.1:{port}"))
        command = engine_command(root / "model-store", "--ts_config", str(config), "--enable_grpc", "false")
        started = time.monotonic()
        done = subprocess.run(
            command,
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT), TEMP=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=120,
            start_new_session=True,
        )
        took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tsctl engine: "), done.stderr[-3000:]
    assert f"127.0.0.1:{port}" in lines[0] and "inference_address" in lines[0] and "free port" in lines[0], lines
    assert "worker" not in done.stderr.lower(), took


def test_a_failed_batch_of_several_requests_names_the_error_not_its_message():
    """A handler's message may quote the input it failed on: in a batch of several clients' requests, each
    client gets the error's name alone (the message stays in the engine's log); a batch of one, the message."""
    from types import SimpleNamespace

    from serving.worker.worker_process import FAILED, Output, WorkerProcess

    output = Output()
    for line in [
        "Invoking custom service failed.",
        "Traceback (most recent call last):",
        "ValueError: could not convert string to float: 'another client's secret'",
    ]:
        output.add(line)
    worker = SimpleNamespace(output=output)
    several = WorkerProcess.with_cause(worker, FAILED, 0, 3)
    assert several.startswith(FAILED + ": ValueError (in a batch of 3") and "secret" not in several, several
    assert WorkerProcess.with_cause(worker, FAILED, 0, 1).endswith("float: 'another client's secret'")
    assert WorkerProcess.with_cause(worker, "Out of resources", 0, 3) == "Out of resources"
