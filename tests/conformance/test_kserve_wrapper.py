"""pytorch/serve's kserve_wrapper, the process KServe's clients talk to, in front of TorchServe on the
tree `tsctl export kserve` wrote.

In the torchserve-kfs image (pytorch/serve's kubernetes/kserve Dockerfile and dockerd-entrypoint.sh)
TorchServe starts with KServe's runtime arguments and TS_SERVICE_ENVELOPE=kserve|kservev2, then
`python kserve_wrapper/__main__.py` (kserve 0.13) serves KServe's v1/v2 REST on :8080 and forwards
each request to TorchServe's own /v1 or /v2 route (PROTOCOL_VERSION picks which). Here the wrapper
is run in place from /work/shared/kserve/wrapper with the Python of the runtime venv standing in for
the image (samples/runtime_env.py: kserve[storage] 0.13.0, as the image's requirements.txt), its
protos generated as the Dockerfile does (inference.proto imports google/rpc/status.proto, which the
Dockerfile's `-I third_party/google/rpc` provides; here googleapis-common-protos' copy);
samples/kserve_wrapper_launcher.py changes only its ports (free ones, on 127.0.0.1) and its config
file is the exported one with this test's TorchServe addresses and store path. One more variable:
MODEL_LOAD_DELAY=1 (default 30 s: the wrapper sleeps that long after each model's readiness check,
even a successful one; TorchServe is READY before the wrapper starts here).

The smoke path (part of `make test`): TorchServe 0.9.0 from the runtime venv behind the v2 wrapper:
answers equal to the in-process ones, concurrent requests batched by TorchServe, a malformed request
failing alone. `make matrix` adds the v1 wrapper, TorchServe 0.12.0 (this venv) behind both, kserve's own
client (0.21) and what the wrapper does with the binary tensor extension.

What the wrapper (kserve 0.13) does with errors, measured here: a 4xx from TorchServe reaches the
client as 500 {"error": "HTTPStatusError : <TorchServe's JSON body as a Python dict>, '400 Bad
Request' for url '<TorchServe's URL>'"}; a body that is not JSON is refused by kserve itself (v1 400,
v2 422) and never reaches TorchServe; a v2 binary-extension body gets 422 from kserve 0.13's request
model, before TorchServe.
"""

import asyncio
import base64
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import psutil
import pytest
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

from archiver import server
from helpers.kserve_wrapper import KFS, MODELS, WRAPPER, Stack, start_stack, stop_stack
from helpers.models import export_tree, local_answers, package_resnet, package_text
from helpers.servers import batch_lines, post_mixed_concurrently
from samples import kserve_wrapper_launcher as launcher
from samples import runtime_env

TEXTS = ["a short one", "a considerably longer sentence that needs more tokens than the first", "mid length text"]
BATCHING = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 4\nmaxBatchDelay: 200\nresponseTimeout: 120\n"
BAD_IMAGE = base64.b64encode(b"not an image").decode()

pytestmark = pytest.mark.skipif(
    not (WRAPPER / "kserve_wrapper" / "__main__.py").exists(),
    reason=f"pytorch/serve's kserve_wrapper is not at {WRAPPER} (set TSCTL_KSERVE_WRAPPER)",
)


# ---- the tree, the in-process answers ---------------------------------------------------------------
@pytest.fixture(scope="module")
def kfs_python() -> Path:
    return runtime_env.ensure(KFS)


