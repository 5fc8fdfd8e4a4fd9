"""The tsctl engine on the tree as KServe's TorchServe runtime hands it over: KServe's own sample
config.properties (../shared/kserve/wrapper/config.properties: TorchServe's addresses, NUM_WORKERS,
install_py_dep_per_model=true, a model_store the command line overrides, enable_envvars_config=true) and
the envelope KServe sets in the environment (TS_SERVICE_ENVELOPE, from the protocol), which TorchServe
reads only when the config allows environment variables. A handler that is not the toolkit's gets the
envelope's unpacked instances on the engine as in TorchServe's worker (LocalModel with the same
envelope); the toolkit's handlers step aside from it. The runtime manifest and the image:
tests/export/test_kserve_export.py and test_kserve_image.py."""

import json
import shutil
from pathlib import Path

import pytest

from helpers.engine import Engine
from helpers.models import package_resnet
from serving import config_properties, ts_config
from serving.local_model import LocalModel

SHARED = Path(__file__).resolve().parents[3] / "shared" / "kserve"
ECHO = "def handle(data, context):\n    return data\n"  # no toolkit: TorchServe's envelope unpacks for it


@pytest.mark.parametrize(
    "switch, environment, envelope",
    [
        ("true", {"TS_SERVICE_ENVELOPE": "kservev2"}, "kservev2"),
        ("TRUE", {"TS_SERVICE_ENVELOPE": "kserve"}, "kserve"),  # Java's Boolean.parseBoolean: any case
        ("false", {"TS_SERVICE_ENVELOPE": "kserve"}, "body"),  # environment not allowed: the file's value
        ("true ", {"TS_SERVICE_ENVELOPE": "kserve"}, "body"),  # a trailing blank is the value's: not "true"
        ("true", {"TS_NUMBER_OF_NETTY_THREADS": "9"}, "body"),  # a key the engine does not read
    ],
)
def test_the_environment_overrides_the_file_as_torchserve_lets_it(switch, environment, envelope):
    written = {"enable_envvars_config": switch, "service_envelope": "body", "job_queue_size": "7"}
    read = config_properties.with_environment(written, environment)
    assert read["service_envelope"] == envelope and read["job_queue_size"] == "7"
    assert "number_of_netty_threads" not in read and written["service_envelope"] == "body"  # the file's untouched
    assert config_properties.with_environment(written, {"TS_JOB_QUEUE_SIZE": "9"})["job_queue_size"] == (
        "9" if switch == "TRUE" or switch == "true" else "7"
    )
    # the addresses too, as TorchServe's TS_INFERENCE_ADDRESS ... (serving/engine/listeners.py binds them)
    moved = config_properties.with_environment(written, {"TS_METRICS_ADDRESS": "http://0.0.0.0:9"}).get(
        "metrics_address"
    )
    assert moved == ("http://0.0.0.0:9" if switch in ("TRUE", "true") else None)


@pytest.fixture(scope="module")
def kserve_tree(image_sample, tmp_path_factory):
    """KServe's sample config.properties as it is, and mnist.mar beside it (a handler of no toolkit)."""
    if not (SHARED / "wrapper" / "config.properties").is_file():
        pytest.skip("../shared/kserve is not beside this checkout: KServe's sample config.properties is in it")
    root = tmp_path_factory.mktemp("kserve-mount")
    (root / "config").mkdir()
    shutil.copyfile(SHARED / "wrapper" / "config.properties", root / "config" / "config.properties")
    echo = root / "echo.py"
    echo.write_text(ECHO)
    package_resnet(image_sample, root / "model-store", name="mnist", handler=str(echo), version="1.0")
    return root


def test_kserves_sample_config_is_read_with_its_snapshot(kserve_tree, monkeypatch):
    monkeypatch.setenv("TS_SERVICE_ENVELOPE", "kserve")
    [spec], frontend = ts_config.models(kserve_tree / "config" / "config.properties", kserve_tree / "model-store")
    assert (spec.name, spec.version, spec.archive.name) == ("mnist", "1.0", "mnist.mar")
    assert (spec.min_workers, spec.max_workers, spec.batch_size, spec.max_batch_delay) == (1, 5, 5, 200)
    assert frontend.envelope == "kserve" and frontend.job_queue_size == 10
    assert any("install_py_dep_per_model=true" in note for note in frontend.notes)


@pytest.mark.parametrize("envelope", ["kserve", pytest.param("kservev2", marks=pytest.mark.matrix)])
def test_the_engine_wraps_handlers_in_kserves_envelope_as_torchserve_does(kserve_tree, monkeypatch, envelope):
    """``python -m serving.engine`` (as the runtime's image runs it: ``tsctl serve`` refuses NUM_WORKERS, which
    is no TorchServe key) on KServe's sample config, TS_SERVICE_ENVELOPE as KServe sets it for the protocol:
    the handler's answer is TorchServe's worker's with that envelope (LocalModel)."""
    if envelope == "kserve":
        body, path = {"instances": [[1, 2], [3]]}, "/v1/models/mnist:predict"
    else:
        body = {"inputs": [{"name": "input-0", "shape": [2], "datatype": "INT32", "data": [1, 2]}]}
        path = "/v2/models/mnist/infer"
    with LocalModel(kserve_tree / "model-store" / "mnist.mar", envelope=envelope) as local:
        [want] = local.predict([json.dumps(body).encode()])
    assert want.status == 200, want.json()
    monkeypatch.setenv("TS_SERVICE_ENVELOPE", envelope)
    engine = Engine(kserve_tree)
    try:
        status, answer = engine.wait_ready().post(path, json.dumps(body).encode(), "application/json")
    finally:
        engine.stop()
    expected = want.json()
    if envelope == "kservev2":  # the envelope makes up a response id for a request without one
        assert answer.pop("id") != expected.pop("id")
    assert status == 200 and answer == expected, answer
    assert ("predictions" if envelope == "kserve" else "outputs") in answer
