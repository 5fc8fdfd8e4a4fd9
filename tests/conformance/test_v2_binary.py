"""KServe v2's binary tensor extension on a real TorchServe, started as KServe's runtime starts it
(TS_SERVICE_ENVELOPE=kservev2, the exported tree), driven by tritonclient's and kserve's own HTTP
clients: BYTES and FP32 inputs sent as binary data or JSON, outputs asked for in binary or JSON, each
answer equal to the same archive's in-process answer; concurrent binary requests batched together,
a malformed one failing alone with a 4xx naming its problem, and the worker never restarting.

make matrix's (its own TorchServe: 95 s of make test's time); make test's smoke is tritonclient's binary image
request in test_kserve_serving.py, and the engine's binary extension is tested in tests/engine."""

import asyncio
import base64
import concurrent.futures
import http.client
import json
import shutil
import time
import urllib.parse

import numpy as np
import pytest
import tritonclient.http as triton
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from archiver import server
from helpers.models import export_tree, package_resnet, package_text
from helpers.servers import batch_lines, kserve_runtime, workers
from serving.local_model import LocalModel

HEADER = "Inference-Header-Content-Length"
TEXTS = [
    "The cat sits on the mat.",
    "A man is playing a guitar on stage in front of a large, cheering crowd.",
    "Ünïcödé text, emoji 🙂 and numbers 12345.",
    "short",
]
BATCHING = "batchSize: 4\nmaxBatchDelay: 300\n"
pytestmark = pytest.mark.matrix


@pytest.fixture(scope="module")
def exported(image_sample, text_samples, tmp_path_factory):
    root = tmp_path_factory.mktemp("v2binary")
    store = root / "model-store"
    package_resnet(image_sample, store, config_text=BATCHING)
    tensor = root / "tensor.yaml"
    tensor.write_text(BATCHING + "handler:\n  input_shape: [3, 224, 224]\n")
    package_resnet(image_sample, store, name="resnet18_t", handler="tensor", config_file=str(tensor), extra_files=[])
    package_text(text_samples, store, "minilm", "text_embedder", "minilm", BATCHING)
    return export_tree(root)


@pytest.fixture(scope="module")
def srv(exported):
    running = kserve_runtime(exported, "kservev2")
    yield running
    server.stop(running)
    shutil.rmtree(running.home, ignore_errors=True)


@pytest.fixture(scope="module")
def pixels():
    return np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)


@pytest.fixture(scope="module")
def expected(exported, jpegs, pixels):
    """The in-process answers: image top-k, embeddings, the tensor model's output rows."""
    store = exported / "model-store"
    with LocalModel(store / "resnet18.mar") as model:
        images = [r.json() for r in model.predict(jpegs[:3])]
    with LocalModel(store / "minilm.mar") as model:
        embeddings = [r.json() for r in model.predict(TEXTS)]
    with LocalModel(store / "resnet18_t.mar") as model:
        tensor = {"name": "x", "shape": list(pixels.shape), "datatype": "FP32", "data": pixels.flatten().tolist()}
        [response] = model.predict([{"inputs": [tensor]}])
        output = response.json()["outputs"][0]
        rows = np.array(output["data"], dtype=np.float32).reshape(output["shape"])
    return {"images": images, "embeddings": embeddings, "tensor": rows}


# ---- helpers ---------------------------------------------------------------------------------------
def triton_client(srv, concurrency=1):
    url = srv.inference.split("://", 1)[1]
    return triton.InferenceServerClient(url, concurrency=concurrency, connection_timeout=60, network_timeout=120)


def requested(name, mode):
    """tritonclient's outputs argument: none named (it then asks for binary), or one, binary or JSON."""
    return None if mode == "default" else [triton.InferRequestedOutput(name, binary_data=mode == "binary")]


def bytes_input(values, binary):
    data = np.array(values, dtype=np.object_)
    infer_input = triton.InferInput("input-0", list(data.shape), "BYTES")
    infer_input.set_data_from_numpy(data, binary_data=binary)
    return infer_input


def check_output_form(result, name, mode):
    """The output came back the way it was asked for: binary (binary_data_size, no data) or JSON."""
    output = result.get_output(name)
    if mode == "json":
        assert "data" in output and "binary_data_size" not in (output.get("parameters") or {}), output
    else:
        assert "data" not in output and output["parameters"]["binary_data_size"] > 0, output


