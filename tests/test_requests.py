import base64
import json

import pytest

from handlers.requests import ClientError, encode_answer, parse_request, to_bytes, to_text

KEYS = ("data", "b64")


def test_raw_bytes_body_is_one_item():
    request = parse_request({"body": b"\xff\xd8\xffjpeg"}, KEYS)
    assert request.items == [b"\xff\xd8\xffjpeg"] and request.form == "single"


def test_multipart_field_with_another_name_is_the_item():
    assert parse_request({"file": b"abc"}, KEYS).items == [b"abc"]


def test_json_bytes_without_content_type_are_parsed():
    request = parse_request({"body": b'{"data": "aGVsbG8="}'}, KEYS)
    assert request.items == ["aGVsbG8="] and request.form == "single"


def test_kserve_v1_instances():
    body = {"instances": [{"data": "aGk="}, {"b64": "aGk="}]}
    request = parse_request({"body": body}, KEYS)
    assert request.form == "v1" and len(request.items) == 2
    assert [to_bytes(i) for i in request.items] == [b"hi", b"hi"]
    assert encode_answer(request, [1, 2], "m") == {"predictions": [1, 2]}


def test_kserve_v2_bytes_input():
    body = {"id": "r1", "inputs": [{"name": "in", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]}
    request = parse_request({"body": body}, KEYS)
    assert request.form == "v2" and request.items == ["a", "b"]
    answer = encode_answer(request, [{"x": 1}, {"y": 2}], "m")
    assert answer["id"] == "r1" and answer["model_name"] == "m"
    assert answer["outputs"][0]["shape"] == [2]
    assert [json.loads(d) for d in answer["outputs"][0]["data"]] == [{"x": 1}, {"y": 2}]


def test_json_list_answers_with_a_list():
    request = parse_request({"body": ["a", "b", "c"]}, KEYS)
    assert request.form == "list" and encode_answer(request, [1, 2, 3], "m") == [1, 2, 3]


@pytest.mark.parametrize(
    "body, words",
    [
        (None, "no body"),
        ({"instances": []}, "empty"),
        ({"instances": "x"}, "must be a list"),
        ({"image": "x"}, "no input field"),
        ({"inputs": [{"name": "a", "shape": [3], "datatype": "BYTES", "data": ["x"]}]}, "holds 3 values"),
        ({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1.0]}]}, "not supported"),
        ({"inputs": [{"name": "a", "data": ["x"]}]}, "missing shape, datatype"),
        ([], "empty"),
    ],
)
def test_malformed_requests_raise_client_error(body, words):
    with pytest.raises(ClientError) as caught:
        parse_request({"body": body}, KEYS)
    assert words in caught.value.message
    assert caught.value.status == 400


def test_base64_and_text_decoding():
    assert to_bytes(base64.b64encode(b"\x00\x01").decode()) == b"\x00\x01"
    assert to_bytes("data:image/png;base64," + base64.b64encode(b"png").decode()) == b"png"
    with pytest.raises(ClientError, match="not valid base64"):
        to_bytes("not base64!!")
    with pytest.raises(ClientError, match="must be bytes or a base64 string"):
        to_bytes(12)
    assert to_text(b"caf\xc3\xa9") == "café"
    with pytest.raises(ClientError, match="not valid UTF-8"):
        to_text(b"\xff\xfe")
    with pytest.raises(ClientError, match="input is empty"):
        to_text("   ")
