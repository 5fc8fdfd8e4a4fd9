"""One model store, every toolkit handler kind, served three ways with no change to the archives:
TorchServe, the tsctl engine (``tsctl serve --engine tsctl``: ``archiver.engines.TsctlRuntime`` starting
``python -m serving.engine``, no Java) and in-process (LocalModel). The same request to the engine's
``predict_url`` gets the same answer from each; v2 requests from tritonclient's HTTP and gRPC clients get
the in-process answer on the engine; the CLI's serve / predict / bench / verify / stop work on it, from
the same config.properties as TorchServe, and server.json records its addresses; a snapshot naming a
missing archive is refused before anything starts, and an archive that cannot load makes ``serve`` fail
fast with the handler's own error; ``export kserve --engine tsctl``'s image recipe serves the exported
tree as the runtime's container starts it. ``make test`` runs the CLI, failure and export tests; the
engine comparison, tritonclient and the image recipe run in ``make matrix``. (Malformed and hostile
requests on both engines: test_hostile_served.py; the runtime and InferenceService manifests:
test_kserve_export.py.)"""

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
from click.testing import CliRunner

from archiver import engines, mar, properties, server
from archiver import golden as golden_answers
from archiver.cli import main
from helpers import grpc_client
from helpers.hostile import assert_close
from helpers.models import export_tree, package_resnet, package_text
from helpers.paths import ROOT, short_tmp
from helpers.servers import RunningServer, stand_in_http
from samples import runtime_env
from samples.image_model import sample_jpeg
from serving.local_model import LocalModel

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
def local(store):
    """``local(name)``: the store's NAME.mar in a worker (LocalModel), started once for the module."""
    opened = {}

    def get(name: str) -> LocalModel:
        if name not in opened:
            opened[name] = LocalModel(store / f"{name}.mar")
        return opened[name]

    yield get
    for model in opened.values():
        model.close()


@pytest.fixture(scope="module")
def in_process(local):
    """(status, body) of every request in REQUESTS, from the archive run without a server (LocalModel)."""
    answers = {}
    for model, requests in REQUESTS.items():
        rows = [{"body": body} for body, _ in requests]
        responses = local(model).predict_rows(rows, [{"Content-Type": kind} for _, kind in requests])
        answers[model] = [(r.status, r.json()) for r in responses]
    return answers


ENGINE = engines.ENGINES["tsctl"]


@pytest.fixture(scope="module")
def kserve_engine(store):
    """The engine on the store alone: no config.properties anywhere near it, so every archive with its
    model-config.yaml."""
    srv = ENGINE.start(store, home=short_tmp("ke-"), timeout=300)
    yield srv
    ENGINE.stop(srv)