def assert_top_k(served: dict, expected: dict):
    assert list(served) == list(expected)
    assert list(served.values()) == pytest.approx(list(expected.values()), rel=1e-4, abs=1e-6)


def assert_embeddings(served, expected):
    served, expected = np.asarray(served, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert served.shape == expected.shape
    for a, b in zip(served, expected):
        assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) >= 0.9999


def post_raw(srv, path, body: bytes, headers: dict, timeout=60):
    """One POST as bytes in, (status, headers, bytes) out: binary answers are not text."""
    parts = urllib.parse.urlsplit(srv.inference)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def binary_request(datatype, shape, raw: bytes, size=None, outputs=None):
    """A v2 request with one input as binary data (its binary_data_size ``size``, default the truth):
    (body, headers with the JSON header's length)."""
    size = len(raw) if size is None else size
    header = {
        "id": "b-1",
        "inputs": [{"name": "input-0", "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": size}}],
        "parameters": {"binary_data_output": True},
    }
    if outputs is not None:
        header["outputs"] = outputs
    head = json.dumps(header).encode()
    return head + raw, {HEADER: str(len(head)), "Content-Type": "application/octet-stream"}


def texts_raw(texts):
    return serialize_byte_tensor(np.array([t.encode() for t in texts], dtype=np.object_)).item()


def read_binary_answer(headers, body):
    length = headers.get(HEADER)
    return triton.InferResult.from_response_body(body, header_length=None if length is None else int(length))


# ---- tritonclient ------------------------------------------------------------------------------------
MODES = [(binary, mode) for binary in (True, False) for mode in ("default", "binary", "json")]


@pytest.mark.parametrize("binary, mode", MODES)
def test_tritonclient_image_bytes(srv, jpegs, expected, binary, mode):
    # JSON can only carry text: JPEG bytes go as binary data, or as base64 strings in JSON
    values = jpegs[:3] if binary else [base64.b64encode(j).decode() for j in jpegs[:3]]
    with triton_client(srv) as client:
        result = client.infer("resnet18", [bytes_input(values, binary)], outputs=requested("output-0", mode))
    check_output_form(result, "output-0", mode)
    served = result.as_numpy("output-0")
    assert served.shape == (3,)
    for answer, reference in zip(served, expected["images"]):
        assert_top_k(json.loads(answer), reference)


@pytest.mark.parametrize("binary, mode", MODES)
def test_tritonclient_text_embedder(srv, expected, binary, mode):
    with triton_client(srv) as client:
        result = client.infer(
            "minilm", [bytes_input([t.encode() for t in TEXTS], binary)], outputs=requested("embedding", mode)
        )
    check_output_form(result, "embedding", mode)
    served = result.as_numpy("embedding")
    assert served.dtype == np.float32 and served.shape == (len(TEXTS), 384)
    assert_embeddings(served, expected["embeddings"])


@pytest.mark.parametrize("binary, mode", MODES)
def test_tritonclient_fp32_tensor(srv, pixels, expected, binary, mode):
    infer_input = triton.InferInput("input-0", list(pixels.shape), "FP32")
    infer_input.set_data_from_numpy(pixels, binary_data=binary)
    with triton_client(srv) as client:
        result = client.infer("resnet18_t", [infer_input], outputs=requested("output-0", mode))
    check_output_form(result, "output-0", mode)
    served = result.as_numpy("output-0")
    assert served.shape == expected["tensor"].shape
    np.testing.assert_allclose(served, expected["tensor"], rtol=1e-4, atol=1e-5)


def test_tritonclient_error_names_the_problem(srv):
    """An output the model does not have: 400 naming it (tritonclient shows status and body)."""
    with triton_client(srv) as client, pytest.raises(InferenceServerException) as caught:
        client.infer("minilm", [bytes_input([b"hello"], True)], outputs=[triton.InferRequestedOutput("logits")])
    assert caught.value.status() == "400"
    assert "'logits'; this model's only output is 'embedding'" in str(caught.value)


# ---- kserve's own REST client ------------------------------------------------------------------------
def kserve_infer(srv, protocol, data, model):
    async def call():
        client = InferenceRESTClient(RESTConfig(protocol=protocol, timeout=120))
        try:
            return await client.infer(srv.inference, data, model_name=model)
        finally:
            await client.close()

    return asyncio.run(call())


