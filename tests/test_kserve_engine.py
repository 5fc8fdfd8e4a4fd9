"""One model store, every toolkit handler kind, served three ways with no change to the archives:
TorchServe, KServe's Python ModelServer (``tsctl serve --engine kserve``: handlers/kserve_predictor.py,
no Java) and in-process (LocalModel). The same request gets the same answer from each; v2 requests
from tritonclient's own client get the in-process answer on the KServe engine; the CLI's serve /
predict / bench / stop work on it; an archive that cannot load makes ``serve`` fail fast with the
handler's own error; ``export kserve --engine kserve`` writes a custom predictor and its image recipe,
which serves the exported store. ``make test`` runs the CLI, failure and export tests; the engine
comparison, tritonclient and the image recipe run in ``make matrix``. (Malformed and hostile
requests on both engines: test_hostile_served.py.)"""

import base64
import http.client
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
import yaml
from click.testing import CliRunner

from archiver import server
from archiver.cli import main
from conftest import ROOT, RunningServer, export_tree, package_resnet, package_text, short_tmp
from handlers.testing import LocalModel
from samples import runtime_env
from samples.image_model import sample_jpeg
from test_hostile import assert_close

BATCHING = "batchSize: 4\nmaxBatchDelay: 100\n"
TEXTS = ["The cat sits on the mat.", "Ünïcödé, emoji 🙂 and a rather longer sentence about nothing much", "short"]
JPEGS = [sample_jpeg(seed, (320 + 32 * seed, 240)) for seed in range(3)]
PIXELS = np.random.default_rng(1).standard_normal((3, 224, 224)).astype(np.float32)


def v1(instances) -> tuple:
    return json.dumps({"instances": instances}).encode(), "application/json"


REQUESTS = {  # model: [(body, content type), ...]: raw bodies and KServe v1 JSON of several instances
    "resnet18": [(JPEGS[0], "image/jpeg"), v1([base64.b64encode(j).decode() for j in JPEGS[1:]])],
    "resnet18_t": [v1([PIXELS.tolist()])],
    "sentiment": [(TEXTS[0].encode(), "text/plain"), v1(TEXTS)],
    "tagger": [(TEXTS[1].encode(), "text/plain; charset=utf-8"), v1(TEXTS)],
    "minilm": [(TEXTS[2].encode(), "text/plain"), v1(TEXTS)],
}


@pytest.fixture(scope="module")
def store(image_sample, text_samples, tmp_path_factory):
    store = tmp_path_factory.mktemp("engines") / "model-store"
    package_resnet(image_sample, store, config_text=BATCHING)
    tensor = store.parent / "tensor.yaml"
    tensor.write_text(BATCHING + "handler:\n  input_shape: [3, 224, 224]\n")
    package_resnet(image_sample, store, name="resnet18_t", handler="tensor", config_file=str(tensor), extra_files=[])
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier", BATCHING)
    package_text(text_samples, store, "tagger", "token_classifier", "tagger", BATCHING)
    package_text(text_samples, store, "minilm", "text_embedder", "minilm", BATCHING)
    return store


@pytest.fixture(scope="module")
def in_process(store):
    """(status, body) of every request in REQUESTS, from the archive run in-process."""
    answers = {}
    for model, requests in REQUESTS.items():
        with LocalModel(store / f"{model}.mar") as local:
            rows = [{"body": body} for body, _ in requests]
            responses = local.predict_rows(rows, [{"Content-Type": kind} for _, kind in requests])
        answers[model] = [(r.status, r.json()) for r in responses]
    return answers


@pytest.fixture(scope="module")
def kserve_engine(store):
    srv = server.start_kserve(store, short_tmp("ke-"), timeout=300)
    yield srv
    server.stop(srv)


def served(srv, model: str) -> list:
    return [
        server.request(srv.predict_url(model), body, "POST", {"Content-Type": kind}, timeout=120)
        for body, kind in REQUESTS[model]
    ]


@pytest.mark.matrix
def test_every_handler_answers_the_same_on_torchserve_on_kserve_and_in_process(store, in_process, kserve_engine):
    with RunningServer(store) as torchserve:
        for model in REQUESTS:
            for engine in (torchserve, kserve_engine):
                for (status, body), (want_status, want) in zip(served(engine, model), in_process[model]):
                    assert (status, want_status) == (200, 200), (engine.engine, model, body, want)
                    assert_close(body, want)
    print({model: len(REQUESTS[model]) for model in REQUESTS}, "requests, each equal on both engines")