def served(srv, model: str) -> list:
    return [
        server.request(engines.predict_url(srv, model), body, "POST", {"Content-Type": kind}, timeout=120)
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
def test_v2_from_tritonclient_gets_the_in_process_answer(store, kserve_engine, local):
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
    [want] = local("sentiment").predict([{"inputs": [{"name": "t", "shape": [3], "datatype": "BYTES", "data": TEXTS}]}])
    assert_close(got, [json.loads(answer) for answer in want.json()["outputs"][0]["data"]])
    [want] = local("resnet18_t").predict([{"instances": [PIXELS.tolist()]}])
    assert logits.shape[0] == 1
    assert_close([float(x) for x in logits.reshape(-1)], want.json()["predictions"][0])

    # the same over gRPC, at the address server.json records
    answer = grpc_client.call(kserve_engine.grpc, "sentiment", [t.encode() for t in TEXTS])
    assert answer["server_ready"] and answer["model_ready"]
    answers = answer["answers"]
    assert_close([json.loads(answer) for answer in answers], got)


def package_golden(image_sample: Path, root: Path) -> Path:
    """resnet18 as the store has it (same weights and settings) with two golden answers in the archive."""
    inputs = root / "golden-inputs"
    inputs.mkdir()
    (inputs / "photo.jpg").write_bytes(JPEGS[1])
    (inputs / "broken.png").write_bytes(b"not a png")
    config = root / "golden.yaml"
    config.write_text(BATCHING)
    options = dict(
        model_name="resnet18",
        handler="image_classifier",
        serialized_file=str(image_sample / "resnet18.pt"),
        model_file=str(image_sample / "model.py"),
        extra_files=[str(image_sample / "index_to_name.json")],
        config_file=str(config),
        export_path=str(root / "golden-store"),
    )
    path, _, _ = golden_answers.package(mar.PackageOptions(**options), str(inputs))
    return path


@pytest.mark.matrix  # 15 s; make test: serve/predict/bench/stop on the engine in tests/cli/test_token_auth.py
def test_the_cli_serves_predicts_benches_verifies_and_stops_on_the_engine(store, image_sample, tmp_path, local):
    """``serve --engine kserve`` (an alias of tsctl) ``--config`` reads the same config.properties as TorchServe
    (its snapshot's batchSize 2 wins over the archives' 4); server.json records the engine and its addresses."""
    image = tmp_path / "kitten.jpg"
    image.write_bytes(JPEGS[0])
    [want] = local("resnet18").predict([JPEGS[0]])
    config = properties.write_config(store, tmp_path / "config" / "config.properties", {"batchSize": 2})
    home = str(short_tmp("kc-"))
    runner = CliRunner()
    started = runner.invoke(
        main, ["serve", "--engine", "kserve", "--config", str(config), "--model-store", str(store), "--home", home]
    )
    try:
        assert started.exit_code == 0, started.output
        assert started.stdout.startswith("tsctl engine ready (pid ")
        assert started.stderr.splitlines().count("note: --engine kserve is an alias of --engine tsctl") == 1
        running = server.read_state(Path(home))
        recorded = json.loads((Path(home) / "server.json").read_text())
        assert recorded["engine"] == "tsctl" and sorted(recorded["models"]) == sorted(REQUESTS)
        address = recorded["inference"]
        assert address.startswith("http://127.0.0.1:") and recorded["metrics"] == address
        management = recorded["management"]  # a port of its own, as tsctl serve gives TorchServe's
        assert management.startswith("http://127.0.0.1:") and management != address
        assert recorded["grpc"].startswith("127.0.0.1:") and recorded["grpc"] != address.split("//")[1]
        assert recorded["kserve_v2_grpc"] == recorded["grpc"]  # the former key: KServe's v2 gRPC on the engine
        grpcs = [recorded[key] for key in ("kserve_v2_grpc", "ts_grpc_inference", "ts_grpc_management")]
        assert len(set(grpcs)) == 3 and all(g.startswith("127.0.0.1:") for g in grpcs), grpcs
        for label in (
            "inference",
            "management",
            "metrics",
            "kserve_v2_grpc",
            "ts_grpc_inference",
            "ts_grpc_management",
            "logs",
        ):
            assert f"  {label} " in started.output, label
        assert "  grpc " not in started.output and "token authorization" not in started.output
        assert engines.predict_url(running, "resnet18") == f"{address}/predictions/resnet18"
        status, described = server.request(f"{running.management}/models/resnet18", timeout=10)
        assert status == 200 and described[0]["batchSize"] == 2  # the config's snapshot, not the archive's 4
        status, metrics = server.request(running.metrics_url, timeout=10)
        assert status == 200 and "ts_workers" in metrics, metrics[:500]

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
        assert sweep.exit_code == 2 and "start it with 'tsctl serve --enable-model-api'" in sweep.output, sweep.output
        golden = package_golden(image_sample, tmp_path)  # resnet18 again, its golden answers kept
        verified = runner.invoke(main, ["verify", str(golden), "--served", "--home", home])
        assert verified.exit_code == 0, verified.output
        assert verified.output.strip() == f"2 of 2 golden answers match ({address} (ts))"
    finally:
        stopped = runner.invoke(main, ["stop", "--home", home])
    assert stopped.exit_code == 0 and "tsctl engine stopped" in stopped.output
    assert server.read_state(Path(home)) is None and not server.group_alive(running.pid)


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


def test_serve_refuses_what_the_engine_cannot_do_before_starting(store, tmp_path):
    """TorchServe's flags, and a snapshot naming an archive the store lacks (the check TorchServe's start
    makes, shared), are refused with exit 2 and nothing started."""
    home = short_tmp("kr-")
    common = ["serve", "--engine", "kserve", "--model-store", str(store), "--home", str(home)]
    result = CliRunner().invoke(main, [*common, "--install-deps"])
    assert result.exit_code == 2, result.output
    assert (
        "--install-deps is not an option of --engine tsctl (tsctl engine): drop --install-deps, or serve with "
        "--engine torchserve" in result.output
    )

    moved = tmp_path / "store"
    moved.mkdir()
    shutil.copyfile(store / "resnet18.mar", moved / "resnet18.mar")
    config = properties.write_config(moved, tmp_path / "config.properties")
    (moved / "resnet18.mar").rename(moved / "renamed.mar")
    for engine in engines.ENGINES:
        result = CliRunner().invoke(
            main,
            ["serve", "--engine", engine, "--config", str(config), "--model-store", str(moved), "--home", str(home)],
        )
        assert result.exit_code == 2, result.output
        assert "model_snapshot names 'resnet18.mar' for model 'resnet18', which is not in" in result.output, engine
    assert server.read_state(home) is None and not (home / engines.ENGINE_OUT).exists()


def test_an_archive_that_cannot_load_fails_serve_fast_with_its_own_error(store, tmp_path):
    broken = tmp_path / "store" / "resnet18.mar"
    broken.parent.mkdir()
    with zipfile.ZipFile(store / "resnet18.mar") as source, zipfile.ZipFile(broken, "w") as target:
        for item in source.infolist():
            target.writestr(item, b"not weights" if item.filename == "resnet18.pt" else source.read(item))
    config = properties.write_config(broken.parent, tmp_path / "config" / "config.properties")
    home = short_tmp("kb-")
    result = CliRunner().invoke(
        main,
        [
            "serve",
            "--engine",
            "kserve",
            "--config",
            str(config),
            "--model-store",
            str(broken.parent),
            "--home",
            str(home),
        ],
    )
    assert result.exit_code == 1, result.output
    assert "resnet18.pt" in result.output and "Traceback" not in result.output
    assert server.read_state(home) is None  # stopped and cleared: nothing left running


# ---- tsctl export kserve --engine tsctl: the runtime's image ------------------------------------------
IMAGE = "registry.local/tsctl-engine:1"


@pytest.fixture(scope="module")
def exported(store, tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-export")
    shutil.copytree(store, root / "model-store")
    return export_tree(root, engine="kserve", image=IMAGE)


def test_export_writes_the_runtimes_image_recipe(exported, store):
    image = exported / "predictor-image"
    dockerfile = (image / "Dockerfile").read_text()
    assert f"ARG BASE_IMAGE=python:{sys.version_info.major}.{sys.version_info.minor}-slim\n" in dockerfile
    assert 'ENTRYPOINT ["python", "-m", "serving.engine"]' in dockerfile and "USER 1000" in dockerfile
    wanted = {name: metadata.version(name) for name in ("torch", "torchvision", "torchserve", "kserve", "uvicorn")}
    lines = (image / "requirements.txt").read_text().splitlines()
    assert all(f"{name}=={version}" in lines for name, version in wanted.items()), lines
    assert any(line.startswith("transformers") for line in lines)  # the text archives' own requirement
    assert any(line.startswith("sentence-transformers") for line in lines)  # minilm's modules.json
    assert (image / "serving" / "engine" / "app.py").read_bytes() == (ROOT / "serving/engine/app.py").read_bytes()
    assert (image / "handlers" / "image.py").read_bytes() == (ROOT / "handlers/image.py").read_bytes()
    assert (exported / "servingruntime.yaml").is_file()
    for archive in store.glob("*.mar"):  # archives go as they are: the image, not TorchServe, installs requirements
        assert (exported / "model-store" / archive.name).read_bytes() == archive.read_bytes()


def image_command(exported: Path, python: Path, http_port: int, grpc_port: int) -> list:
    """The Dockerfile's ENTRYPOINT and CMD, /mnt/models being the exported tree, on free ports."""
    dockerfile = (exported / "predictor-image" / "Dockerfile").read_text()
    [entrypoint] = [
        json.loads(line.split(" ", 1)[1]) for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT")
    ]
    [cmd] = [json.loads(line.split(" ", 1)[1]) for line in dockerfile.splitlines() if line.startswith("CMD")]
    ports = {"--http_port=8080": f"--http_port={http_port}", "--grpc_port=8081": f"--grpc_port={grpc_port}"}
    cmd = [ports.get(arg, arg.replace("/mnt/models", str(exported))) for arg in cmd]
    assert entrypoint[0] == "python"
    return [str(python), *entrypoint[1:], *cmd, "--host", "127.0.0.1"]


@pytest.mark.matrix
def test_the_runtime_image_requirements_serve_the_exported_tree(exported, in_process):
    """The image's recipe without docker (no daemon here): a venv of the Dockerfile's Python with
    predictor-image/requirements.txt (from PyPI: the image takes torch's CPU wheels of the same
    versions), run from predictor-image/ as WORKDIR /app, with the Dockerfile's command on the
    exported tree (its config.properties included); every model answers as in-process."""
    venv = exported.parent / "image-venv"
    python = venv / "bin" / "python"
    uv = [sys.executable, "-m", "uv"]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run(uv + ["venv", "--quiet", "-p", runtime_env.interpreter(version), str(venv)], check=True)
    requirements = exported / "predictor-image" / "requirements.txt"
    subprocess.run(uv + ["pip", "install", "--quiet", "--python", str(python), "-r", str(requirements)], check=True)
    port, grpc_port = server.free_port(), server.free_port()
    home = short_tmp("ki-")
    with open(home / engines.ENGINE_OUT, "wb") as out:
        process = subprocess.Popen(
            image_command(exported, python, port, grpc_port),
            cwd=exported / "predictor-image",
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
    address = f"http://127.0.0.1:{port}"
    srv = server.Server(process.pid, str(home), address, address, address, list(REQUESTS), engine="kserve")
    try:
        ENGINE.wait_ready(srv, 300, process)
        for model in REQUESTS:
            for (status, body), (_, want) in zip(served(srv, model), in_process[model]):
                assert status == 200, (model, body)
                assert_close(body, want)
    finally:
        ENGINE.stop(srv)


# ---- TsctlRuntime.wait_ready, against stand-ins ------------------------------------------------------------
WORKER_OUTPUT = """\
ValueError: an earlier line of the engine's own
2026-01-01 00:00:00,000 INFO tsctl.worker: [m 1.0 w0] handlers.loading.ModelLoadError: m.pt is not weights
2026-01-01 00:00:00,000 INFO tsctl.worker: [m 1.0 w0] RuntimeError: 500 - Unknown exception
tsctl engine: model m 1.0 (m.mar) could not load: 500 Unknown exception
"""


def test_wait_ready_fails_at_once_with_the_engines_last_word(tmp_path):
    """The engine's fatal line, and the worker's own error when that line does not carry it (TorchServe's
    re-raise is not the cause)."""
    script = f"import sys; sys.stdout.write({WORKER_OUTPUT!r}); sys.exit(1)"
    with open(tmp_path / engines.ENGINE_OUT, "wb") as out:
        process = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=subprocess.STDOUT)
    address = f"http://127.0.0.1:{server.free_port()}"
    srv = server.Server(process.pid, str(tmp_path), address, address, address, ["m"], engine="kserve")
    with pytest.raises(server.ServerFailure) as caught:
        ENGINE.wait_ready(srv, 60, process)
    assert str(caught.value) == (
        "the tsctl engine exited with code 1: model m 1.0 (m.mar) could not load: 500 Unknown exception "
        "(the worker's last error: handlers.loading.ModelLoadError: m.pt is not weights)"
    )


def test_wait_ready_names_the_models_not_ready_on_timeout(tmp_path):
    """/v2/health/ready stays 503: after the timeout, the models whose /v2/models/NAME/ready is not 200."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/v2/models/up/ready" else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with stand_in_http(Handler) as address:
        srv = server.Server(os.getpgid(0), str(tmp_path), address, address, address, ["up", "down", "slow"], "kserve")
        said = r"^models down, slow not ready, no progress for 1s: no error in the output"
        with pytest.raises(server.ServerFailure, match=said):
            ENGINE.wait_ready(srv, 1)


def test_wait_ready_waits_while_the_engine_makes_progress(tmp_path):
    """A slow start is not a hang: with a 1 s timeout, models that become ready after 4 s while the engine
    writes to its output are waited for (on a busy machine workers take that long); above, an engine that
    says nothing is given up on after 1 s."""
    import http.server
    import threading
    import time

    from archiver.engines.tsctl import ENGINE_OUT

    ready_at = time.monotonic() + 4

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if time.monotonic() > ready_at else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

    done = threading.Event()

    def log_lines():
        with open(tmp_path / ENGINE_OUT, "a") as out:
            while not done.wait(0.3):
                out.write("worker: still loading\n")
                out.flush()

    writer = threading.Thread(target=log_lines, daemon=True)
    writer.start()
    try:
        with stand_in_http(Handler) as address:
            srv = server.Server(os.getpgid(0), str(tmp_path), address, address, address, ["slow"], "kserve")
            started = time.monotonic()
            ENGINE.wait_ready(srv, 1)
            assert time.monotonic() - started > 3.5
    finally:
        done.set()
        writer.join()
