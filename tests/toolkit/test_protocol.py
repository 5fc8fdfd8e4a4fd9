"""handlers/protocol.py: v2 tensors stay arrays from the wire to the tensor handler's preprocess; what
it encodes it decodes (requests and answers, JSON and the binary extension, every datatype); one
table gives every exception its status. (Request shapes and limits: test_requests.py, test_hostile.py.)"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from archiver import mar
from handlers import protocol
from handlers.protocol import V2, ClientError, Limits, Request
from serving.local_model import InProcessHandler

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("data", "tensor")
ROUND_TRIPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Pool(torch.nn.Module):
    """[N, C, H, W] -> [N, C]: each channel's mean."""

    def forward(self, x):
        return x.mean(dim=(2, 3))


@pytest.fixture(scope="module")
def tensor_model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("protocol")
    torch.jit.script(Pool()).save(str(tmp / "pool.pt"))
    (tmp / "config.yaml").write_text("batchSize: 4\nhandler:\n  input_shape: [3, 4, 4]\n")
    archive = mar.package(
        mar.PackageOptions(
            model_name="pool",
            handler="tensor",
            serialized_file=str(tmp / "pool.pt"),
            config_file=str(tmp / "config.yaml"),
            export_path=str(tmp / "store"),
            force=True,
        )
    )
    with InProcessHandler(archive, batch_size=8) as model:  # its preprocess is looked at: this process
        yield model


def as_the_worker_decodes(body: bytes, headers: dict) -> dict:
    """A request as TorchServe's worker hands it to the handler (its default, decode_input_request):
    a JSON body parsed, any other a bytearray of the body."""
    return {"body": json.loads(body) if headers.get("Content-Type") == protocol.JSON_TYPE else bytearray(body)}


def spy_on_preprocess(model) -> list:
    """What the handler's preprocess is given, call by call."""
    handler, seen = model.handler, []
    original = handler.preprocess

    def preprocess(inputs):
        seen.append(list(inputs))
        return original(inputs)

    handler.preprocess = preprocess
    return seen


def test_a_binary_fp32_tensor_reaches_preprocess_as_arrays_viewing_the_request(tensor_model):
    pixels = np.random.default_rng(0).standard_normal((2, 3, 4, 4), dtype=np.float32)
    body, headers = protocol.encode_request(pixels, V2, binary=True)
    seen = spy_on_preprocess(tensor_model)
    try:
        [response] = tensor_model.predict_rows([as_the_worker_decodes(body, headers)], [headers])
    finally:
        del tensor_model.handler.preprocess
    assert response.status == 200, response.body
    [inputs] = seen
    assert len(inputs) == 2
    for row, expected in zip(inputs, pixels):
        assert type(row) is np.ndarray and row.dtype == np.float32 and row.shape == (3, 4, 4)
        assert not row.flags.owndata  # a view of the request's bytes: never a list, never copied
        np.testing.assert_array_equal(row, expected)
    # asked for in binary (encode_request does): the output's raw FP32 bytes, read back as arrays
    assert response.headers[protocol.HEADER] and response.content_type == protocol.OCTET_STREAM
    answers = protocol.decode_answers(response.body, response.headers)
    np.testing.assert_allclose(np.stack(answers), pixels.mean(axis=(2, 3)), rtol=1e-6)


def test_json_and_v1_tensors_reach_preprocess_as_arrays_too(tensor_model):
    pixels = np.arange(2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4)
    requests = [protocol.encode_request(pixels, V2), protocol.encode_request(pixels, protocol.V1)]
    seen = spy_on_preprocess(tensor_model)
    try:
        rows = [as_the_worker_decodes(body, headers) for body, headers in requests]
        responses = tensor_model.predict_rows(rows, [headers for _, headers in requests])
    finally:
        del tensor_model.handler.preprocess
    assert [r.status for r in responses] == [200, 200]
    assert all(type(row) is np.ndarray and row.dtype == np.float32 for inputs in seen for row in inputs)
    v2, v1 = (protocol.decode_answers(r.body, r.headers) for r in responses)
    assert json.loads(responses[1].body) == {"predictions": np.stack(v2).tolist()}  # one batch: the same values
    np.testing.assert_allclose(np.asarray(v1), pixels.mean(axis=(2, 3)), rtol=1e-6)