@pytest.mark.matrix
def test_v2_from_tritonclient_gets_the_in_process_answer(store, kserve_engine):
    client = triton.InferenceServerClient(kserve_engine.inference.split("//")[1], network_timeout=120)
    texts = np.array([t.encode() for t in TEXTS], dtype=np.object_)
    inputs = triton.InferInput("input-0", [len(TEXTS)], "BYTES")
    inputs.set_data_from_numpy(texts, binary_data=True)
    result = client.infer("sentiment", [inputs], outputs=[triton.InferRequestedOutput("output-0", binary_data=True)])
    got = [json.loads(answer) for answer in result.as_numpy("output-0")]

    pixels = triton.InferInput("input-0", [1, 3, 224, 224], "FP32")
    pixels.set_data_from_numpy(PIXELS[None], binary_data=True)
    binary = triton.InferRequestedOutput("output-0", binary_data=True)
    logits = client.infer("resnet18_t", [pixels], outputs=[binary]).as_numpy("output-0")
    with LocalModel(store / "sentiment.mar") as local:
        [want] = local.predict([{"inputs": [{"name": "t", "shape": [3], "datatype": "BYTES", "data": TEXTS}]}])
    assert_close(got, [json.loads(answer) for answer in want.json()["outputs"][0]["data"]])
    with LocalModel(store / "resnet18_t.mar") as local:
        [want] = local.predict([{"instances": [PIXELS.tolist()]}])
    assert logits.shape[0] == 1
    assert_close([float(x) for x in logits.reshape(-1)], want.json()["predictions"][0])


def test_the_cli_serves_predicts_benches_and_stops_on_the_kserve_engine(store, tmp_path):
    image = tmp_path / "kitten.jpg"
    image.write_bytes(JPEGS[0])
    with LocalModel(store / "resnet18.mar") as local:
        [want] = local.predict([JPEGS[0]])
    home = str(short_tmp("kc-"))
    runner = CliRunner()
    started = runner.invoke(main, ["serve", "--engine", "kserve", "--model-store", str(store), "--home", home])
    try:
        assert started.exit_code == 0, started.output
        assert "KServe ModelServer ready" in started.output
        running = server.read_state(Path(home))
        predicted = runner.invoke(main, ["predict", "resnet18", str(image), "--home", home])
        assert predicted.exit_code == 0, predicted.output
        path, rest = predicted.output.strip().split(": ", 1)
        status, body = rest.split(" ", 1)
        assert (path, status) == (str(image), "200")
        assert_close(json.loads(body), want.json())
        bench = runner.invoke(
            main, ["bench", "resnet18", "--input", str(image), "--requests", "12", "--json", "--home", home]
        )
        assert bench.exit_code == 0, bench.output
        summary = json.loads(bench.output)
        assert (summary["requests"], summary["errors"]) == (12, 0)
        for path in ("/v1/models/resnet18:predict", "/v2/models/resnet18/infer"):  # no Content-Length: chunked
            status, body = post_chunked(running.inference + path, b"\0" * (1 << 20), 34)
            assert status == 413 and "handler.max_body_bytes" in body["message"], (path, status, body)
        sweep = runner.invoke(
            main,
            ["bench", "resnet18", "--input", str(image), "--requests", "4", "--sweep-batch", "1,2", "--home", home],
        )
        assert sweep.exit_code == 2 and "serve with TorchServe" in sweep.output
    finally:
        stopped = runner.invoke(main, ["stop", "--home", home])
    assert stopped.exit_code == 0 and "KServe ModelServer stopped" in stopped.output
    assert server.read_state(Path(home)) is None and not server.group_alive(running.pid)