@pytest.fixture(scope="module")
def exported(image_sample, text_samples, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wrapper")
    store = root / "model-store"
    package_resnet(image_sample, store, config_text=BATCHING)
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier", BATCHING)
    package_text(text_samples, store, "minilm", "text_embedder", "minilm", BATCHING)
    return export_tree(root, runtime=KFS)


@pytest.fixture(scope="module")
def protos(kfs_python, tmp_path_factory) -> Path:
    """inference_pb2*.py and management_pb2*.py, generated as the image's Dockerfile does."""
    return launcher.generate_protos(str(kfs_python), WRAPPER / "proto", tmp_path_factory.mktemp("protos"))


@pytest.fixture(scope="module")
def expected(exported, jpegs):
    return local_answers(exported / "model-store", {"resnet18": jpegs[:3], "sentiment": TEXTS, "minilm": TEXTS})


# ---- TorchServe + the wrapper -----------------------------------------------------------------------


# One stack (TorchServe and the wrapper) a cell: make test serves 0.9.0 behind the v2 wrapper; make matrix
# adds the v1 wrapper and TorchServe 0.12.0 (this venv's) behind both.
CELLS = [
    pytest.param(("0.9.0", "v1"), marks=pytest.mark.matrix, id="0.9.0-v1"),
    pytest.param(("0.9.0", "v2"), id="0.9.0-v2"),
    pytest.param(("0.12.0", "v1"), marks=pytest.mark.matrix, id="0.12.0-v1"),
    pytest.param(("0.12.0", "v2"), marks=pytest.mark.matrix, id="0.12.0-v2"),
]


@pytest.fixture(scope="module", params=CELLS)
def served(request, exported, protos, kfs_python):
    """(TorchServe's version, its stack): TorchServe of that version (0.9.0: the runtime venv's, as in
    torchserve-kfs:0.9.0; 0.12.0: this venv's) behind the wrapper (always the runtime venv's kserve 0.13)
    speaking the cell's protocol; stopped at the end, whatever happened."""
    version, protocol = request.param
    ts_python = str(kfs_python) if version == "0.9.0" else sys.executable
    started = start_stack(exported, protos, kfs_python, ts_python, protocol)
    try:
        yield version, started
    finally:
        stop_stack(started)


@pytest.fixture
def stack(served) -> Stack:
    return served[1]


# ---- requests -----------------------------------------------------------------------------------------
def body_for(protocol: str, items: list) -> dict:
    if protocol == "v1":
        return {"instances": items}
    return {"id": "req-1", "inputs": [{"name": "input-0", "shape": [len(items)], "datatype": "BYTES", "data": items}]}


def image_items(protocol: str, b64: list) -> list:
    return [{"data": b} for b in b64] if protocol == "v1" else b64


def path_for(protocol: str, model: str) -> str:
    return f"/v1/models/{model}:predict" if protocol == "v1" else f"/v2/models/{model}/infer"


def post(url: str, body, timeout=60):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return server.request(url, data, "POST", {"Content-Type": "application/json"}, timeout)


def answers(stack: Stack, model: str, body: dict) -> list:
    """The per-input answers of a 200 response from the wrapper, in the protocol's shape."""
    if stack.protocol == "v1":
        return body["predictions"]
    [output] = body["outputs"]
    if output["datatype"] == "BYTES":
        return [json.loads(answer) for answer in output["data"]]
    assert output["datatype"] == "FP32", output
    width = output["shape"][1]
    return [output["data"][i : i + width] for i in range(0, len(output["data"]), width)]


def assert_same(model: str, served: list, expected: list):
    assert len(served) == len(expected)
    for got, want in zip(served, expected):
        if model == "minilm":
            got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
            assert got.shape == want.shape
            assert got @ want >= 0.9999 * np.linalg.norm(got) * np.linalg.norm(want)
        else:
            assert list(got) == list(want)  # same labels, same order
            if model == "resnet18":  # torch 2.1 (the runtime) against this venv's torch
                assert list(got.values()) == pytest.approx(list(want.values()), rel=1e-3)
            else:
                assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-4)


def new_batches(srv, before: int, wait: float = 5) -> list:
    """The worker's batch lines after the first ``before``, once they are written."""
    deadline = time.monotonic() + wait
    while True:
        lines = batch_lines(srv)[before:]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def test_the_protos_are_generated_whatever_the_current_directory_holds(kfs_python, tmp_path, monkeypatch):
    """A google/rpc/ of a user's own (docs/engines.md's protoc command, run in the checkout, wrote one before)
    in the current directory and on PYTHONPATH does not hide the runtime's google/rpc/status.proto."""
    stray = tmp_path / "checkout"
    (stray / "google" / "rpc").mkdir(parents=True)
    (stray / "google" / "rpc" / "status_pb2.py").write_text("raise ImportError('a stray stub')\n")
    monkeypatch.chdir(stray)
    monkeypatch.setenv("PYTHONPATH", str(stray))
    out = launcher.generate_protos(str(kfs_python), WRAPPER / "proto", tmp_path / "protos")
    assert sorted(p.name for p in out.glob("*_pb2*.py")) == [
        "inference_pb2.py",
        "inference_pb2_grpc.py",
        "management_pb2.py",
        "management_pb2_grpc.py",
    ]


