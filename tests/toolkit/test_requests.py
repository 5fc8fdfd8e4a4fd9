import ast
import base64
import enum
import json
import struct

import numpy as np
import pytest

from handlers import protocol
from handlers.protocol import ClientError, Limits, answer_body, parse_request, to_bytes, to_text
from helpers.paths import ROOT

KEYS = ("data", "b64")


def test_raw_bytes_body_is_one_item():
    request = parse_request({"body": b"\xff\xd8\xffjpeg"}, KEYS)
    assert request.items == [b"\xff\xd8\xffjpeg"] and request.form is protocol.SINGLE


def test_a_form_is_an_enum_member_compared_by_identity_everywhere():
    """The forms are one plain ``enum.Enum`` (``Form``, handlers/decoding.py; protocol re-exports it and its
    members), never strings; every comparison of a form in the repository's Python (``.form``, a member's
    name, on either side) is ``is``/``is not``: a string compared with a form cannot quietly be false."""
    from handlers import decoding

    assert issubclass(protocol.Form, enum.Enum) and protocol.Form is decoding.Form
    assert list(protocol.Form) == [protocol.SINGLE, protocol.LIST, protocol.V1, protocol.V2]
    assert [parse_request({"body": body}, KEYS).form for body in (b"x", [1], {"instances": [1]})] == [
        protocol.SINGLE,
        protocol.LIST,
        protocol.V1,
    ]
    assert protocol.encode_request(["a"], "v2") == protocol.encode_request(["a"], protocol.V2)  # as a CLI says it
    for other in (protocol.SINGLE, "single", "v3", None):
        with pytest.raises(ValueError, match="must be v1 or v2"):
            protocol.encode_request(["a"], other)
    names = {"form", *protocol.Form.__members__}
    wrong = []
    for path in sorted(
        p
        for top in ("handlers", "serving", "archiver", "samples", "benchmarks", "tests")
        for p in (ROOT / top).rglob("*.py")
    ):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            sides = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
            if any(getattr(side, "attr", getattr(side, "id", None)) in names for side in sides) and not all(
                isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not wrong, "forms compared by value, not identity:\n" + "\n".join(wrong)


def test_multipart_field_with_another_name_is_the_item():
    assert parse_request({"file": b"abc"}, KEYS).items == [b"abc"]


def test_json_bytes_without_content_type_are_parsed():
    request = parse_request({"body": b'{"data": "aGVsbG8="}'}, KEYS)
    assert request.items == ["aGVsbG8="] and request.form is protocol.SINGLE


def test_kserve_v1_instances():
    body = {"instances": [{"data": "aGk="}, {"b64": "aGk="}]}
    request = parse_request({"body": body}, KEYS)
    assert request.form is protocol.V1 and len(request.items) == 2
    assert [to_bytes(i) for i in request.items] == [b"hi", b"hi"]
    assert answer_body(request, [1, 2], "m") == {"predictions": [1, 2]}


def test_kserve_v2_bytes_input():
    body = {"id": "r1", "inputs": [{"name": "in", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]}
    request = parse_request({"body": body}, KEYS)
    assert request.form is protocol.V2 and request.items == ["a", "b"]
    answer = answer_body(request, [{"x": 1}, {"y": 2}], "m")
    assert answer["id"] == "r1" and answer["model_name"] == "m"
    assert answer["outputs"][0]["shape"] == [2]
    assert [json.loads(d) for d in answer["outputs"][0]["data"]] == [{"x": 1}, {"y": 2}]


def test_json_list_answers_with_a_list():
    request = parse_request({"body": ["a", "b", "c"]}, KEYS)
    assert request.form is protocol.LIST and answer_body(request, [1, 2, 3], "m") == [1, 2, 3]


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


# ---- KServe v2 binary tensor extension (handlers/protocol.py) ------------------------------------------
def binary_row(inputs, raws, **extra):
    """A row of the binary extension: the JSON header, then the raw data; and the header's length."""
    head = json.dumps({"inputs": inputs, **extra}).encode()
    return {"body": head + b"".join(raws)}, len(head)


def binary_parse(row, length, keys, datatypes=("BYTES",), limits=Limits()):
    """``row`` of a request whose Inference-Header-Content-Length is ``length``, read as a worker reads it."""
    return parse_request(row, keys, datatypes, limits, {protocol.HEADER: str(length)})


def texts_raw(texts):
    return b"".join(struct.pack("<I", len(t)) + t for t in texts)


def test_header_length_in_any_letter_case():
    assert protocol.header_length({"Inference-Header-Content-Length": "12"}) == 12
    assert protocol.header_length({"inference-header-content-length": " 7 ", "body": {"content-type": "x"}}) == 7
    assert protocol.header_length({"Content-Type": "application/json"}) is None
    assert protocol.header_length(None) is None
    for bad in ("-1", "12abc", "", "1e3", "١٢"):
        with pytest.raises(ClientError, match="header must be the JSON header's length in bytes"):
            protocol.header_length({"Inference-Header-Content-Length": bad})


def test_binary_bytes_input_gives_the_items_of_its_json_form():
    texts = [b"caf\xc3\xa9", b"", b"\xff\xd8\xff binary"]
    raw = texts_raw(texts)
    tensor = {"name": "in", "shape": [3], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}
    row, length = binary_row([tensor], [raw], id="r1")
    request = binary_parse(row, length, KEYS, ("BYTES",))
    assert request.form is protocol.V2 and request.items == texts and request.v2_id == "r1"


@pytest.mark.parametrize("datatype, dtype", [("FP32", "<f4"), ("FP16", "<f2"), ("INT64", "<i8"), ("UINT8", "u1")])
def test_binary_numeric_input_gives_the_items_of_its_json_form(datatype, dtype):
    values = np.arange(12).reshape(2, 3, 2).astype(dtype)
    raw = values.tobytes()
    tensor = {"name": "in", "shape": [2, 3, 2], "datatype": datatype}
    row, length = binary_row([{**tensor, "parameters": {"binary_data_size": len(raw)}}], [raw])
    binary = binary_parse(row, length, KEYS, (datatype,))
    as_json = parse_request({"body": {"inputs": [{**tensor, "data": values.tolist()}]}}, KEYS, (datatype,))
    flat = parse_request({"body": {"inputs": [{**tensor, "data": values.flatten().tolist()}]}}, KEYS, (datatype,))
    assert len(binary.items) == len(as_json.items) == len(flat.items) == 2
    for items in (binary.items, as_json.items, flat.items):  # rows as arrays of the declared type, never lists
        for row, expected in zip(items, values):
            assert isinstance(row, np.ndarray) and row.dtype == np.dtype(dtype) and row.shape == (3, 2)
            np.testing.assert_array_equal(row, expected)
    assert not binary.items[0].flags.owndata  # a view of the request's bytes, not a copy


def test_json_inputs_next_to_binary_ones_and_a_body_torchserve_parsed():
    tensor = {"name": "in", "shape": [1], "datatype": "BYTES", "data": ["plain"]}
    row, length = binary_row([tensor], [])
    assert binary_parse(row, length, KEYS).items == ["plain"]
    # decode_input_request=true and a JSON content type: TorchServe parsed the body, nothing followed it
    assert binary_parse({"body": {"inputs": [tensor]}}, 10, KEYS).items == ["plain"]
    claimed = {**tensor, "parameters": {"binary_data_size": 5}}
    del claimed["data"]
    with pytest.raises(ClientError, match="says 5 bytes, but only 0 bytes of binary data are left"):
        binary_parse({"body": {"inputs": [claimed]}}, 10, KEYS)


def bytes_tensor(shape, size):
    return {"name": "in", "shape": shape, "datatype": "BYTES", "parameters": {"binary_data_size": size}}


@pytest.mark.parametrize(
    "make, status, words",
    [
        (lambda: (binary_row([bytes_tensor([1], 5)], [texts_raw([b"x"])])[0], 10**6), 400, "the body holds only"),
        (lambda: (binary_row([bytes_tensor([1], 5)], [texts_raw([b"x"])])[0], 3), 400, "is not valid JSON"),
        (lambda: binary_row([bytes_tensor([1], 9)], [texts_raw([b"x"])]), 400, "says 9 bytes, but only 5"),
        (lambda: binary_row([bytes_tensor([1], 5)], [texts_raw([b"x"]), b"!"]), 400, "add up to 5"),
        (lambda: binary_row([bytes_tensor([1], 7)], [b"\x09\x00\x00\x00abc"]), 400, "prefix says 9 bytes, past"),
        (lambda: binary_row([bytes_tensor([2], 7)], [texts_raw([b"x"]), b"\x00\x00"]), 400, "ends before its 4-byte"),
        (lambda: binary_row([bytes_tensor([1], 6)], [texts_raw([b"x"]), b"!"]), 400, "follow its last BYTES element"),
        (lambda: binary_row([bytes_tensor([1], -1)], []), 400, "'binary_data_size' must be a byte count"),
        (lambda: binary_row([bytes_tensor([1], True)], []), 400, "'binary_data_size' must be a byte count"),
        (lambda: binary_row([{**bytes_tensor([1], 0), "data": ["x"]}], []), 400, "both 'data' and"),
        (lambda: binary_row([bytes_tensor([10**9], 0)], []), 413, "(handler.max_items)"),
        (lambda: binary_row([{**bytes_tensor([4], 14), "datatype": "FP32"}], [b"\x00" * 14]), 400, "needs 16 bytes"),
        (lambda: binary_row([{**bytes_tensor([5000, 5000], 0), "datatype": "FP32"}], []), 413, "max_json_values"),
        (lambda: binary_row([{**bytes_tensor([1], 2), "datatype": "BF16"}], [b"\x00\x00"]), 400, "'BF16' cannot"),
        (lambda: binary_row([{**bytes_tensor([1], 0), "datatype": "FP32"}], []), 400, "needs 4 bytes"),
        (lambda: binary_row([{"name": "in", "parameters": {"shared_memory_region": "r"}}], []), 400, "shared-memory"),
        (lambda: binary_row([], []), 400, "is not a KServe v2 request"),
        (lambda: binary_row([bytes_tensor([1], 0)] * 2, []), 400, "must hold exactly one tensor, got 2"),
        (lambda: ({"body": b'{"instances": [1]}'}, 18), 400, "is not a KServe v2 request"),
    ],
)
def test_binary_requests_whose_sizes_do_not_add_up(make, status, words):
    row, length = make()
    with pytest.raises(ClientError) as caught:
        binary_parse(row, length, KEYS, ("BYTES",))
    assert words in caught.value.message and caught.value.status == status, caught.value.message


def test_binary_requests_are_bounded_by_the_limits():
    raw = texts_raw([b"x" * 100])
    row, length = binary_row([bytes_tensor([1], len(raw))], [raw])
    with pytest.raises(ClientError, match=r"handler\.max_body_bytes"):
        binary_parse(row, length, KEYS, limits=Limits(max_body_bytes=100))
    deep = {"body": b'{"inputs": [{"x": ' + b"[" * 40 + b"]" * 40 + b"}]}"}
    with pytest.raises(ClientError, match=r"handler\.max_json_depth"):
        binary_parse(deep, len(deep["body"]), KEYS)


def test_binary_data_size_without_the_header_names_the_extension():
    with pytest.raises(ClientError, match="has no Inference-Header-Content-Length header"):
        parse_request({"body": {"inputs": [bytes_tensor([1], 5)]}}, KEYS)


def v2_request(**extra):
    return parse_request(
        {"body": {"inputs": [{"name": "i", "shape": [1], "datatype": "BYTES", "data": ["x"]}], **extra}}, KEYS
    )


def test_binary_outputs_when_asked_for():
    assert not protocol.wants_binary(v2_request(), "out")
    assert protocol.wants_binary(v2_request(parameters={"binary_data_output": True}), "out")
    assert protocol.wants_binary(v2_request(outputs=[{"name": "out", "parameters": {"binary_data": True}}]), "out")
    named = v2_request(
        outputs=[{"name": "out", "parameters": {"binary_data": False}}], parameters={"binary_data_output": True}
    )
    assert not protocol.wants_binary(named, "out")
    assert protocol.wants_binary(v2_request(outputs=[{"name": "out"}], parameters={"binary_data_output": True}), "out")
    assert not protocol.wants_binary(parse_request({"body": {"instances": ["x"]}}, KEYS), "out")
    with pytest.raises(ClientError, match="'outputs' names 'logits'; this model's only output is 'out'"):
        protocol.wants_binary(v2_request(outputs=[{"name": "logits"}]), "out")
    for extra, words in [
        ({"outputs": [{"name": "out", "parameters": {"classification": 3}}]}, "classification extension"),
        ({"outputs": [{"name": "out", "parameters": {"binary_data": "yes"}}]}, "'binary_data' must be true or false"),
        ({"outputs": [{"parameters": {}}]}, "each with a 'name'"),
        ({"parameters": {"binary_data_output": 1}}, "'binary_data_output' must be true or false"),
        ({"parameters": []}, "'parameters' must be an object"),
    ]:
        with pytest.raises(ClientError, match=words):
            v2_request(**extra)


def test_binary_response_reads_back_with_tritonclient():
    from tritonclient.http import InferResult

    body = {
        "model_name": "m",
        "id": "r1",
        "outputs": [
            {"name": "a", "shape": [2], "datatype": "BYTES", "data": ['{"x": 1}', "é"]},
            {"name": "b", "shape": [2, 2], "datatype": "FP32", "data": [0.5, -1.0, 3.25, 1e-7]},
        ],
    }
    data, length = protocol.encode_binary(body)
    header = json.loads(data[:length])
    assert header["id"] == "r1" and all("data" not in output for output in header["outputs"])
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [4 + 8 + 4 + 2, 16]
    result = InferResult.from_response_body(data, header_length=length)
    assert result.as_numpy("a").tolist() == [b'{"x": 1}', "é".encode()]
    assert result.as_numpy("b").tolist() == np.array([[0.5, -1.0], [3.25, 1e-7]], dtype=np.float32).tolist()