def test_numeric_json_values_the_datatype_cannot_hold_are_refused():
    def v2(datatype, data, shape=None):
        tensor = {"name": "x", "shape": shape or [len(data)], "datatype": datatype, "data": data}
        return protocol.parse_request({"body": {"inputs": [tensor]}}, KEYS, (datatype,))

    assert v2("INT8", [1, -128, 127]).items[2].dtype == np.int8
    assert [bool(b) for b in v2("BOOL", [True, 0, 1]).items] == [True, False, True]
    assert v2("FP16", [[1.5, 2], [3, 4]], [2, 2]).items[1].tolist() == [3.0, 4.0]
    for datatype, data, shape, words in [
        ("INT8", [300], [1], "INT8 cannot hold"),
        ("INT32", [1.5], [1], "INT32 cannot hold"),
        ("UINT8", [-1], [1], "UINT8 cannot hold"),
        ("BOOL", [2], [1], "BOOL cannot hold"),
        ("FP32", ["1.5"], [1], "must hold numbers"),
        ("FP32", [None], [1], "must hold numbers"),
        ("FP32", [[1, 2], [3]], [3], "not a list of numbers nested as its shape"),
        ("FP32", [1, 2], [3], r"shape \[3\] holds 3 values but 'data' has 2"),
    ]:
        with pytest.raises(ClientError, match=words) as caught:
            v2(datatype, data, shape)
        assert caught.value.status == 400


class OutOfMemoryError(RuntimeError):
    """torch.cuda.OutOfMemoryError, by name."""


@pytest.mark.parametrize(
    "exc, stage, status, kind",
    [
        (ClientError("mine", 413), protocol.INFERENCE, 413, "ClientError"),
        (RecursionError(), protocol.READ, 413, "ClientError"),
        (MemoryError(), protocol.READ, 413, "ClientError"),
        (ValueError("x"), protocol.READ, 400, "ClientError"),
        (ValueError("x"), protocol.INFERENCE, 500, "InferenceError"),
        (MemoryError(), protocol.INFERENCE, 507, "InferenceError"),
        (OutOfMemoryError("CUDA"), protocol.INFERENCE, 507, "InferenceError"),
        (ValueError("x"), protocol.BATCH, 503, "InternalServerException"),
        (MemoryError(), protocol.BATCH, 507, "InternalServerException"),
        (SystemExit(1), protocol.WORKER, 500, "InternalServerException"),
    ],
)
def test_one_table_gives_every_exception_its_status(exc, stage, status, kind):
    error = protocol.error_for(exc, stage, "it failed")
    assert (error.status, error.body()["type"]) == (status, kind)
    body, headers = protocol.encode_error(error)
    assert json.loads(body)["code"] == status and headers == {"Content-Type": "application/json"}


def test_the_module_loads_no_numpy_until_a_tensor_is_read():
    """tsctl's CLI imports handlers.requests (content_type) and must stay light."""
    code = "import sys, handlers.requests, handlers.protocol; sys.exit('numpy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# ---- round trips ---------------------------------------------------------------------------------------
def tensors(datatype):
    shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5)
    return st.tuples(st.just(datatype), hnp.arrays(np.dtype(protocol.NUMERIC[datatype]), shapes))


every_tensor = st.sampled_from(sorted(protocol.NUMERIC)).flatmap(tensors)


@ROUND_TRIPS
@given(tensor=every_tensor, binary=st.booleans())
def test_a_request_decodes_to_the_rows_it_was_encoded_from(tensor, binary):
    datatype, array = tensor
    body, headers = protocol.encode_request(array, V2, binary=binary)
    assert protocol.header_length(headers) == (len(body) - array.nbytes if binary else None)
    limits = Limits(max_items=array.shape[0], max_body_bytes=len(body), max_json_values=2 * array.size + 16)
    request = protocol.decode_request(body, headers, KEYS, (datatype,), limits)
    assert request.form is V2 and request.v2_binary_output == binary and len(request.items) == array.shape[0]
    for row, expected in zip(request.items, array):
        assert type(row) is np.ndarray and row.dtype == array.dtype and row.shape == array.shape[1:]
        assert not binary or not row.flags.owndata  # binary: a view of the body
        np.testing.assert_array_equal(row, expected)


@ROUND_TRIPS
@given(tensor=every_tensor, binary=st.booleans())
def test_an_answer_decodes_to_the_rows_it_was_encoded_from(tensor, binary):
    datatype, array = tensor
    request = Request(list(array), V2, v2_id="r1", v2_binary_output=binary)
    output = {"name": "out", "shape": list(array.shape), "datatype": datatype, "data": array}
    body, headers = protocol.encode_answers(request, list(array), "m", output, binary=binary)
    assert (headers["Content-Type"] == protocol.OCTET_STREAM) == binary
    if binary:  # the header, then exactly the array's bytes
        assert body[protocol.header_length(headers) :] == array.tobytes()
    answers = protocol.decode_answers(body, headers)
    assert len(answers) == array.shape[0]
    for row, expected in zip(answers, array):
        assert row.dtype == array.dtype
        np.testing.assert_array_equal(row, expected)