def test_kserve_client_v1(srv, expected):
    body = kserve_infer(srv, "v1", {"instances": TEXTS}, "minilm")
    assert_embeddings(body["predictions"], expected["embeddings"])


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("output", [None, True, False])
def test_kserve_client_v2(srv, jpegs, expected, binary, output):
    texts = InferInput("input-0", [len(TEXTS)], "BYTES")
    texts.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_), binary_data=binary)
    outputs = None if output is None else [RequestedOutput("embedding", {"binary_data": output})]
    request = InferRequest("minilm", [texts], request_id="k-1", request_outputs=outputs)
    response = kserve_infer(srv, "v2", request, "minilm")
    assert response.id == "k-1"
    assert_embeddings(response.outputs[0].as_numpy(), expected["embeddings"])

    images = InferInput("input-0", [2], "BYTES")
    values = jpegs[:2] if binary else [base64.b64encode(j) for j in jpegs[:2]]
    images.set_data_from_numpy(np.array(values, dtype=np.object_), binary_data=binary)
    parameters = {"binary_data_output": True} if output else None
    response = kserve_infer(srv, "v2", InferRequest("resnet18", [images], parameters=parameters), "resnet18")
    served = response.outputs[0].data
    for answer, reference in zip(served, expected["images"]):
        assert_top_k(json.loads(answer), reference)


# ---- batches -------------------------------------------------------------------------------------------
def test_concurrent_binary_requests_batch_and_a_lying_one_fails_alone(srv, expected):
    """Eight tritonclient requests at once, one per text (and one whose binary_data_size lies):
    batched together, each answered with its own embedding, the liar with its own 400."""
    before, pids = len(batch_lines(srv)), workers(srv, "minilm")
    liar = bytes_input([b"a lie"], True)
    liar._parameters["binary_data_size"] += 3
    inputs = [bytes_input([TEXTS[i % len(TEXTS)].encode()], True) for i in range(7)]
    inputs.insert(3, liar)
    with triton_client(srv, concurrency=len(inputs)) as client:
        pending = [client.async_infer("minilm", [i]) for i in inputs]
        results = []
        for request in pending:
            try:
                results.append(request.get_result(timeout=120))
            except InferenceServerException as error:
                results.append(error)
    error = results.pop(3)
    assert isinstance(error, InferenceServerException) and error.status() == "400", error
    assert "'binary_data_size' says 12 bytes, but only 9 bytes of binary data are left" in str(error)
    for index, result in enumerate(results):
        assert_embeddings(result.as_numpy("embedding"), [expected["embeddings"][index % len(TEXTS)]])
    time.sleep(0.5)
    batches = batch_lines(srv)[before:]
    assert max(line["size"] for line in batches) > 1
    assert any(line["rejected"] == 1 and line["size"] > 1 for line in batches), batches  # the liar had neighbours
    assert workers(srv, "minilm") == pids


BAD = {
    # name: (body, headers) as a client that gets the extension wrong would send them
    "header longer than the body": lambda: (
        binary_request("BYTES", [1], texts_raw(["x"]))[0],
        {HEADER: "100000", "Content-Type": "application/octet-stream"},
    ),
    "header length not a number": lambda: (binary_request("BYTES", [1], texts_raw(["x"]))[0], {HEADER: "12abc"}),
    "header length cuts the JSON": lambda: (binary_request("BYTES", [1], texts_raw(["x"]))[0], {HEADER: "20"}),
    "size past the end": lambda: binary_request("BYTES", [1], texts_raw(["x"]), size=50),
    "bytes no input claims": lambda: binary_request("BYTES", [1], texts_raw(["x"]) + b"zz", size=5),
    "element length past the end": lambda: binary_request("BYTES", [1], b"\xff\x00\x00\x00abc"),
    "truncated length prefix": lambda: binary_request("BYTES", [2], texts_raw(["x"]) + b"\x01\x00"),
    "shape larger than the elements": lambda: binary_request("BYTES", [3], texts_raw(["x", "y"])),
    "unknown datatype": lambda: binary_request("BF16", [1, 2], b"\x00\x00\x00\x00"),
    "too many elements": lambda: binary_request("BYTES", [10_000], b""),
    "unknown output": lambda: binary_request("BYTES", [1], texts_raw(["x"]), outputs=[{"name": "logits"}]),
}
MESSAGES = {
    "header longer than the body": "header says the JSON header is 100,000 bytes, but the body holds only",
    "header length not a number": "header must be the JSON header's length in bytes, got '12abc'",
    "header length cuts the JSON": "is not valid JSON",
    "size past the end": "'binary_data_size' says 50 bytes, but only 5 bytes of binary data are left",
    "bytes no input claims": "7 bytes of binary data follow the JSON header, but the inputs' 'binary_data_size' add",
    "element length past the end": "BYTES element 0 of 1: its length prefix says 255 bytes, past the end of the",
    "truncated length prefix": "BYTES element 1 of 2: the binary data ends before its 4-byte length (2 bytes left)",
    "shape larger than the elements": "BYTES element 2 of 3: the binary data ends before its 4-byte length (0",
    "unknown datatype": "datatype 'BF16' cannot be read as binary data",
    "too many elements": "the request holds 10,000 inputs, above the limit of 16 (handler.max_items)",
    "unknown output": "this model's only output is 'embedding'",
}