# ---- the smoke path -------------------------------------------------------------------------------------
def test_the_wrapper_runs_as_the_image_runs_it_on_loopback_ports(served, stack, exported):
    version, _ = served
    srv = stack.torchserve
    assert f"Torchserve version: {version}" in (Path(srv.home) / "torchserve.out").read_text()
    log = stack.wrapper.log_text(10**7)
    port = stack.url.rsplit(":", 1)[1]
    assert f"launcher: uvicorn 0.0.0.0:{launcher.WRAPPER_HTTP_PORT} -> 127.0.0.1:{port}" in log, stack.log()
    assert f"launcher: grpc [::]:{launcher.WRAPPER_GRPC_PORT} -> 127.0.0.1:{stack.wrapper.grpc_port}" in log
    assert (
        f"Wrapper : Model names dict_keys({MODELS}), inference address {srv.inference}, management address "
        f"{srv.management}, grpc_inference_address, 127.0.0.1:{stack.grpc_port}, model store "
        f"{exported / 'model-store'}"
    ) in log, stack.log()
    assert f"Protocol version is {stack.protocol}" in log
    for model in MODELS:
        assert f"The model {model} is ready" in log
    sockets = psutil.Process(stack.wrapper.pid).connections("inet")
    # gRPC's socket is IPv6 with the IPv4-mapped loopback address: still nothing beyond loopback
    listening = {(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port) for c in sockets if c.status == "LISTEN"}
    assert listening == {("127.0.0.1", int(port)), ("127.0.0.1", stack.wrapper.grpc_port)}, sockets
    status, body = server.request(stack.url + "/v1/models", timeout=60)
    assert status == 200 and sorted(body["models"]) == MODELS, body


def test_answers_through_the_wrapper_equal_the_in_process_ones(stack, jpegs, expected):
    b64 = [base64.b64encode(j).decode() for j in jpegs[:3]]
    inputs = {"resnet18": image_items(stack.protocol, b64), "sentiment": TEXTS, "minilm": TEXTS}
    for model, items in inputs.items():
        status, body = post(stack.url + path_for(stack.protocol, model), body_for(stack.protocol, items))
        assert status == 200, f"{model}: {body}{stack.log()}"
        if stack.protocol == "v2":
            assert body["model_name"] == model and body["id"] == "req-1", body
        assert_same(model, answers(stack, model, body), expected[model])


def test_concurrent_requests_are_batched_and_a_malformed_one_fails_alone(stack, jpegs, expected):
    """Eight requests at once through the wrapper, one with an undecodable image: TorchServe batches
    them (batchSize 4); the neighbours get their answers; the bad one's 400 from TorchServe reaches the
    client as the wrapper's 500, TorchServe's JSON message kept inside kserve's error string."""
    srv, protocol = stack.torchserve, stack.protocol
    path = path_for(protocol, "resnet18")
    good = body_for(protocol, image_items(protocol, [base64.b64encode(jpegs[0]).decode()]))
    bad = body_for(protocol, image_items(protocol, [BAD_IMAGE]))
    direct_status, direct_body = post(srv.inference + path, bad)  # what TorchServe itself answers
    assert direct_status == 400 and direct_body["message"].startswith("could not decode image"), direct_body

    before = len(batch_lines(srv))
    bodies = [(json.dumps(good).encode(), "application/json")] * 7
    bodies.insert(3, (json.dumps(bad).encode(), "application/json"))
    results = post_mixed_concurrently(SimpleNamespace(inference=stack.url), path, bodies)

    status, body = results.pop(3)
    assert status == 500, f"{body}{stack.log()}"
    wrapped = f"HTTPStatusError : {direct_body}, '400 Bad Request' for url '{srv.inference}{path}'"
    assert body == {"error": wrapped}, stack.log()
    assert [s for s, _ in results] == [200] * 7, f"{results}{stack.log()}"
    for _, neighbour in results:
        assert_same("resnet18", answers(stack, "resnet18", neighbour), expected["resnet18"][:1])
    batches = new_batches(srv, before)
    assert max(line["size"] for line in batches) > 1, batches
    assert any(line["size"] > 1 and line["rejected"] == 1 for line in batches), batches  # it had neighbours


# ---- beyond the smoke path: make matrix ----------------------------------------------------------------
@pytest.mark.matrix
def test_a_body_that_is_not_json_is_refused_by_kserve_before_torchserve(stack):
    before = len(batch_lines(stack.torchserve))
    status, body = post(stack.url + path_for(stack.protocol, "resnet18"), b"{not json")
    if stack.protocol == "v1":
        refused = {"error": "Unrecognized request format: unexpected character: line 1 column 2 (char 1)"}
        assert (status, body) == (400, refused)
    else:
        assert status == 422 and body["detail"][0]["type"] == "json_invalid", body
    assert len(batch_lines(stack.torchserve)) == before


