"""TorchServe started exactly as KServe's runtime starts it, on the tree `tsctl export kserve` wrote.

KServe runs `torchserve --start --model-store=/mnt/models/model-store --ts-config=/mnt/models/config/config.properties`
with TS_SERVICE_ENVELOPE=kserve (v1) or kservev2 (v2). Here the store path is the exported tree's, the
addresses are moved to free 127.0.0.1 ports with TorchServe's TS_* variables, and the per-model pip
install is off (this environment has the packages); everything else is the runtime's.
"""

import base64
import json
import shutil
import time

import numpy as np
import pytest
import tritonclient.http as triton

from archiver import server
from helpers.models import export_tree, package_resnet, package_text
from helpers.servers import Transformer, batch_lines, kserve_runtime, post_json_concurrently
from samples.image_model import package_builtin, torchscript_resnet18
from serving.local_model import LocalModel

TEXTS = ["a short one", "a considerably longer sentence that needs more tokens than the first", "mid length text"]


@pytest.fixture(scope="module")
def exported(image_sample, text_samples, tmp_path_factory):
    root = tmp_path_factory.mktemp("kserve")
    store = root / "model-store"
    batching = "batchSize: 4\nmaxBatchDelay: 200\n"
    package_resnet(image_sample, store, config_text=batching)
    tensor = root / "tensor.yaml"
    tensor.write_text(batching + "handler:\n  input_shape: [3, 224, 224]\n")
    package_resnet(image_sample, store, name="resnet18_t", handler="tensor", config_file=str(tensor), extra_files=[])
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier", batching)
    # TorchServe's own image_classifier handler, packaged by torch-model-archiver, asking for batches of 4
    torchscript = torchscript_resnet18(root / "resnet18_ts.pt")
    (root / "builtin.yaml").write_text(batching)
    package_builtin(torchscript, store, "builtin", root / "builtin.yaml")
    return export_tree(root)


@pytest.fixture(scope="module", params=[pytest.param("kserve", marks=pytest.mark.matrix), "kservev2"])  # v1: matrix
def runtime(request, exported):
    srv = kserve_runtime(exported, request.param)
    yield request.param, srv
    server.stop(srv)
    shutil.rmtree(srv.home, ignore_errors=True)


@pytest.fixture(scope="module")
def expected(exported, jpegs):
    with LocalModel(exported / "model-store" / "resnet18.mar") as image:
        images = [r.json() for r in image.predict(jpegs[:3])]
    with LocalModel(exported / "model-store" / "sentiment.mar") as text:
        texts = [r.json() for r in text.predict(TEXTS)]
    return images, texts


def call(srv, path, body, timeout=60):
    return server.request(
        srv.inference + path, json.dumps(body).encode(), "POST", {"Content-Type": "application/json"}, timeout
    )


def v1(items):
    return {"instances": items}


def v2(items):
    return {"id": "req-1", "inputs": [{"name": "input-0", "shape": [len(items)], "datatype": "BYTES", "data": items}]}


def assert_close(served: dict, expected: dict):
    assert list(served) == list(expected)
    assert list(served.values()) == pytest.approx(list(expected.values()), rel=1e-4, abs=1e-6)


def test_runtime_was_started_with_kserve_arguments(runtime, exported):
    envelope, srv = runtime
    assert (
        f"Config file: {exported / 'config' / 'config.properties'}" in (srv.logs.parent / "torchserve.out").read_text()
    )
    assert f"Model Store: {exported / 'model-store'}" in (srv.logs.parent / "torchserve.out").read_text()
    # the self-check each toolkit worker logs at initialize: the envelope steps aside
    worker_log = (srv.logs / "model_log.log").read_text()
    assert f"TorchServe's {envelope} envelope hands rows straight to this handler" in worker_log
    status, body = server.request(f"{srv.management}/models", timeout=10)
    assert status == 200
    assert sorted(m["modelName"] for m in body["models"]) == ["builtin", "resnet18", "resnet18_t", "sentiment"]


def test_v1_and_v2_requests_with_several_instances(runtime, jpegs, expected):
    envelope, srv = runtime
    images, texts = expected
    b64 = [base64.b64encode(j).decode() for j in jpegs[:3]]

    status, body = call(srv, "/v1/models/resnet18:predict", v1([{"data": b} for b in b64]))
    assert status == 200, body
    for served, answer in zip(body["predictions"], images):
        assert_close(served, answer)
    status, body = call(srv, "/v2/models/resnet18/infer", v2(b64))
    assert status == 200, body
    assert body["id"] == "req-1" and body["model_name"] == "resnet18" and body["outputs"][0]["shape"] == [3]
    for served, answer in zip(body["outputs"][0]["data"], images):
        assert_close(json.loads(served), answer)

    status, body = call(srv, "/v1/models/sentiment:predict", v1(TEXTS))
    assert status == 200, body
    for served, answer in zip(body["predictions"], texts):
        assert_close(served, answer)
    status, body = call(srv, "/v2/models/sentiment/infer", v2(TEXTS))
    assert status == 200, body
    for served, answer in zip(body["outputs"][0]["data"], texts):
        assert_close(json.loads(served), answer)


