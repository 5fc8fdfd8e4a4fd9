"""The whole request path in-process, driven by generated inputs: whatever a request holds, ``handle()``
answers every request of the batch, the hostile one with 200 or its own 4xx JSON error, its good
neighbours with their right answers, and the process's memory stays bounded.

Inputs: the named corpus of samples/hostile.py, mutations of real files of every format PIL writes
(and the magic bytes of those it only reads) with the size in their headers patched to extremes,
and generated bodies (arbitrary bytes and JSON, deep nesting, huge lists, KServe v1/v2 shapes, v2 requests
in the binary tensor extension with every size in them right or wrong)."""

import base64
import json
import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.utils import serialize_byte_tensor

from handlers import protocol
from helpers.hostile import BATCH, Linear, assert_close, build, scripted
from helpers.models import package_text
from samples import hostile
from samples.image_model import sample_jpeg
from serving.local_model import LocalModel

# make fuzz runs many more: TSCTL_FUZZ_EXAMPLES=5000
EXAMPLES = int(os.environ.get("TSCTL_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GIB = 1 << 30


@pytest.fixture(scope="module")
def image_models(tmp_path_factory):
    """The image handler with its default formats, and with every format PIL reads."""
    tmp = tmp_path_factory.mktemp("hostile")
    weights = scripted(tmp / "linear.pt", Linear())
    default = build(tmp, "default", "image_classifier", weights, BATCH)
    every = build(tmp, "every", "image_classifier", weights, BATCH + "handler:\n  formats: null\n")
    with LocalModel(default) as a, LocalModel(every) as b:
        yield a, b


@pytest.fixture(scope="module")
def text_model(text_samples, tmp_path_factory):
    store = tmp_path_factory.mktemp("hostile-text") / "store"
    with LocalModel(package_text(text_samples, store, "sentiment", "text_classifier", "classifier", BATCH)) as m:
        yield m


@pytest.fixture(scope="module")
def tensor_model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile-tensor")
    weights = scripted(tmp / "linear.pt", torch.nn.Linear(4, 2))
    with LocalModel(build(tmp, "tensor", "tensor", weights, BATCH)) as m:
        yield m


GOOD_JPEG = sample_jpeg(3, (64, 48))
GOOD_TEXT = "a perfectly normal sentence"


def check_batch(model, hostile_body, good, accepts=None, headers=None):
    """[good, hostile, good] as one batch (the hostile request with its HTTP ``headers``): every
    response well-formed, the neighbours right."""
    [alone] = model.predict([good])
    rows = [{"body": good}, {"body": hostile_body}, {"body": good}]
    responses = model.predict_rows(rows, None if headers is None else [{}, headers, {}])
    assert len(responses) == 3
    for neighbour in (responses[0], responses[2]):
        assert neighbour.status == 200, neighbour.body
        assert_close(neighbour.json(), alone.json())
    attacked = responses[1]
    if attacked.content_type == protocol.OCTET_STREAM:  # a KServe v2 answer in the binary extension
        assert attacked.status == 200
        check_binary_answer(attacked)
        return attacked
    body = attacked.json()
    assert attacked.content_type == "application/json"
    if attacked.status != 200:
        assert 400 <= attacked.status < 500, (attacked.status, body)
        assert set(body) == {"code", "type", "message"} and body["code"] == attacked.status, body
        assert isinstance(body["message"], str) and body["message"], body
    if accepts is not None:
        assert accepts(attacked.status), (attacked.status, body)
    return attacked


def check_binary_answer(response):
    """A binary-extension answer: its JSON header, then exactly the bytes its outputs declare."""
    length = int(response.headers[protocol.HEADER])
    header = json.loads(response.body[:length])
    sizes = [output["parameters"]["binary_data_size"] for output in header["outputs"]]
    assert all("data" not in output for output in header["outputs"]), header
    assert length + sum(sizes) == len(response.body), header


class PeakMemory:
    """The process's peak RSS growth while the block runs (VmHWM, reset first through clear_refs)."""

    def __enter__(self):
        self.base = _rss_kib("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pytest.skip("cannot reset the peak RSS counter here")
        return self

    def __exit__(self, *exc):
        self.grown = (_rss_kib("VmHWM") - self.base) * 1024


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


# ---- the named corpus -------------------------------------------------------------------------
def as_delivered(case: hostile.Case):
    """The body as TorchServe hands it over under tsctl's config (decode_input_request=false: bytes)."""
    return case.body


def test_named_image_corpus_in_process(image_models):
    default, _ = image_models
    cases = hostile.image_corpus(GOOD_JPEG)
    assert len(cases) >= 40
    with PeakMemory() as peak:
        for case in cases:
            attacked = check_batch(default, as_delivered(case), GOOD_JPEG, case.accepts)
            if case.words and attacked.status != 200:
                assert case.words in attacked.json()["message"], (case.name, attacked.json())
            if attacked.status == 200:
                assert_close(attacked.json(), default.predict([case.body])[0].json())
    assert peak.grown < 1.5 * GIB, f"peak RSS grew {peak.grown / GIB:.2f} GiB"


def test_named_text_corpus_in_process(text_model):
    for case in hostile.text_corpus():
        attacked = check_batch(text_model, case.body, GOOD_TEXT.encode(), case.accepts)
        if case.words and attacked.status != 200:
            assert case.words in attacked.json()["message"], (case.name, attacked.json())


def test_json_parsed_by_torchserve_is_bounded_too(image_models):
    """With TorchServe's default decode_input_request=true the worker hands over parsed JSON: the
    same limits apply to it."""
    default, _ = image_models
    deep = json.loads(hostile.deep_json(900))
    wide = {"instances": [{"b64": "x"}] * 60_000}
    many = list(range(200_000))
    for body, words in ((deep, "max_json_depth"), (wide, "max_json_values"), (many, "max_json_values")):
        attacked = check_batch(default, body, GOOD_JPEG, lambda status: status == 413)
        assert words in attacked.json()["message"]


# ---- mutations of real files of every format ------------------------------------------------
SEEDS = hostile.seed_images()
FORMATS = sorted(SEEDS) + sorted(hostile.READ_ONLY_MAGIC)


def wrap(data: bytes, how: str):
    b64 = base64.b64encode(data).decode()
    return {
        "raw": data,
        "json": {"data": b64},
        "v1": {"instances": [{"b64": b64}, {"b64": base64.b64encode(GOOD_JPEG).decode()}]},
        "v2": {"inputs": [{"name": "i", "shape": [1], "datatype": "BYTES", "data": [b64]}]},
        "list": [b64, b64],
    }[how]


@FUZZ
@given(
    fmt=st.sampled_from(FORMATS),
    size=st.none() | st.sampled_from(hostile.extreme_sizes()),
    seed=st.integers(0, 2**32 - 1),
    rounds=st.integers(0, 4),
    how=st.sampled_from(["raw", "json", "v1", "v2", "list"]),
    every_format=st.booleans(),
)
def test_mutated_images_of_every_format(image_models, fmt, size, seed, rounds, how, every_format):
    data = SEEDS.get(fmt) or hostile.READ_ONLY_MAGIC[fmt] + random.Random(seed).randbytes(200)
    if size is not None:
        data = hostile.resized(fmt, data, *size)
    data = hostile.mutate(data, random.Random(seed), rounds)
    check_batch(image_models[every_format], wrap(data, how), GOOD_JPEG)


@settings(max_examples=40, deadline=None)
@given(fmt=st.sampled_from(sorted(SEEDS)), size=st.sampled_from(hostile.extreme_sizes()))
def test_extreme_declared_sizes_are_refused_before_decoding(image_models, fmt, size):
    with PeakMemory() as peak:
        check_batch(image_models[1], hostile.resized(fmt, SEEDS[fmt], *size), GOOD_JPEG)
    assert peak.grown < GIB, f"{fmt} {size}: peak RSS grew {peak.grown / GIB:.2f} GiB"


# ---- generated bodies --------------------------------------------------------------------------
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=30)
    | st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode()),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=40,
)
nesting = st.builds(
    lambda opener, depth, inner: (opener[0] * depth + inner + opener[1] * depth).encode(),
    st.sampled_from([("[", "]"), ('{"data":', "}"), ('{"instances":[', "]}"), ('{"text":', "}")]),
    st.integers(1, 200_000),
    st.sampled_from(["1", '"x"', "", "null"]),
)
v1_bodies = st.builds(lambda items: {"instances": items}, st.lists(json_values, max_size=40) | json_values)
v2_bodies = st.builds(
    lambda shape, datatype, data, extra: {
        "inputs": [{"name": "i", "shape": shape, "datatype": datatype, "data": data}] + extra
    },
    st.lists(st.integers(-2, 10**6) | st.floats() | st.text(max_size=3), max_size=4) | json_values,
    st.sampled_from(["BYTES", "FP32", "INT64", "UINT8", "FP16", "BOOL", "", 7]),
    st.lists(json_values, max_size=50) | json_values,
    st.lists(json_values.map(lambda v: {"name": "j", "data": v}), max_size=2),
)
big_lists = st.builds(lambda n, item: json.dumps([item] * n).encode(), st.integers(0, 300_000), json_values)
bodies = (
    st.binary(max_size=500)
    | json_values
    | json_values.map(lambda v: json.dumps(v).encode())
    | nesting
    | v1_bodies
    | v2_bodies
    | v2_bodies.map(lambda v: json.dumps(v).encode())
    | big_lists
    | st.text(max_size=200)
)


