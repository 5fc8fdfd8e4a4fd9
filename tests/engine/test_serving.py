"""Against the real TorchServe: readiness from `tsctl config`, parity, batching, isolation, the CLI."""

import base64
import json
import time

import pytest
from click.testing import CliRunner

from archiver import mar, server
from archiver.cli import main
from helpers.models import package_resnet
from helpers.servers import RunningServer, batch_lines, post, post_concurrently, workers
from samples.image_model import torchscript_resnet18
from serving.local_model import LocalModel

BATCHING = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 4\nmaxBatchDelay: 200\nresponseTimeout: 120\n"


@pytest.fixture(scope="module")
def store(image_sample, tmp_path_factory):
    store = tmp_path_factory.mktemp("serving") / "model-store"
    package_resnet(image_sample, store, config_text=BATCHING)
    torchscript = torchscript_resnet18(image_sample / "resnet18_ts.pt")
    mar.package(
        mar.PackageOptions(
            model_name="resnet18_ts",
            handler="image_classifier",
            serialized_file=str(torchscript),
            extra_files=[str(image_sample / "index_to_name.json")],
            export_path=str(store),
        )
    )
    return store


@pytest.fixture(scope="module")
def srv(store):
    with RunningServer(store) as running:
        yield running


@pytest.fixture(scope="module")
def local(store):
    with LocalModel(store / "resnet18.mar") as model:
        yield model


def in_process(local, images):
    responses = local.predict(images)
    assert all(r.status == 200 for r in responses)
    return [r.json() for r in responses]


def assert_same_topk(served: dict, expected: dict):
    assert list(served) == list(expected)
    assert list(served.values()) == pytest.approx(list(expected.values()), rel=1e-4, abs=1e-6)


def wait_for_batches(srv, count, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = batch_lines(srv)
        if sum(line["size"] for line in lines) >= count:
            return lines
        time.sleep(0.2)
    return batch_lines(srv)


def test_every_model_in_the_generated_config_is_ready(srv):
    status, body = server.request(f"{srv.management}/models", timeout=10)
    assert status == 200
    assert sorted(m["modelName"] for m in body["models"]) == ["resnet18", "resnet18_ts"]
    for name in ("resnet18", "resnet18_ts"):
        status, described = server.request(f"{srv.management}/models/{name}", timeout=10)
        assert [w["status"] for w in described[0]["workers"]] == ["READY"]
    assert described[0]["batchSize"] == 1
    status, described = server.request(f"{srv.management}/models/resnet18", timeout=10)
    assert (described[0]["batchSize"], described[0]["maxBatchDelay"]) == (4, 200)


def test_served_topk_equals_the_in_process_harness(srv, local, jpegs):
    expected = in_process(local, jpegs[:2])
    for image, answer in zip(jpegs[:2], expected):
        status, body = post(srv, "resnet18", image, "image/jpeg")
        assert status == 200, body
        assert_same_topk(body, answer)
        assert len(body) == 5 and all(label.startswith("class_") for label in body)
        status, body = post(srv, "resnet18_ts", image, "image/jpeg")  # same weights, TorchScript
        assert status == 200, body
        assert_same_topk(body, answer)


def test_kserve_shaped_bodies_posted_to_predictions(srv, local, jpegs):
    expected = in_process(local, jpegs[2:4])
    b64 = [base64.b64encode(j).decode() for j in jpegs[2:4]]
    status, body = post(
        srv, "resnet18", json.dumps({"instances": [{"data": b} for b in b64]}).encode(), "application/json"
    )
    assert status == 200, body
    for served, answer in zip(body["predictions"], expected):
        assert_same_topk(served, answer)
    v2 = {"id": "42", "inputs": [{"name": "image", "shape": [2], "datatype": "BYTES", "data": b64}]}
    status, body = post(srv, "resnet18", json.dumps(v2).encode(), "application/json")
    assert status == 200, body
    assert body["id"] == "42" and body["model_name"] == "resnet18"
    for served, answer in zip(body["outputs"][0]["data"], expected):
        assert_same_topk(json.loads(served), answer)


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(srv, local, jpegs):
    expected = in_process(local, jpegs)
    before = sum(line["size"] for line in batch_lines(srv))
    results = post_concurrently(srv, "resnet18", jpegs, "image/jpeg")
    for (status, body), answer in zip(results, expected):
        assert status == 200, body
        assert_same_topk(body, answer)
    sizes = [line["size"] for line in wait_for_batches(srv, before + 8)]
    new = []
    while sum(new) < 8:  # the batches that served these 8 requests, newest last
        new.insert(0, sizes.pop())
    assert sum(new) == 8
    assert max(new) > 1, f"no batching: batch sizes {new}"
    status, metrics = server.request(f"{srv.metrics}/metrics", timeout=10)
    assert status == 200
    handler_time = [line for line in metrics.splitlines() if line.startswith("HandlerTime{") and "resnet18" in line]
    assert handler_time, "TorchServe's HandlerTime metric (its BaseHandler's, per batch) is not recorded"


def test_a_corrupt_image_fails_alone_and_the_worker_survives(srv, local, jpegs):
    workers_before = workers(srv, "resnet18")
    expected = in_process(local, jpegs[:3])
    corrupt = jpegs[3][: len(jpegs[3]) // 4]
    for _ in range(3):  # until the corrupt image shares a batch with good ones
        results = post_concurrently(srv, "resnet18", [jpegs[0], corrupt, jpegs[1], jpegs[2]], "image/jpeg")
        status, body = results[1]
        assert status == 400
        assert body["code"] == 400 and "could not decode image" in body["message"]
        for (status, body), answer in zip(results[:1] + results[2:], expected):
            assert status == 200, body
            assert_same_topk(body, answer)
        time.sleep(0.5)
        if any(line["rejected"] == 1 and line["size"] > 1 for line in batch_lines(srv)):
            break
    else:
        pytest.fail("the corrupt image was never batched with valid ones")
    assert workers(srv, "resnet18") == workers_before


def test_tsctl_predict_prints_results_and_exit_code(srv, jpegs, tmp_path):
    good, bad = tmp_path / "good.jpg", tmp_path / "bad.jpg"
    good.write_bytes(jpegs[0])
    bad.write_bytes(b"\x00" * 10)
    runner = CliRunner()
    result = runner.invoke(main, ["predict", "resnet18", str(good), "--home", srv.home])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{good}: 200 {{")
    result = runner.invoke(main, ["predict", "resnet18", str(good), str(bad), "--home", srv.home])
    assert result.exit_code == 1
    assert f"{bad}: 400 " in result.output
