"""What `tsctl export kserve` writes, served by the TorchServe KServe really runs.

KServe's `pytorch` runtime ships torchserve-kfs:0.9.0: TorchServe 0.9.0 on Python 3.9 with torch
2.1.0 (samples/runtime_env.py builds a venv standing in for it). There each archive's
requirements.txt is installed by TorchServe itself (`install_py_dep_per_model=true`, as in the
exported config), with 0.9.0's `pip install -U -t MODEL_DIR`: through the package index, and with
`--offline` from the wheels inside the archive with no index at all. The answers must be the
in-process ones (torch 2.15 here, 2.1.0 there: probabilities within 1e-3, embeddings cosine 0.9999).

`make test` runs the checks that need no server (the lock resolved for the image, ranges refused
before anything is written); the served runs (text and image archives with the per-model install
through the index, tritonclient's binary request, the offline export and install, its control, both
envelopes) are in `make matrix`, about 10 minutes. make test's served smoke path on TorchServe 0.9.0
is tests/conformance/test_kserve_wrapper.py's.
"""

import base64
import json
import shutil
import zipfile

import numpy as np
import pytest
import tritonclient.http as triton

from archiver import kserve_images, mar, properties, server
from archiver.engines import torchserve_launch
from archiver.errors import UserError
from helpers.models import export_tree, local_answers, package_resnet, package_text
from helpers.paths import short_tmp
from helpers.servers import batch_lines, post_json_concurrently
from samples import runtime_env

KFS = "torchserve-kfs:0.9.0"
TEXTS = ["a short one", "a considerably longer sentence that needs more tokens than the first", "mid length text"]
BATCHING = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 4\nmaxBatchDelay: 300\nresponseTimeout: 120\n"
NO_INDEX = {  # pip may not reach any index: a fetch would fail the install
    "PIP_CONFIG_FILE": "/dev/null",
    "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
    "PIP_EXTRA_INDEX_URL": "",
    "PIP_FIND_LINKS": "",
}


@pytest.fixture(scope="module")
def kfs_python():
    return runtime_env.ensure(KFS)