@FUZZ
@given(body=bodies)
def test_generated_bodies_image(image_models, body):
    check_batch(image_models[0], body, GOOD_JPEG)


@FUZZ
@given(body=bodies)
def test_generated_bodies_text(text_model, body):
    check_batch(text_model, body, GOOD_TEXT.encode())


@pytest.mark.matrix  # out of make test for its time (issue #32's tests took its room); make matrix runs it
@FUZZ
@given(
    body=bodies
    | st.builds(lambda rows, cols: {"instances": [[1.0] * cols] * rows}, st.integers(0, 40), st.integers(0, 8))
)
def test_generated_bodies_tensor(tensor_model, body):
    check_batch(tensor_model, body, {"instances": [[1.0, 2.0, 3.0, 4.0]]})


@FUZZ
@pytest.mark.matrix  # 36 s; make fuzz and make matrix run it, make test the per-format generated bodies
@given(
    rows=st.lists(
        st.dictionaries(st.sampled_from(["data", "body", "file", "extra"]), bodies, max_size=3), min_size=1, max_size=8
    )
)
def test_whole_batches_of_generated_rows(image_models, rows):
    """Rows as TorchServe builds them (form fields included): N rows in, N well-formed answers out."""
    responses = image_models[0].predict_rows(rows)
    assert len(responses) == len(rows)
    for response in responses:
        assert response.status == 200 or 400 <= response.status < 500, response.body
        response.json()