def test_tritonclients_binary_data_answers_as_json_does(runtime, jpegs, expected):
    """make test's smoke of KServe v2's binary extension (every form, both clients: test_v2_binary.py, make
    matrix): tritonclient sends the JPEG bytes as binary data and reads the binary output it asks for."""
    envelope, srv = runtime
    if envelope != "kservev2":
        pytest.skip("the binary extension is KServe v2's")
    images, _ = expected
    data = np.array(jpegs[:3], dtype=np.object_)
    infer_input = triton.InferInput("input-0", list(data.shape), "BYTES")
    infer_input.set_data_from_numpy(data, binary_data=True)
    url = srv.inference.split("://", 1)[1]
    with triton.InferenceServerClient(url, connection_timeout=60, network_timeout=120) as client:
        result = client.infer("resnet18", [infer_input])
    assert "data" not in result.get_output("output-0"), result.get_response()  # the output came back binary
    served = result.as_numpy("output-0")
    assert served.shape == (3,)
    for answer, reference in zip(served, images):
        assert_close(json.loads(answer), reference)


def test_concurrent_requests_are_batched_under_the_envelope(runtime, jpegs, expected):
    envelope, srv = runtime
    images, _ = expected
    b64 = base64.b64encode(jpegs[0]).decode()
    before = len(batch_lines(srv))
    bodies = [json.dumps(v1([{"data": b64}])).encode()] * 8
    results = post_json_concurrently(srv, "/v1/models/resnet18:predict", bodies)
    assert [status for status, _ in results] == [200] * 8, results[0]
    for _, body in results:
        assert_close(body["predictions"][0], images[0])
    time.sleep(0.5)
    assert max(line["size"] for line in batch_lines(srv)[before:]) > 1


def test_export_made_a_stock_handler_safe_under_the_envelope(runtime, jpegs):
    """TorchServe's own handler inside the envelope answers a batch of several requests with 503
    (benchmarks/kserve_envelopes.py measures it); export set its batchSize to 1, so all succeed."""
    envelope, srv = runtime
    status, described = server.request(f"{srv.management}/models/builtin", timeout=10)
    assert described[0]["batchSize"] == 1
    b64 = base64.b64encode(jpegs[0]).decode()
    body = v2([b64]) if envelope == "kservev2" else v1([{"data": b64}])
    path = "/v2/models/builtin/infer" if envelope == "kservev2" else "/v1/models/builtin:predict"
    results = post_json_concurrently(srv, path, [json.dumps(body).encode()] * 4)
    assert [status for status, _ in results] == [200] * 4, results[0]


def test_a_bad_instance_fails_its_request_alone(runtime, jpegs):
    envelope, srv = runtime
    good = base64.b64encode(jpegs[0]).decode()
    bad = base64.b64encode(b"not an image").decode()
    bodies = [json.dumps(v1([{"data": good}])).encode(), json.dumps(v1([{"data": good}, {"data": bad}])).encode()]
    (ok_status, _), (bad_status, bad_body) = post_json_concurrently(srv, "/v1/models/resnet18:predict", bodies)
    assert ok_status == 200
    assert bad_status == 400 and bad_body["message"].startswith("input 1: could not decode image")


@pytest.fixture(scope="module")
def transformer_for(runtime):
    """Start the custom transformer in front of this runtime's resnet18_t predictor; stop it after."""
    started = []

    def start(archive, protocol):
        transformer = Transformer(archive, "resnet18_t", runtime[1].inference.split("://", 1)[1], protocol)
        started.append(transformer)
        assert transformer.url, transformer.output[-2000:]
        return transformer.url

    yield start
    for transformer in started:
        transformer.stop()


def test_custom_transformer_answers_like_the_all_in_one_archive(runtime, transformer_for, exported, jpegs, expected):
    envelope, srv = runtime
    images, _ = expected
    protocol = "v2" if envelope == "kservev2" else "v1"
    url = transformer_for(exported / "model-store" / "resnet18.mar", protocol)
    b64 = [base64.b64encode(j).decode() for j in jpegs[:3]]
    if protocol == "v1":
        status, body = server.request(
            url + "/v1/models/resnet18_t:predict",
            json.dumps(v1([{"data": b} for b in b64])).encode(),
            "POST",
            {"Content-Type": "application/json"},
            120,
        )
        assert status == 200, body
        served = body["predictions"]
    else:
        status, body = server.request(
            url + "/v2/models/resnet18_t/infer",
            json.dumps(v2(b64)).encode(),
            "POST",
            {"Content-Type": "application/json"},
            120,
        )
        assert status == 200, body
        served = [json.loads(d) for d in body["outputs"][0]["data"]]
    for answer, reference in zip(served, images):
        assert_close(answer, reference)
