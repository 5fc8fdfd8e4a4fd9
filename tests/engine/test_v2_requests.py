"""serving/runtimes/v2_requests.py: how MLServer's runtime turns an Open Inference Protocol request into the
TorchServe requests a handler that is not the toolkit's reads, and its answers into one v2 output.
No MLServer here (tests/engine/test_mlserver.py serves it): the requests go to TorchServe's own worker
(LocalModel), so what the handler receives is the worker's decoding, not a copy of it.

- each file as ``tsctl predict --content-type TYPE`` sends it to MLServer (archiver/engines/mlserver.py),
  turned into TorchServe requests, reaches a probe handler exactly as the raw body with that
  Content-Type does (the decoded JSON, a str, the bytes), and so does a gRPC element of bytes;
- requests it cannot map are 400s naming why; answers come back as JSON elements of ``output-0`` (base64
  and marked so when not UTF-8); a failed element fails the request with its status and message.
"""

import base64
import json

import pytest

from archiver import engines
from handlers.errors import ClientError
from samples import ts_examples, ts_probes
from serving.local_model import LocalModel, RequestInput
from serving.runtimes import v2_requests
from serving.worker.ts_wire import Response

MLSERVER = engines.ENGINES["mlserver"]


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    example = ts_probes.build_body_probe(tmp_path_factory.mktemp("probe"))
    archive = ts_examples.package(example, "torch-model-archiver", tmp_path_factory.mktemp("store"))
    with LocalModel(archive) as model:
        yield example, model


def sent(body: bytes, kind: str) -> RequestInput:
    return RequestInput(body, {"Content-Type": kind} if kind else {})


def answer_of(model: LocalModel, request: RequestInput):
    [response] = model.predict([request])
    assert response.status == 200, response.body
    return response.json()


def test_each_file_reaches_the_handler_as_torchserves_worker_hands_it(probe):
    example, model = probe
    seen = set()
    for body, kind in example.inputs:
        want = answer_of(model, sent(body, kind))
        request, _ = MLSERVER.request_body(body, kind, as_request=False)  # tsctl predict --content-type KIND
        [mapped] = v2_requests.requests_of(json.loads(request)["inputs"], {})
        assert answer_of(model, mapped) == want, (kind, body[:40])
        seen.add(want["type"])
    assert seen == {"dict", "list", "str", "bytearray"}, seen  # every row of the worker's table was exercised
    # gRPC: an element of bytes and no content_type is the body as bytes (application/octet-stream;
    # TorchServe's worker reads every body into a bytearray)
    grpc = {"name": "input-0", "shape": [1], "datatype": "BYTES", "data": [b"\xff raw"]}
    [mapped] = v2_requests.requests_of([grpc], {})
    assert answer_of(model, mapped) == {
        "keys": ["body"],
        "type": "bytearray",
        "value": base64.b64encode(b"\xff raw").decode(),
    }
    # a JSON string with no content_type (a KServe v2 client's text, or its base64 image): a str, as today
    [mapped] = v2_requests.requests_of([{**grpc, "data": ["aGk="]}], {})
    assert answer_of(model, mapped)["type"] == "str"
    # MLServer's own codecs: "str" a str, "base64" the bytes (gRPC sends them as base64 bytes too)
    for declared, element, want in (
        ("str", "hi", "str"),
        ("base64", "aGk=", "bytearray"),
        ("base64", b"aGk=", "bytearray"),
    ):
        tensor = {**grpc, "data": [element], "parameters": {"content_type": declared}}
        [mapped] = v2_requests.requests_of([tensor], {})
        assert answer_of(model, mapped)["type"] == want, declared
    # several elements: one request each; a numeric tensor: one JSON body of its nested values
    many = v2_requests.requests_of([{**grpc, "shape": [3], "data": ["a", "b", "c"]}], {"X-Trace": "1"})
    assert [r.body for r in many] == [b"a", b"b", b"c"]
    assert all(r.headers == {"X-Trace": "1", "Content-Type": "text/plain"} for r in many)
    numbers = {"name": "input-0", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6.5]}
    [mapped] = v2_requests.requests_of([numbers], {})
    assert answer_of(model, mapped) == {"keys": ["body"], "type": "list", "value": [[1, 2, 3], [4, 5, 6.5]]}


@pytest.mark.parametrize(
    "inputs, words",
    [
        ([], "one input tensor, got 0"),
        ([{"name": "a", "shape": [1], "datatype": "BYTES", "data": ["x"]}] * 2, "one input tensor, got 2"),
        ([{"name": "a", "shape": [2], "datatype": "BYTES", "data": ["x"]}], "holds 2 elements, got 1"),
        ([{"name": "a", "shape": [1], "datatype": "BYTES", "data": [{"x": 1}]}], "must be a string, got dict"),
        (
            [{"name": "a", "shape": [1], "datatype": "BYTES", "data": ["x"], "parameters": {"content_type": "np"}}],
            "content_type 'np'",
        ),
        (
            [
                {
                    "name": "a",
                    "shape": [1],
                    "datatype": "BYTES",
                    "data": ["not base64!"],
                    "parameters": {"content_type": "image/png"},
                }
            ],
            "must be base64",
        ),
        (
            [{"name": "a", "shape": [1], "datatype": "BYTES", "data": ["x"], "parameters": {"content_type": "base64"}}],
            "must be base64",
        ),
    ],
)
def test_requests_it_cannot_map_are_400s(inputs, words):
    with pytest.raises(ClientError) as refused:
        v2_requests.requests_of(inputs, {})
    assert refused.value.status == 400 and words in refused.value.message, refused.value.message


def test_answers_are_one_output_of_json_elements():
    texts = [b'{\n  "label": "cat",\n  "score": 0.5\n}', b"versicolor", b"3", b"[1, 2.5]"]
    output = v2_requests.output_of([Response(200, body) for body in texts])
    assert output == {
        "name": "output-0",
        "shape": [4],
        "datatype": "BYTES",
        "data": ['{"label": "cat", "score": 0.5}', '"versicolor"', "3", "[1, 2.5]"],
    }
    assert [json.loads(e) for e in output["data"]] == [{"label": "cat", "score": 0.5}, "versicolor", 3, [1, 2.5]]
    binary = v2_requests.output_of([Response(200, b"\x89PNG\xff"), Response(200, b"text")])
    assert binary["parameters"] == {"content_type": "base64"}
    assert [base64.b64decode(e) for e in binary["data"]] == [b"\x89PNG\xff", b"text"]
    assert v2_requests.failure([Response(200, b"1")]) is None
    error = b'{"code": 400, "type": "PredictionException", "message": "reads CSV bytes"}'
    failed = v2_requests.failure([Response(200, b"1"), Response(400, error), Response(503, b"later")])
    assert (failed.status, failed.message) == (400, "reads CSV bytes")