@pytest.mark.matrix
def test_a_malformed_text_request_keeps_torchserves_message(stack):
    """A v1 instance / v2 element that is not text: TorchServe's 400 inside the wrapper's 500."""
    srv, path = stack.torchserve, path_for(stack.protocol, "sentiment")
    if stack.protocol == "v1":
        bad = {"instances": [{"text": 42}]}
    else:
        bad = {"inputs": [{"name": "input-0", "shape": [1], "datatype": "FP32", "data": [1.5]}]}
    direct_status, direct_body = post(srv.inference + path, bad)
    assert direct_status == 400, direct_body
    status, body = post(stack.url + path, bad)
    assert status == 500
    assert body == {"error": f"HTTPStatusError : {direct_body}, '400 Bad Request' for url '{srv.inference}{path}'"}


def kserve_client(stack: Stack, data, model: str, url=None):
    """kserve's InferenceRESTClient (this venv's, 0.21) against the wrapper, or ``url``."""

    async def call():
        client = InferenceRESTClient(RESTConfig(protocol=stack.protocol, timeout=60))
        try:
            return await client.infer(url or stack.url, data, model_name=model)
        finally:
            await client.close()

    return asyncio.run(call())


def bytes_input(values, binary: bool) -> InferInput:
    tensor = InferInput("input-0", [len(values)], "BYTES")
    tensor.set_data_from_numpy(np.array(values, dtype=np.object_), binary_data=binary)
    return tensor


@pytest.mark.matrix
def test_kserves_own_client_through_the_wrapper(stack, jpegs, expected):
    """kserve 0.21's InferenceRESTClient: v1 dicts, v2 InferRequests with JSON data."""
    b64 = [base64.b64encode(j).decode() for j in jpegs[:3]]
    if stack.protocol == "v1":
        for model, items in {"resnet18": image_items("v1", b64), "sentiment": TEXTS, "minilm": TEXTS}.items():
            body = kserve_client(stack, {"instances": items}, model)
            assert_same(model, body["predictions"], expected[model])
        return
    texts = [t.encode() for t in TEXTS]
    for model, values in {"resnet18": [b.encode() for b in b64], "sentiment": texts, "minilm": texts}.items():
        response = kserve_client(stack, InferRequest(model, [bytes_input(values, False)], request_id="k-1"), model)
        assert response.id == "k-1" and response.model_name == model
        [output] = response.outputs
        served = output.as_numpy() if model == "minilm" else [json.loads(answer) for answer in output.data]
        assert_same(model, list(served), expected[model])


@pytest.mark.matrix
def test_the_binary_tensor_extension_stops_at_kserve_0_13(served, expected):
    """kserve 0.13's v2 route parses the body into its JSON request model: a binary-extension body
    (JSON header + raw bytes, Inference-Header-Content-Length) gets 422 there and never reaches
    TorchServe, whose handlers take the same request (tests/conformance/test_v2_binary.py)."""
    stack, srv = served[1], served[1].torchserve
    if stack.protocol != "v2":
        pytest.skip("the v2 route's")
    count = len(batch_lines(srv))
    request = InferRequest("sentiment", [bytes_input([t.encode() for t in TEXTS], True)], request_id="k-1")
    direct = kserve_client(stack, request, "sentiment", url=srv.inference)
    assert_same("sentiment", [json.loads(answer) for answer in direct.outputs[0].data], expected["sentiment"])
    before = count + len(new_batches(srv, count))  # the direct request's batch, once logged

    request = InferRequest("sentiment", [bytes_input([t.encode() for t in TEXTS], True)], request_id="k-1")
    with pytest.raises(httpx.HTTPStatusError) as caught:
        kserve_client(stack, request, "sentiment")
    response = caught.value.response
    assert response.status_code == 422, response.text
    [detail] = response.json()["detail"]
    assert detail["type"] == "model_attributes_type" and detail["loc"] == ["body"], detail
    assert detail["msg"] == "Input should be a valid dictionary or object to extract fields from"
    time.sleep(0.5)
    assert len(batch_lines(srv)) == before  # TorchServe saw nothing