@pytest.mark.matrix
def post_chunked(url: str, chunk: bytes, count: int):
    """POST ``count`` copies of ``chunk`` with Transfer-Encoding: chunked (no Content-Length)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        headers = {"Content-Type": "application/json"}
        connection.request("POST", parts.path, (chunk for _ in range(count)), headers, encode_chunked=True)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_an_archive_that_cannot_load_fails_serve_fast_with_its_own_error(store, tmp_path):
    broken = tmp_path / "store" / "resnet18.mar"
    broken.parent.mkdir()
    with zipfile.ZipFile(store / "resnet18.mar") as source, zipfile.ZipFile(broken, "w") as target:
        for item in source.infolist():
            target.writestr(item, b"not weights" if item.filename == "resnet18.pt" else source.read(item))
    home = short_tmp("kb-")
    result = CliRunner().invoke(
        main, ["serve", "--engine", "kserve", "--model-store", str(broken.parent), "--home", str(home)]
    )
    assert result.exit_code == 1, result.output
    assert "resnet18.pt" in result.output and "Traceback" not in result.output
    assert server.read_state(home) is None  # stopped and cleared: nothing left running


# ---- tsctl export kserve --engine kserve ---------------------------------------------------------------
IMAGE = "registry.local/tsctl-predictor:1"


@pytest.fixture(scope="module")
def exported(store, tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-export")
    shutil.copytree(store, root / "model-store")
    return export_tree(root, engine="kserve", image=IMAGE)


def test_export_writes_a_custom_predictor_and_its_image(exported, store):
    isvc = yaml.safe_load((exported / "inferenceservice.yaml").read_text())  # export validated it against the CRD
    [container] = isvc["spec"]["predictor"]["containers"]
    assert "model" not in isvc["spec"]["predictor"]
    assert container["image"] == IMAGE
    assert container["args"] == ["--model_store", "/mnt/models/model-store", "--http_port", "8080"]
    assert {"name": "STORAGE_URI", "value": "pvc://models/demo"} in container["env"]
    image = exported / "predictor-image"
    dockerfile = (image / "Dockerfile").read_text()
    assert f"FROM python:{sys.version_info.major}.{sys.version_info.minor}-slim" in dockerfile
    assert 'ENTRYPOINT ["python", "-m", "handlers.kserve_predictor"]' in dockerfile and "USER 1000" in dockerfile
    wanted = {name: metadata.version(name) for name in ("torch", "torchvision", "torchserve", "kserve")}
    lines = (image / "requirements.txt").read_text().splitlines()
    assert all(f"{name}=={version}" in lines for name, version in wanted.items()), lines
    assert any(line.startswith("transformers") for line in lines)  # the text archives' own requirement
    assert any(line.startswith("sentence-transformers") for line in lines)  # minilm's modules.json
    assert (image / "handlers" / "kserve_predictor.py").read_bytes() == (
        ROOT / "handlers/kserve_predictor.py"
    ).read_bytes()
    deploy = (exported / "DEPLOY.md").read_text()
    assert f"docker build -t {IMAGE} predictor-image" in deploy and f"docker push {IMAGE}" in deploy
    for archive in store.glob("*.mar"):  # archives go as they are: the image, not TorchServe, installs requirements
        assert (exported / "model-store" / archive.name).read_bytes() == archive.read_bytes()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--engine", "kserve"], "--engine kserve needs --image"),
        (["--engine", "kserve", "--image", IMAGE, "--offline"], "drop --offline"),
        (["--image", IMAGE], "add --engine kserve"),
    ],
)
def test_export_engine_mistakes_are_one_sentence(exported, tmp_path, args, words):
    config, store = exported / "config" / "config.properties", exported / "model-store"
    common = [
        "--name",
        "demo",
        "--storage-uri",
        "pvc://models/demo",
        "--config",
        str(config),
        "--model-store",
        str(store),
    ]
    result = CliRunner().invoke(main, ["export", "kserve", str(tmp_path / "out"), *common, *args])
    assert result.exit_code == 2, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert words in line and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.matrix
def test_the_predictor_image_requirements_serve_the_exported_store(exported, in_process):
    """The image's recipe without docker (no daemon here): a venv of the Dockerfile's Python with
    predictor-image/requirements.txt (from PyPI: the image takes torch's CPU wheels of the same
    versions), run from predictor-image/ as WORKDIR /app, with the Dockerfile's command on the
    exported model store; every model answers as in-process."""
    venv = exported.parent / "image-venv"
    python = venv / "bin" / "python"
    uv = [sys.executable, "-m", "uv"]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run(uv + ["venv", "--quiet", "-p", runtime_env.interpreter(version), str(venv)], check=True)
    requirements = exported / "predictor-image" / "requirements.txt"
    subprocess.run(uv + ["pip", "install", "--quiet", "--python", str(python), "-r", str(requirements)], check=True)
    port = server.free_port()
    home = short_tmp("ki-")
    command = [str(python), "-m", "handlers.kserve_predictor", "--model_store", str(exported / "model-store")]
    command += ["--http_port", str(port), "--host", "127.0.0.1", "--enable_grpc", "false"]
    with open(home / "out.log", "wb") as out:
        process = subprocess.Popen(
            command,
            cwd=exported / "predictor-image",
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
    srv = server.Server(process.pid, str(home), f"http://127.0.0.1:{port}", "", "", list(REQUESTS), engine="kserve")
    try:
        server.wait_kserve_ready(srv, 300, process)
        for model in REQUESTS:
            for (status, body), (_, want) in zip(served(srv, model), in_process[model]):
                assert status == 200, (model, body)
                assert_close(body, want)
    finally:
        server.stop(srv)


def test_the_engine_keeps_torchs_threads_whatever_minworkers_says(monkeypatch):
    """One engine process serves each archive on one model thread: minWorkers 2 must not halve them."""
    import torch

    import handlers.loading
    from handlers import kserve_predictor

    monkeypatch.setenv("OMP_NUM_THREADS", "unset below; restored after the test")
    monkeypatch.delenv("OMP_NUM_THREADS")
    before = torch.get_num_threads()
    try:
        kserve_predictor.keep_torch_threads()
        assert handlers.loading.pick_threads(0, 2) == before
    finally:
        torch.set_num_threads(before)
