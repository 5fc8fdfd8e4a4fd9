"""KServe v2 model metadata from what a model declares (serving/v2_metadata.py), read by tritonclient's HTTP
and gRPC clients from a served engine: a toolkit handler's own declaration (the tensor handler), a user's
handler declaring them in its model-config.yaml's v2_metadata section, and one declaring nothing (empty
lists, and a note in the REST body saying how to declare them)."""

import json
import subprocess
import sys

import pytest
import tritonclient.http as triton_http

from archiver.errors import UserError
from archiver.model_config import check_model_config
from helpers.engine import Engine
from helpers.models import package_resnet
from samples import ts_examples, ts_stateful
from serving.v2_metadata import NOT_DECLARED

DECLARED = """\
v2_metadata:
  inputs: [{name: values, datatype: INT64, shape: [-1]}]
  outputs: [{name: total, datatype: BYTES, shape: [-1]}]
"""
TENSOR = (
    [{"name": "input-0", "datatype": "FP32", "shape": [-1, -1]}],
    [{"name": "output-0", "datatype": "FP32", "shape": [-1, -1]}],
)


@pytest.fixture(scope="module")
def engine(image_sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("v2-metadata")
    store = root / "model-store"
    handler = str(ts_stateful.STAND_INS / "running_sum.py")
    (root / "declared.yaml").write_text(DECLARED)
    for name, config in (("declared", root / "declared.yaml"), ("undeclared", None)):
        ts_examples.package(ts_examples.Example(name, handler, [], config_file=config), "torch-model-archiver", store)
    tensor = root / "tensor.yaml"
    tensor.write_text("handler:\n  input_shape: [3, 224, 224]\n")
    package_resnet(image_sample, store, name="resnet18_t", handler="tensor", config_file=str(tensor), extra_files=[])
    running = Engine(root).wait_ready()
    yield running
    assert running.stop() == 0


GRPC_METADATA = """
import json, sys
import tritonclient.grpc as triton_grpc
address, name, key = sys.argv[1:4]
client = triton_grpc.InferenceServerClient(address)
headers = {"authorization": key} if key else {}
print(json.dumps(client.get_model_metadata(name, headers=headers, as_json=True, client_timeout=30)))
"""


def metadata(engine, name: str) -> dict:
    """{"http": ..., "grpc": ...}: tritonclient's get_model_metadata on each protocol, as dicts. Its gRPC
    client in a process of its own (its protos and kserve's declare the same ``inference`` package, which
    one Python process cannot hold: tests/helpers/grpc_client.py)."""
    key = engine.headers("inference")  # token authorization: TorchServe 0.12's default, on
    http = triton_http.InferenceServerClient(f"127.0.0.1:{engine.http}", network_timeout=30)
    try:
        over_http = http.get_model_metadata(name, headers=key)
    finally:
        http.close()
    command = [sys.executable, "-c", GRPC_METADATA, f"127.0.0.1:{engine.grpc}", name, key.get("Authorization", "")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return {"http": over_http, "grpc": json.loads(done.stdout)}


def tensors(answer: dict, side: str) -> list:
    """The answer's tensors, shapes as numbers (tritonclient's gRPC JSON gives int64 as text)."""
    return [{**t, "shape": [int(d) for d in t.get("shape", [])]} for t in answer.get(side, [])]


def test_a_toolkit_handler_declares_its_tensors(engine):
    for protocol, answer in metadata(engine, "resnet18_t").items():
        assert (tensors(answer, "inputs"), tensors(answer, "outputs")) == TENSOR, protocol


def test_a_users_handler_declares_them_in_its_model_config(engine):
    for protocol, answer in metadata(engine, "declared").items():
        assert tensors(answer, "inputs") == [{"name": "values", "datatype": "INT64", "shape": [-1]}], protocol
        assert tensors(answer, "outputs") == [{"name": "total", "datatype": "BYTES", "shape": [-1]}], protocol


def test_nothing_declared_says_so(engine):
    answers = metadata(engine, "undeclared")
    assert answers["http"]["inputs"] == answers["http"]["outputs"] == [] and answers["http"]["note"] == NOT_DECLARED
    assert "inputs" not in answers["grpc"] and "outputs" not in answers["grpc"]
    assert answers["grpc"]["name"] == "undeclared"


@pytest.mark.parametrize(
    "section, words",
    [
        ("v2_metadata: [1]\n", "v2_metadata must be a mapping of inputs and outputs"),
        ("v2_metadata:\n  inputs: [{name: x, datatype: FLOAT, shape: [1]}]\n", "datatype 'FLOAT' is not one of"),
        ("v2_metadata:\n  outputs: [{name: x, datatype: FP32, shape: [-2]}]\n", "shape must be a list"),
        ("v2_metadata:\n  inputs: [{name: x, datatype: FP32}]\n", "must have name, datatype and shape"),
    ],
)
def test_tsctl_package_refuses_a_section_it_cannot_serve(tmp_path, section, words):
    path = tmp_path / "model-config.yaml"
    path.write_text(section)
    with pytest.raises(UserError, match=words):
        check_model_config(path)