def test_malformed_binary_requests_fail_alone_in_their_batch(srv, expected):
    """Every way of getting the sizes wrong, each in one batch with good binary neighbours: each gets
    its own 4xx naming its problem, the neighbours their embeddings, the worker lives on."""
    pids = workers(srv, "minilm")
    good = binary_request("BYTES", [2], texts_raw(TEXTS[:2]))
    sends = [good, *[make() for make in BAD.values()], good]
    with concurrent.futures.ThreadPoolExecutor(len(sends)) as pool:
        futures = [pool.submit(post_raw, srv, "/v2/models/minilm/infer", body, hdrs) for body, hdrs in sends]
        results = [f.result(timeout=180) for f in futures]
    for status, headers, body in (results[0], results[-1]):
        assert status == 200, body
        answer = read_binary_answer(headers, body)
        assert answer.get_response()["id"] == "b-1"
        assert_embeddings(answer.as_numpy("embedding"), expected["embeddings"][:2])
    for name, (status, headers, body) in zip(BAD, results[1:-1]):
        error = json.loads(body)
        assert status == (413 if name == "too many elements" else 400), (name, error)
        assert headers.get(HEADER) is None and headers.get("Content-Type") == "application/json", name
        assert MESSAGES[name] in error["message"], (name, error)
    assert workers(srv, "minilm") == pids


def test_numeric_data_that_is_not_whole_values_fails_alone(srv, pixels, expected):
    whole = pixels.tobytes()
    good = binary_request("FP32", list(pixels.shape), whole)
    ragged = binary_request("FP32", list(pixels.shape), whole[:-2])
    results = [post_raw(srv, "/v2/models/resnet18_t/infer", *send, timeout=120) for send in (good, ragged)]
    (status, headers, body), (bad_status, _, bad_body) = results
    assert status == 200, body
    np.testing.assert_allclose(read_binary_answer(headers, body).as_numpy("output-0"), expected["tensor"], rtol=1e-4)
    assert bad_status == 400
    assert (
        "datatype FP32 needs 1,204,224 bytes (301,056 values of 4), but its 'binary_data_size' is 1,204,222"
        in (json.loads(bad_body)["message"])
    )


def test_binary_requests_work_on_the_predictions_path_and_in_any_header_case(srv, expected):
    body, headers = binary_request("BYTES", [1], texts_raw(TEXTS[:1]))
    lower = {key.lower(): value for key, value in headers.items()}
    for path, hdrs in [("/predictions/minilm", headers), ("/v2/models/minilm/infer", lower)]:
        status, answer_headers, answer = post_raw(srv, path, body, hdrs)
        assert status == 200, answer
        assert answer_headers.get("Content-Type") == "application/octet-stream"
        assert_embeddings(read_binary_answer(answer_headers, answer).as_numpy("embedding"), expected["embeddings"][:1])


def test_json_request_asking_for_binary_output_gets_it(srv, expected):
    """No binary input, but binary_data_output: the answer comes in the extension all the same."""
    request = {
        "inputs": [{"name": "input-0", "shape": [2], "datatype": "BYTES", "data": TEXTS[:2]}],
        "parameters": {"binary_data_output": True},
    }
    status, headers, body = post_raw(
        srv, "/v2/models/minilm/infer", json.dumps(request).encode(), {"Content-Type": "application/json"}
    )
    assert status == 200, body
    assert int(headers[HEADER]) < len(body)
    assert_embeddings(read_binary_answer(headers, body).as_numpy("embedding"), expected["embeddings"][:2])