# ---- KServe v2 binary tensor extension ------------------------------------------------------------
DATATYPES = ["BYTES", "FP32", "FP16", "INT64", "UINT8", "BOOL", "BF16", "", 7]


@st.composite
def binary_requests(draw):
    """A v2 request in the binary extension, each size in it right or wrong: the JSON header's length
    (the HTTP header's value), binary_data_size, the shape, BYTES length prefixes, numeric byte counts.
    Returns (body, HTTP headers)."""
    datatype = draw(st.sampled_from(DATATYPES))
    if datatype == "BYTES":
        elements = draw(st.lists(st.binary(max_size=20) | st.text(max_size=20).map(str.encode), max_size=6))
        raw = b"".join(struct.pack("<I", len(e)) + e for e in elements)
        shape = [len(elements)]
    else:
        shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
        itemsize = np.dtype(protocol.NUMERIC.get(datatype, "u1")).itemsize
        raw = draw(st.binary(min_size=int(np.prod(shape)) * itemsize, max_size=int(np.prod(shape)) * itemsize))
    if draw(st.booleans()):  # something wrong in the data or the shape
        raw = raw[: draw(st.integers(0, len(raw)))] + draw(st.binary(max_size=6))
        shape = draw(st.sampled_from([shape, [s + 1 for s in shape], [10**12], [-1], []]) | json_values)
    size = len(raw) + draw(st.sampled_from([0, 0, 0, -1, 1, 1 << 40]))
    header = {
        "inputs": [
            {
                "name": "i",
                "shape": shape,
                "datatype": datatype,
                "parameters": {"binary_data_size": draw(st.sampled_from([size, size, -1, "5", None]))},
            },
        ],
        "parameters": {"binary_data_output": draw(st.booleans())},
    }
    head = json.dumps(header).encode()
    length = len(head) + draw(st.sampled_from([0, 0, 0, 0, -1, 1, -len(head), 1 << 30]))
    value = draw(st.sampled_from([str(length)] * 6 + ["", "-1", "0x10", "1e3"]))
    name = draw(st.sampled_from([protocol.HEADER, protocol.HEADER.lower(), protocol.HEADER.upper()]))
    return head + raw + draw(st.sampled_from([b"", b"", b"\x00", b"trailing"])), {name: value}


@FUZZ
@given(request=binary_requests())
def test_generated_binary_requests_image(image_models, request):
    check_batch(image_models[0], request[0], GOOD_JPEG, headers=request[1])


@FUZZ
@given(request=binary_requests())
def test_generated_binary_requests_text(text_model, request):
    check_batch(text_model, request[0], GOOD_TEXT.encode(), headers=request[1])


@FUZZ
@given(request=binary_requests())
def test_generated_binary_requests_tensor(tensor_model, request):
    check_batch(tensor_model, request[0], {"instances": [[1.0, 2.0, 3.0, 4.0]]}, headers=request[1])


def numeric_arrays(datatype):
    shapes = hnp.array_shapes(max_dims=3, max_side=5)
    return st.tuples(st.just(datatype), hnp.arrays(np.dtype(protocol.NUMERIC[datatype]), shapes))


@FUZZ
@given(array=st.sampled_from(sorted(protocol.NUMERIC)).flatmap(numeric_arrays))
def test_binary_numeric_tensors_read_as_numpy_wrote_them(array):
    """tritonclient sends ``array.tobytes()``: read back, the values are the array's; written, the bytes."""
    datatype, values = array
    decoded = protocol.decode_tensor(datatype, list(values.shape), memoryview(values.tobytes()))
    assert isinstance(decoded, np.ndarray) and decoded.dtype == values.dtype and decoded.shape == values.shape
    np.testing.assert_array_equal(decoded, values)
    written = protocol.encode_tensor(datatype, decoded)
    np.testing.assert_array_equal(np.frombuffer(written, dtype=values.dtype), values.flatten())


@FUZZ
@given(elements=st.lists(st.binary(max_size=40), min_size=1, max_size=16))
def test_binary_bytes_tensors_read_as_tritonclient_wrote_them(elements):
    raw = serialize_byte_tensor(np.array(elements, dtype=np.object_)).item()
    assert protocol.split_bytes(memoryview(raw), len(elements)) == elements
    assert protocol.encode_tensor("BYTES", elements) == raw