@ROUND_TRIPS
@given(items=st.lists(st.text(max_size=20) | st.binary(max_size=20), min_size=1, max_size=8))
def test_bytes_tensors_round_trip_in_either_form(items):
    texts = [i if isinstance(i, str) else i.decode("latin-1") for i in items]  # JSON carries text
    body, headers = protocol.encode_request(texts, V2)
    assert protocol.decode_request(body, headers, KEYS).items == texts
    body, headers = protocol.encode_request(items, V2, binary=True)  # binary: bytes, text as UTF-8
    want = [i.encode("utf-8", errors="surrogatepass") if isinstance(i, str) else i for i in items]
    assert protocol.decode_request(body, headers, KEYS).items == want


def test_answers_read_back_whatever_the_server_sent():
    assert protocol.decode_answers(b'{"predictions": [1, {"a": 2}]}') == [1, {"a": 2}]
    v2 = {"outputs": [{"name": "o", "shape": [2], "datatype": "BYTES", "data": ['{"x": 1}', "plain text"]}]}
    assert protocol.decode_answers(v2) == [{"x": 1}, "plain text"]  # JSON already parsed (tsctl verify)
    for body, headers in [
        (b"not json", None),
        (b'{"outputs": []}', None),
        (b'{"outputs": [{"datatype": "FP32", "shape": [2], "data": ["a", "b"]}]}', None),
        (b'{"outputs": [{"datatype": "FP32", "shape": [1]}]}xx', {protocol.HEADER: "9999"}),
        (b"{}", {protocol.HEADER: "-1"}),
    ]:
        with pytest.raises(ValueError, match="not a"):
            protocol.decode_answers(body, headers)


@pytest.mark.parametrize(
    "datatype, data",
    [
        ("UINT64", [0, 2**63 + 1]),
        ("UINT64", [0, 2**64 - 1024]),
        ("INT64", [1, -(2**63)]),
        ("UINT64", [[2**63 + 1], [3]]),
    ],
)
def test_big_whole_numbers_beside_small_ones_are_read_exactly(datatype, data):
    """numpy reads [0, 2**63 + 1] as floats: 2**63 + 1 became 2**63 (and 2**64 - 1024 a 400). Found by
    the round trip above (make test, 2026-11-24)."""
    body = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [len(data)] + ([1] if isinstance(data[0], list) else []),
                    "datatype": datatype,
                    "data": data,
                }
            ]
        }
    )
    request = protocol.decode_request(body.encode(), {"Content-Type": "application/json"}, KEYS, (datatype,))
    flat = [v for row in data for v in (row if isinstance(row, list) else [row])]
    assert [int(v) for row in request.items for v in np.atleast_1d(row)] == flat


@pytest.mark.parametrize("data", [[-1, 2**63 + 1], [1, 2**64]])
def test_whole_numbers_out_of_range_are_a_400(data):
    body = json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "UINT64", "data": data}]})
    with pytest.raises(protocol.ClientError, match="out of its range"):
        protocol.decode_request(body.encode(), {"Content-Type": "application/json"}, KEYS, ("UINT64",))


def test_the_envelope_line_does_not_claim_the_frontend_applied_it(monkeypatch):
    """The worker inherits TS_SERVICE_ENVELOPE whether or not TorchServe (or tsctl's engine) applied it: both
    read it only with enable_envvars_config=true, so the worker log line says so rather than that it was."""
    import handlers.base  # noqa: F401  (installs the step-aside, as a worker importing a toolkit handler does)
    from handlers import envelopes

    monkeypatch.delenv("TS_SERVICE_ENVELOPE", raising=False)
    assert envelopes.report() == "no KServe envelope asked for (TS_SERVICE_ENVELOPE unset)"
    monkeypatch.setenv("TS_SERVICE_ENVELOPE", "kserve")
    assert envelopes.in_place()
    assert envelopes.report() == (
        "TS_SERVICE_ENVELOPE=kserve, applied where config.properties says enable_envvars_config=true: "
        "TorchServe's kserve envelope hands rows straight to this handler"
    )