@pytest.fixture(scope="module")
def store(image_sample, text_samples, tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    store = root / "model-store"
    package_resnet(image_sample, store, config_text=BATCHING)
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier", BATCHING)
    package_text(text_samples, store, "minilm", "text_embedder", "minilm", BATCHING)
    properties.write_config(store, root / "config" / "config.properties")
    return root


def export(root, out, **options):
    return export_tree(root, out, runtime=KFS, **options)


@pytest.fixture(scope="module")
def expected(store, jpegs):
    return local_answers(store / "model-store", {"resnet18": jpegs[:3], "sentiment": TEXTS, "minilm": TEXTS})


def serve(tree, python, envelope, env=None):
    return torchserve_launch.start(
        tree / "config" / "config.properties",
        tree / "model-store",
        short_tmp("kfs-"),
        timeout=420,
        python=str(python),
        install_deps=True,
        kserve_args=True,
        env={"TS_SERVICE_ENVELOPE": envelope, **(env or {})},
    )


def call(srv, path, body):
    return server.request(
        srv.inference + path, json.dumps(body).encode(), "POST", {"Content-Type": "application/json"}, 120
    )


def assert_same(model: str, served: list, expected: list):
    assert len(served) == len(expected)
    for got, want in zip(served, expected):
        if model == "minilm":
            dot = sum(a * b for a, b in zip(got, want))
            assert dot >= 0.9999 * (sum(a * a for a in got) * sum(b * b for b in want)) ** 0.5
        else:
            assert list(got) == list(want)  # same labels, same order
            assert list(got.values()) == pytest.approx(list(want.values()), abs=1e-3)


def check_answers(srv, jpegs, expected, envelope):
    inputs = {"resnet18": [base64.b64encode(j).decode() for j in jpegs[:3]], "sentiment": TEXTS, "minilm": TEXTS}
    for model, items in inputs.items():
        if envelope == "kserve":
            status, body = call(srv, f"/v1/models/{model}:predict", {"instances": items})
            assert status == 200, body
            served = body["predictions"]
        else:
            tensor = {"name": "input-0", "shape": [len(items)], "datatype": "BYTES", "data": items}
            status, body = call(srv, f"/v2/models/{model}/infer", {"inputs": [tensor]})
            assert status == 200, body
            output = body["outputs"][0]
            if output["datatype"] == "BYTES":
                served = [json.loads(answer) for answer in output["data"]]
            else:
                width = output["shape"][1]
                served = [output["data"][i : i + width] for i in range(0, len(output["data"]), width)]
        assert_same(model, served, expected[model])


def check_binary_answers(srv, jpegs, expected):
    """tritonclient's default request (binary inputs, binary outputs) on TorchServe 0.9.0."""
    url = srv.inference.split("://", 1)[1]
    with triton.InferenceServerClient(url, connection_timeout=60, network_timeout=120) as client:
        for model, values in (("resnet18", jpegs[:3]), ("minilm", [t.encode() for t in TEXTS])):
            tensor = triton.InferInput("input-0", [len(values)], "BYTES")
            tensor.set_data_from_numpy(np.array(values, dtype=np.object_), binary_data=True)
            result = client.infer(model, [tensor])
            output = result.get_response()["outputs"][0]
            assert "binary_data_size" in output["parameters"]  # answered in binary, as asked
            served = result.as_numpy(output["name"])
            if model == "minilm":
                assert_same(model, served.tolist(), expected[model])
            else:
                assert_same(model, [json.loads(answer) for answer in served], expected[model])


def installed_transformers(srv) -> str:
    """The transformers version a worker imported, from the per-model install's target directory."""
    found = list((srv.logs.parent / "tmp").rglob("transformers-*.dist-info"))
    assert found, "the per-model install put no transformers into the model directory"
    return found[0].name[: -len(".dist-info")].split("-")[1]


def stop(srv):
    server.stop(srv)
    shutil.rmtree(srv.home, ignore_errors=True)


# ---- resolving requirements for the runtime (uv against the package index) -------------------------
def test_a_range_resolves_to_the_images_own_versions():
    lock = kserve_images.lock("transformers>=4.34,<6\n", kserve_images.RUNTIMES[KFS], "m.mar")
    pins = dict(line.split("==") for line in lock.lines)
    assert pins["transformers"] == "4.34.0" and pins["numpy"] == "1.24.3" and lock.note == ""
    assert "torch" not in pins  # transformers does not need it; the image has it


def test_a_range_above_the_image_keeps_torch_and_numpy_and_says_what_it_shadows():
    lock = kserve_images.lock("transformers>=4.40,<6\n", kserve_images.RUNTIMES[KFS], "m.mar")
    pins = dict(line.split("==") for line in lock.lines)
    assert pins["transformers"] == "4.40.0"  # the lowest allowed: nearest to what the image was built with
    assert pins["numpy"] == "1.24.3" and pins["requests"] == "2.31.0"
    assert "transformers 4.40.0 (the image has 4.34.0)" in lock.note


def test_requirements_that_cannot_install_on_the_runtime_are_refused_before_anything_is_written(text_samples, tmp_path):
    (tmp_path / "needs5.txt").write_text("transformers>=5\n")
    options = dict(handler="text_classifier", serialized_file=str(text_samples / "classifier"), force=True)
    mar.package(
        mar.PackageOptions(
            model_name="sentiment",
            export_path=str(tmp_path / "model-store"),
            requirements_file=str(tmp_path / "needs5.txt"),
            **options,
        )
    )
    properties.write_config(tmp_path / "model-store", tmp_path / "config" / "config.properties")
    refusal = (
        r"sentiment.mar's needs5.txt asks for transformers>=5, which cannot be installed on torchserve-kfs:0.9.0 "
        r"\(Python 3.9, torch 2.1.0\): Because the requested Python version \(>=3.9\) does not satisfy"
    )
    with pytest.raises(UserError, match=refusal):
        export(tmp_path, "refused")
    assert not (tmp_path / "refused").exists()


@pytest.mark.matrix  # downloads every wheel: about 2 minutes
def test_export_pins_requirements_and_offline_bundles_wheels_without_touching_the_store(store):
    before = (store / "model-store" / "sentiment.mar").read_bytes()
    tree = export(store, "offline-check", offline=True)
    assert (store / "model-store" / "sentiment.mar").read_bytes() == before
    with zipfile.ZipFile(tree / "model-store" / "sentiment.mar") as z:
        names = z.namelist()
        requirements = z.read("requirements.txt").decode().splitlines()
        with zipfile.ZipFile(store / "model-store" / "sentiment.mar") as original:
            assert set(original.namelist()) <= set(names)  # everything else is kept
            assert z.read("MAR-INF/MANIFEST.json") == original.read("MAR-INF/MANIFEST.json")
    assert requirements[:2] == ["--no-index", "--find-links wheels"]
    wheels = {name.split("/")[1].split("-")[0].lower() for name in names if name.startswith("wheels/")}
    locked = {line.split("==")[0].replace("-", "_") for line in requirements[2:]}
    assert locked == {w.replace("-", "_") for w in wheels}
    assert "transformers==4.34.0" in requirements
    for wheel in (name for name in names if name.endswith(".whl")):  # each installs on CPython 3.9, x86_64
        python, abi, platform = wheel[: -len(".whl")].split("-")[-3:]
        assert python in ("cp39", "py3", "py2.py3") or abi == "abi3", wheel
        assert platform == "any" or "x86_64" in platform, wheel
    with zipfile.ZipFile(tree / "model-store" / "resnet18.mar") as z:  # no requirements: copied as it was
        assert z.namelist() == zipfile.ZipFile(store / "model-store" / "resnet18.mar").namelist()


# ---- served on the runtime ---------------------------------------------------------------------------
@pytest.mark.matrix  # about 3 minutes (TorchServe 0.9.0's per-model install from the index); make test's 0.9.0
# smoke path is tests/conformance/test_kserve_wrapper.py's
@pytest.mark.parametrize("envelope", ["kservev2", "kserve"])
def test_text_and_image_archives_install_and_serve_on_torchserve_0_9(store, kfs_python, expected, jpegs, envelope):
    """The per-model install goes through the package index, as on a cluster with outbound access."""
    srv = serve(export(store, f"online-{envelope}"), kfs_python, envelope)
    try:
        assert installed_transformers(srv) == "4.34.0"
        check_answers(srv, jpegs, expected, envelope)
        if envelope == "kservev2":
            check_binary_answers(srv, jpegs, expected)
        before = len(batch_lines(srv))
        body = {"inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": [TEXTS[1]]}]}
        if envelope == "kserve":
            body, path = {"instances": [TEXTS[1]]}, "/v1/models/sentiment:predict"
        else:
            path = "/v2/models/sentiment/infer"
        answers = post_json_concurrently(srv, path, [json.dumps(body).encode()] * 8)
        assert [status for status, _ in answers] == [200] * 8
        assert max(line["size"] for line in batch_lines(srv)[before:]) > 1
    finally:
        stop(srv)


@pytest.mark.matrix  # about 4 minutes: the wheels, then TorchServe 0.9.0 installing them
def test_offline_archives_install_with_no_index_at_all(store, kfs_python, expected, jpegs):
    srv = serve(export(store, "offline", offline=True), kfs_python, "kservev2", NO_INDEX)
    try:
        assert installed_transformers(srv) == "4.34.0"
        check_answers(srv, jpegs, expected, "kservev2")
    finally:
        stop(srv)


@pytest.mark.matrix
def test_without_the_offline_wheels_the_same_install_fails_with_no_index(store, kfs_python):
    """The control for the test above: with the index cut off, the online export cannot install."""
    with pytest.raises(Exception, match="(?i)could not register|pip|installation"):
        srv = serve(export(store, "online-no-index"), kfs_python, "kservev2", NO_INDEX)
        stop(srv)
