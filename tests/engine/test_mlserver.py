"""MLServer as an engine (``tsctl serve --engine mlserver``): the real MLServer 1.7.1 (in a venv of its own,
samples/runtime_env.py) serving one store of every toolkit handler kind, pytorch/serve's mnist example and
handlers that are not the toolkit's (xgboost_classfication's stand-in, a probe) packaged by both tools,
through serving/runtimes/mlserver_runtime.py, driven by clients nobody here wrote (tritonclient's HTTP and gRPC).

- every answer equals the archive's answer in-process (LocalModel, the same v2 request);
- a handler that is not the toolkit's receives what TorchServe's worker gives it for each file sent as
  ``tsctl predict --content-type`` sends it (bytes, a str, the decoded JSON), and over gRPC bytes; its
  archive answers the same v2 response whichever tool built it (one BYTES ``output-0`` of each answer's
  JSON, as tritonclient reads it);
- a bad request in a batch fails alone: its own 4xx and message, its neighbours their right answers, in
  the same batch (MLServer's adaptive batcher would fail them all);
- the hostile image corpus, each attack as a client would send it over the Open Inference Protocol
  (base64 in a BYTES tensor) beside good neighbours, the worker under a memory limit: no worker restarts;
- the CLI's serve / predict / verify / bench / stop work on it; a model that cannot load makes serve fail
  fast with the handler's own error;
- an A/B experiment as ``tsctl export seldon --ab`` writes it, routed by a small router in the test as
  Seldon Core 2 routes one (a candidate drawn by weight, ``x-seldon-route`` naming it): the split over
  1,000 requests is within sampling error and every answer is the in-process answer of the model that
  served it;
- the export's model folders, served as Seldon's agent hands them to MLServer, run its pipeline (the
  transformer's preprocessing, the tensor model, its postprocessing) to the archive's own answers.

``make matrix`` runs them all (one MLServer for the parity, tritonclient, mnist, decoding, answer-shape,
metrics and bad-request tests); ``make test`` runs the missing-MLServer line here, and MLServer's smoke path
is tests/engine/test_gpu_placement.py's (the real MLServer and tsctl's runtime serving three archives:
their placement, their answers, one family each in /metrics)."""

import base64
import concurrent.futures
import dataclasses
import json
import math
import random
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from click.testing import CliRunner

from archiver import engines, golden, mar, server
from archiver.cli import main
from handlers import archives, protocol
from handlers import golden as golden_format
from handlers.errors import error_message
from helpers import grpc_client
from helpers.cgroups import MemoryLimit, peak_rss
from helpers.hostile import assert_close
from helpers.models import package_resnet, package_text
from helpers.paths import short_tmp
from helpers.servers import batch_lines, post_mixed_concurrently
from helpers.v2_answers import ask_v2
from samples import hostile, runtime_env, text_models, ts_examples, ts_probes
from samples.image_model import sample_jpeg
from serving.local_model import LocalModel, RequestInput

ENGINE = engines.ENGINES["mlserver"]
# startupTimeout: nine models' workers load at once, a loaded machine's two cores take more than TorchServe's
# 120 s (issue #42: the suite passes beside a second copy of itself)
BATCHING = "batchSize: 8\nmaxBatchDelay: 200\nstartupTimeout: 600\n"
TEXTS = ["The cat sits on the mat.", "Ünïcödé, emoji 🙂 and a rather longer sentence about nothing much", "short"]
JPEGS = [sample_jpeg(seed, (320 + 32 * seed, 240)) for seed in range(3)]
PIXELS = np.random.default_rng(1).standard_normal((2, 3, 224, 224)).astype(np.float32)


MNIST_INPUTS = []  # the mnist example's requests, set by the store fixture
EXAMPLES = {}  # name: ts_examples.Example of the handlers that are not the toolkit's, set by the store fixture


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def mlserver_python():
    return str(runtime_env.ensure_mlserver())


@pytest.fixture(scope="module")
def store(image_sample, text_samples, tmp_path_factory):
    root = tmp_path_factory.mktemp("mlserver")
    store = root / "model-store"
    package_resnet(image_sample, store, config_text=BATCHING)
    tensor = root / "tensor.yaml"
    tensor.write_text(BATCHING + "handler:\n  input_shape: [3, 224, 224]\n")
    package_resnet(image_sample, store, name="resnet18-t", handler="tensor", config_file=str(tensor), extra_files=[])
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier", BATCHING)
    package_text(text_samples, store, "tagger", "token_classifier", "tagger", BATCHING)
    package_text(text_samples, store, "minilm", "text_embedder", "minilm", BATCHING)
    # A/B: a second classifier, other weights, the same labels
    other = text_models.small_bert("BertForSequenceClassification", text_models.SENTIMENT, root / "classifier-b", 7)
    package_text(other.parent, store, "sentiment-b", "text_classifier", "classifier-b", BATCHING)
    # pytorch/serve's mnist example (its own files with TSCTL_PYTORCH_SERVE, else the stand-in): a BaseHandler
    example = ts_examples.build_mnist(root / "mnist", ts_examples.checkout())
    ts_examples.package(example, "torch-model-archiver", store)
    MNIST_INPUTS[:] = example.inputs
    # handlers that are not the toolkit's, packaged by both tools: pytorch/serve's xgboost example (its
    # stand-in: it reads CSV bytes) and a probe answering what it received
    # (model names Kubernetes takes: the Seldon tests export this store)
    for example in (ts_probes.build_xgboost(root / "xgboost", None), ts_probes.build_body_probe(root / "probe")):
        example = dataclasses.replace(example, name=example.name.replace("_", "-"))
        EXAMPLES[example.name] = example
        ts_examples.package(example, "torch-model-archiver", store)
        ts_examples.package(dataclasses.replace(example, name=f"{example.name}-tsctl"), "tsctl", store)
    return store


@pytest.fixture(scope="module")
def srv(store, mlserver_python):
    running = ENGINE.start(store, home=short_tmp("ml-"), timeout=300, python=mlserver_python)
    running.store = store
    yield running
    ENGINE.stop(running)


def v2(tensors) -> bytes:
    return json.dumps({"inputs": tensors}).encode()


def bytes_tensor(items) -> dict:
    return {"name": "input-0", "shape": [len(items)], "datatype": "BYTES", "data": list(items)}


REQUESTS = {  # model: v2 JSON bodies
    "resnet18": [v2([bytes_tensor([b64(JPEGS[0])])]), v2([bytes_tensor([b64(j) for j in JPEGS[1:]])])],
    "resnet18-t": [
        v2([{"name": "input-0", "shape": [2, 3, 224, 224], "datatype": "FP32", "data": PIXELS.reshape(-1).tolist()}])
    ],
    "sentiment": [v2([bytes_tensor(TEXTS)])],
    "tagger": [v2([bytes_tensor(TEXTS[:2])])],
    "minilm": [v2([bytes_tensor(TEXTS)])],
}


def in_process(store: Path, model: str, bodies, content_type="application/json"):
    with LocalModel(store / f"{model}.mar", decode_input_request=False) as local:
        answers = local.predict_rows([{"body": b} for b in bodies], [{"Content-Type": content_type}] * len(bodies))
    return [(r.status, r.json()) for r in answers]


def outputs(body) -> list:
    """Each output's name, datatype and shape, then the answers it holds (BYTES elements read as JSON,
    numbers as numbers): what must match, to rounding."""
    described = [(o["name"], o["datatype"], o["shape"]) for o in body["outputs"]]
    return [described, [protocol.jsonable(answer) for answer in protocol.decode_answers(body)]]


@pytest.mark.matrix
def test_every_kind_answers_as_in_process(srv, store):
    for model, bodies in REQUESTS.items():
        want = in_process(store, model, bodies)
        got = [
            server.request(engines.predict_url(srv, model), body, "POST", {"Content-Type": "application/json"}, 120)
            for body in bodies
        ]
        for (status, body), (want_status, want_body) in zip(got, want):
            assert (status, want_status) == (200, 200), (model, body, want_body)
            assert body["model_name"] == model and body["model_version"] == "1.0"
            assert_close(outputs(body), outputs(want_body))
    print({model: len(bodies) for model, bodies in REQUESTS.items()}, "requests, each as in-process")


@pytest.mark.matrix
def test_metrics_of_every_model_are_one_family_each(srv, store):
    """After requests to several models, MLServer's /metrics holds each worker family once, with a series
    for each model: one collector for the process, though MLServer reloads the runtime's module for every
    model it loads (a collector a model gave each family once per model, an exposition Prometheus refuses)."""
    from prometheus_client.parser import text_string_to_metric_families

    for model in ("sentiment", "minilm"):
        status, _ = server.request(
            engines.predict_url(srv, model), REQUESTS[model][0], "POST", {"Content-Type": "application/json"}, 120
        )
        assert status == 200
    time.sleep(1)  # the last request's metric lines read
    status, text = server.request(srv.metrics_url, timeout=30)
    assert status == 200
    names = [line.split(" ")[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    served = {sample.labels.get("ModelName") for sample in families["HandlerTime"].samples}
    assert {"sentiment", "minilm"} <= served, served


@pytest.mark.matrix
def test_tritonclient_http_and_grpc(srv, store):
    """tritonclient's HTTP client (JSON: MLServer reads no binary extension) and its gRPC client, both
    ways it sends BYTES (raw_input_contents, contents.bytes_contents), get the in-process answer."""
    [(_, want)] = in_process(store, "sentiment", REQUESTS["sentiment"])
    want_answers = [json.loads(a) for a in want["outputs"][0]["data"]]
    client = triton.InferenceServerClient(srv.inference.split("//")[1], network_timeout=120)
    assert client.is_server_ready() and client.is_model_ready("sentiment")
    texts = triton.InferInput("input-0", [len(TEXTS)], "BYTES")
    texts.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_), binary_data=False)
    result = client.infer("sentiment", [texts], outputs=[triton.InferRequestedOutput("output-0", binary_data=False)])
    assert_close([json.loads(a) for a in result.as_numpy("output-0")], want_answers)

    pixels = triton.InferInput("input-0", list(PIXELS.shape), "FP32")
    pixels.set_data_from_numpy(PIXELS, binary_data=False)
    logits = client.infer("resnet18-t", [pixels]).as_numpy("output-0")
    [(_, want_t)] = in_process(store, "resnet18-t", REQUESTS["resnet18-t"])
    assert_close(logits.reshape(-1).tolist(), want_t["outputs"][0]["data"])

    for contents in (False, True):
        answer = grpc_client.call(srv.grpc, "sentiment", [t.encode() for t in TEXTS], contents=contents)
        assert answer["server_ready"] and answer["model_ready"]
        assert_close([json.loads(a) for a in answer["answers"]], want_answers)


@pytest.mark.matrix  # the srv fixture's nine models: MLServer's whole suite is make matrix's (docs/tests.md)
def test_model_metadata_is_what_the_archive_declares(srv, store):
    """MLServer answers GET /v2/models/NAME from the model-settings.json; where it declares no tensors, the
    runtime gives the archive's (serving/v2_metadata.py: the tensor handler's record), as the engine does;
    a handler declaring nothing (mnist) has none."""
    from handlers import identity
    from handlers.archives import Archive
    from serving import v2_metadata

    client = triton.InferenceServerClient(srv.inference.split("//")[1], network_timeout=60)
    for name in ("resnet18-t", "mnist"):
        with Archive(store / f"{name}.mar") as archive:
            want = v2_metadata.declared(archive.config, identity.read(archive), name) or {"inputs": [], "outputs": []}
        got = client.get_model_metadata(name)
        assert {side: got.get(side, []) for side in ("inputs", "outputs")} == want, name
    assert want == {"inputs": [], "outputs": []} and got["name"] == "mnist"


@pytest.mark.matrix
def test_mnist_example_gets_what_torchserve_hands_it(srv, store):
    """pytorch/serve's mnist (a BaseHandler subclass, packaged by torch-model-archiver) answers as
    in-process: each PNG sent as ``tsctl predict`` sends it (base64, content_type image/png: the handler
    gets the bytes) and as a KServe v2 client sends an image (base64 with no content_type: a str, which
    its VisionHandler decodes), the answers one BYTES output-0 of each digit's JSON."""
    bodies = [ENGINE.request_body(png, kind)[0] for png, kind in MNIST_INPUTS]
    bodies += [v2([bytes_tensor([b64(png)])]) for png, _ in MNIST_INPUTS]
    got = post_mixed_concurrently(srv, "/v2/models/mnist/infer", [(b, "application/json") for b in bodies])
    with LocalModel(store / "mnist.mar") as local:
        want = [local.predict([RequestInput(png, {"Content-Type": kind})])[0].json() for png, kind in MNIST_INPUTS]
    for (status, body), expected in zip(got, want * 2):
        assert status == 200, body
        assert [(o["name"], o["datatype"], o["shape"]) for o in body["outputs"]] == [("output-0", "BYTES", [1])]
        assert json.loads(body["outputs"][0]["data"][0]) == expected
    print("mnist digits:", want)


def answers_of(srv, model: str, inputs) -> list:
    """Each (body, Content-Type) sent to ``model`` as ``tsctl predict --content-type`` sends it: (status,
    the output-0 element read as JSON, or the error)."""
    return [ask_v2(srv, model, body, kind, 60) for body, kind in inputs]


@pytest.mark.matrix
def test_a_handler_gets_what_torchserves_worker_gives_it(srv, store):
    """Issue #31's xgboost_classfication: a handler that is not the toolkit's receives, for each file sent
    with a Content-Type, what TorchServe's worker (in-process) gives it for that body and type: bytes, a str,
    the decoded JSON. The CSV sent without a type (the example's ``curl -T``) or as bytes is classified;
    as text/plain it reaches the handler as a str, and fails alike everywhere. Over gRPC, elements of bytes
    are bytes."""
    for name, example in EXAMPLES.items():
        with LocalModel(store / f"{name}.mar") as local:
            want = [local.predict([RequestInput(b, {"Content-Type": k} if k else {})])[0] for b, k in example.inputs]
        want = [(r.status, r.answer() if r.status == 200 else error_message(r.body)) for r in want]
        assert answers_of(srv, name, example.inputs) == want, name
        assert answers_of(srv, f"{name}-tsctl", example.inputs) == want, name
    labels = [status == 200 and answer for status, answer in answers_of(srv, "xgboost", EXAMPLES["xgboost"].inputs)]
    assert labels == ["versicolor", "setosa", "virginica", False, False], labels
    rows = list(ts_probes.IRIS_ROWS.values())
    for model in ("xgboost", "xgboost-tsctl"):
        for contents in (False, True):
            answer = grpc_client.call(srv.grpc, model, rows, contents=contents)
            assert [json.loads(a) for a in answer["answers"]] == list(ts_probes.IRIS_ROWS), (model, contents)


@pytest.mark.matrix
def test_one_answer_shape_whichever_tool_built_the_archive(srv):
    """Issue #31: the same handler packaged by tsctl and by torch-model-archiver answers the same v2
    response, the shape the toolkit's handlers answer in: one BYTES output ``output-0`` of shape [N]
    holding each answer's JSON, which tritonclient reads as ``json.loads(result.as_numpy("output-0")[i])``."""
    client = triton.InferenceServerClient(srv.inference.split("//")[1], network_timeout=120)
    texts = ["hello", '{"a": 1}']
    read = {}
    for model in ("body-probe", "body-probe-tsctl"):
        tensor = triton.InferInput("input-0", [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary_data=False)
        result = client.infer(model, [tensor])
        response = result.get_response()
        read[model] = [json.loads(element) for element in result.as_numpy("output-0")]
        assert [(o["name"], o["datatype"], o["shape"]) for o in response["outputs"]] == [("output-0", "BYTES", [2])]
    assert (
        read["body-probe"]
        == read["body-probe-tsctl"]
        == [
            {"keys": ["body"], "type": "str", "value": text}
            for text in texts  # no content_type: text, a str
        ]
    )
    request = ENGINE.request_body(ts_probes.IRIS_ROWS["setosa"], "application/octet-stream")[0]
    outputs = [
        server.request(engines.predict_url(srv, model), request, "POST", {"Content-Type": "application/json"}, 60)[1][
            "outputs"
        ]
        for model in ("xgboost", "xgboost-tsctl")
    ]
    assert outputs[0] == outputs[1] == [{"name": "output-0", "shape": [1], "datatype": "BYTES", "data": ['"setosa"']}]


@pytest.mark.matrix
def test_verify_served_sends_each_golden_file_as_predict_does(srv, tmp_path):
    """``tsctl verify --served`` of a handler that is not the toolkit's: each golden file goes as ``tsctl
    predict --content-type`` sends it (one BYTES element, the recorded type its ``content_type``), so MLServer
    hands the handler what TorchServe's worker gave it when the answers were recorded: the bytes, a str,
    the decoded JSON (sent as before, base64 elements without a type, they reached it as strs and the
    replay failed). About 3 s."""
    golden_dir = tmp_path / "golden"
    golden_dir.mkdir()
    inputs = {
        "row.bin": ts_probes.IRIS_ROWS["setosa"],
        "row.txt": b"a,b\n1,2\n",
        "doc.json": b'{"a": [1, 2.5]}',
        "digit.png": EXAMPLES["body-probe"].inputs[8][0],
    }
    for name, data in inputs.items():
        (golden_dir / name).write_bytes(data)
    flags = EXAMPLES["body-probe"].flags("tsctl") + ["--export-path", str(tmp_path), "--golden", str(golden_dir)]
    done = CliRunner().invoke(main, ["package", *flags])
    assert done.exit_code == 0, done.output
    archive = tmp_path / "body-probe.mar"
    with archives.opened(archive) as found:
        recorded = {case["name"]: case["answer"]["type"] for case in golden_format.read(found)["cases"]}
    assert recorded == {"row.bin": "bytearray", "row.txt": "str", "doc.json": "dict", "digit.png": "bytearray"}
    done = CliRunner().invoke(main, ["verify", str(archive), "--served", "--home", srv.home, "--json"])
    report = json.loads(done.stdout)
    assert done.exit_code == 0 and report["checked"] == 4 and not report["problems"], done.output
    assert report["where"] == f"{srv.inference} (v2)", report


@pytest.mark.matrix
def test_a_bad_request_fails_alone_in_its_batch(srv, store):
    good = REQUESTS["sentiment"][0]
    bad = [
        (v2([bytes_tensor([{"not": "text"}])]), 400),  # an element that is not a string
        (v2([bytes_tensor(["x" * 200_000])]), 413),  # above handler.max_text_chars
        (v2([{"name": "input-0", "shape": [1], "datatype": "FP32", "data": [1.5]}]), 400),  # not text
    ]
    [(_, want)] = in_process(store, "sentiment", [good])
    bodies = [(good, "application/json")] * 4 + [(body, "application/json") for body, _ in bad]
    mixed = False
    for _ in range(5):  # on a loaded machine the requests may reach the worker one batch each: send again
        before = len(batch_lines(srv))
        results = post_mixed_concurrently(srv, "/v2/models/sentiment/infer", bodies)
        for status, body in results[:4]:
            assert status == 200, body
            assert_close(outputs(body), outputs(want))
        for (status, body), (_, expected) in zip(results[4:], bad):
            assert status in (400, 413, 422), body
            assert isinstance(body, dict) and body.get("error"), body
        deadline = time.monotonic() + 10  # the log line is written after the answers
        while not mixed and time.monotonic() < deadline:
            lines = batch_lines(srv)[before:]
            mixed = any(line["rejected"] and line["size"] > line["rejected"] for line in lines)
            time.sleep(0.2)
        if mixed:
            break
    assert mixed, batch_lines(srv)[-20:]  # a bad request shared a batch with good ones, which all answered
    # an id MLServer would echo into its headers, and a header describing a body the handler never sees
    url = engines.predict_url(srv, "sentiment")
    status, body = server.request(
        url, json.dumps({"id": "a\nb", **json.loads(good)}).encode(), "POST", {"Content-Type": "application/json"}, 60
    )
    assert status == 400 and "id" in body["error"], body
    headers = {"Content-Type": "application/json", "Inference-Header-Content-Length": "10"}
    status, body = server.request(engines.predict_url(srv, "sentiment"), good, "POST", headers, 60)
    assert status == 200, body


@pytest.mark.matrix
def test_no_client_can_unload_a_model_and_bodies_are_bounded(srv, store):
    """tsctl starts MLServer through serving/runtimes/mlserver_start.py: its repository's load and unload calls are
    gone over REST and refused over gRPC, the model still answers, a body above the limit gets 413 before
    MLServer parses it."""
    before = worker_pids(srv)
    for action in ("unload", "load"):
        status, body = server.request(
            f"{srv.inference}/v2/repository/models/resnet18/{action}", b"", "POST", timeout=30
        )
        assert status in (403, 404), (action, status, body)
    got = grpc_client.call(srv.grpc, "resnet18", unload=True)
    assert got["unload_error"] and "load and unload calls are off" in got["unload_error"], got
    assert got["ready_after"], got
    assert ENGINE.list_models(srv) and "resnet18" in ENGINE.list_models(srv)  # the read-only index stays
    [(_, want)] = in_process(store, "resnet18", [REQUESTS["resnet18"][0]])
    status, body = server.request(
        engines.predict_url(srv, "resnet18"), REQUESTS["resnet18"][0], "POST", {"Content-Type": "application/json"}, 60
    )
    assert status == 200, body
    assert_close(outputs(body), outputs(want))
    huge = v2([bytes_tensor(["x" * (8 << 20)])])
    status, body = server.request(
        engines.predict_url(srv, "resnet18"), huge, "POST", {"Content-Type": "application/json"}, 60
    )
    assert status == 413 and "max_request_size" in body["message"], (status, body)
    assert worker_pids(srv) == before


def worker_pids(srv) -> list:
    """The TorchServe worker processes under MLServer: its descendants running in an unpacked archive (forked
    from its fork server, they carry the fork server's command line, not model_service_worker.py's)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue

    def under(pid: int) -> bool:
        while pid in parents and pid != srv.pid:
            pid = parents[pid]
        return pid == srv.pid

    def in_archive(pid: int) -> bool:
        try:
            return (Path(f"/proc/{pid}/cwd").resolve() / "MAR-INF" / "MANIFEST.json").is_file()
        except OSError:
            return False

    return sorted(pid for pid in parents if pid != srv.pid and under(pid) and in_archive(pid))


def model_of(pid: int) -> str:
    """The model a worker serves: the manifest of the unpacked archive it runs in."""
    manifest = Path(f"/proc/{pid}/cwd").resolve() / "MAR-INF" / "MANIFEST.json"
    return json.loads(manifest.read_text())["model"]["modelName"]


@pytest.mark.matrix
def test_hostile_image_corpus_as_v2(srv, store):
    """Every attack of the image corpus as an Open Inference Protocol client sends a file (base64 in a
    BYTES tensor), four at a time beside four good requests, the resnet18 worker in a 3 GiB limit."""
    good = sample_jpeg(5, (640, 480))
    good_body = v2([bytes_tensor([b64(good)])])
    [(_, want)] = in_process(store, "resnet18", [good_body])
    pids = worker_pids(srv)
    resnet = [pid for pid in pids if model_of(pid) == "resnet18"]
    assert len(resnet) == 1, resnet
    limit = MemoryLimit(resnet[0], 3 << 30)
    problems = []
    cases = hostile.image_corpus(good)
    try:
        for start in range(0, len(cases), 4):
            group = cases[start : start + 4]
            bodies = [(good_body, "application/json")] * 4
            bodies += [(v2([bytes_tensor([b64(case.body)])]), "application/json") for case in group]
            results = post_mixed_concurrently(srv, "/v2/models/resnet18/infer", bodies)
            for status, body in results[:4]:
                if status != 200:
                    problems.append(f"a good neighbour got {status}: {body}")
                else:
                    assert_close(outputs(body), outputs(want))
            for case, (status, body) in zip(group, results[4:]):
                if not (status == 200 or 400 <= status < 500):
                    problems.append(f"{case.name}: {status} {str(body)[:200]}")
                elif status != 200 and not (isinstance(body, dict) and body.get("error")):
                    problems.append(f"{case.name}: {status} without an error body: {str(body)[:200]}")
        peak = peak_rss(resnet[0])
    finally:
        limit.release()
    assert not problems, "\n".join(problems)
    assert worker_pids(srv) == pids, "a worker restarted"
    print(f"{len(cases)} attacks under {limit.kind}, worker {resnet[0]} peak RSS {peak / 1e9:.2f} GB")
    assert peak < 2_000_000_000


@pytest.mark.matrix
def test_cli_serve_predict_verify_bench_stop(store, mlserver_python, image_sample, tmp_path):
    """The CLI on the engine, as a user runs it: serve --engine mlserver --python, predict a JPEG (sent
    as a v2 request), verify golden answers over v2, bench, stop."""
    home = short_tmp("mc-")
    solo = tmp_path / "model-store"
    solo.mkdir()
    inputs = tmp_path / "golden-inputs"
    inputs.mkdir()
    (inputs / "kitten.jpg").write_bytes((image_sample / "kitten.jpg").read_bytes())
    options = mar.PackageOptions(
        model_name="resnet18",
        handler="image_classifier",
        serialized_file=str(image_sample / "resnet18.pt"),
        model_file=str(image_sample / "model.py"),
        extra_files=[str(image_sample / "index_to_name.json")],
        export_path=str(solo),
    )
    archive, _, _ = golden.package(options, str(inputs))
    runner = CliRunner()
    common = ["--home", str(home)]
    try:
        done = runner.invoke(
            main,
            [
                "serve",
                "--engine",
                "mlserver",
                "--python",
                mlserver_python,
                "--model-store",
                str(solo),
                "--timeout",
                "300",
                *common,
            ],
        )
        assert done.exit_code == 0, done.output
        assert "MLServer ready" in done.output and "grpc" in done.output
        done = runner.invoke(main, ["predict", "resnet18", str(image_sample / "kitten.jpg"), *common])
        assert done.exit_code == 0, done.output
        assert '"outputs"' in done.output and "class_" in done.output
        srv = server.read_state(home)
        report = golden.verify(str(archive), srv.inference, "v2", 1e-4, None, 60, None)
        assert report.checked >= 1 and not report.problems, report.problems
        done = runner.invoke(main, ["verify", str(archive), "--served", *common])  # MLServer's own protocol: v2
        assert done.exit_code == 0, done.output
        assert done.stdout.strip() == f"1 of 1 golden answers match ({srv.inference} (v2))", done.output
        done = runner.invoke(
            main,
            [
                "bench",
                "resnet18",
                "--input",
                str(image_sample / "kitten.jpg"),
                "--requests",
                "16",
                "--concurrency",
                "4",
                "--json",
                *common,
            ],
        )
        assert done.exit_code == 0, done.output
        summary = json.loads(done.output)
        assert summary["requests"] == 16 and summary["errors"] == 0
    finally:
        done = runner.invoke(main, ["stop", *common])
    assert done.exit_code == 0 and "MLServer stopped" in done.output, done.output


@pytest.mark.matrix
def test_serve_fails_fast_with_the_handlers_error(image_sample, mlserver_python, tmp_path):
    store = tmp_path / "model-store"
    package_resnet(image_sample, store)
    broken = tmp_path / "broken"
    broken.mkdir()
    # the same archive, its weights replaced by bytes torch cannot read
    with zipfile.ZipFile(store / "resnet18.mar") as source, zipfile.ZipFile(broken / "resnet18.mar", "w") as out:
        for item in source.infolist():
            data = source.read(item)
            out.writestr(item, b"not weights" if item.filename.endswith(".pt") else data)
    home = short_tmp("mf-")
    with pytest.raises(Exception) as failed:
        ENGINE.start(broken, home=home, timeout=300, python=mlserver_python)
    message = str(failed.value)
    assert "MLServer stopped" in message or "MLServer exited" in message, message
    assert "Error" in message, message
    assert server.read_state(home) is None


@pytest.mark.matrix
def test_a_stateful_archive_is_refused_at_load_in_one_line(mlserver_python, tmp_path):
    """MLServer's V2 requests carry no sequence id: a sequenceBatching archive (pytorch/serve's stateful example)
    is refused at load, naming the key and the fix, not served with its sequences mixed."""
    from samples import ts_stateful

    store = tmp_path / "model-store"
    ts_stateful.build(store, idle_ms=5000)
    home = short_tmp("mseq-")
    with pytest.raises(Exception) as failed:
        ENGINE.start(store, home=home, timeout=300, python=mlserver_python)
    message = str(failed.value)
    assert "sequenceBatching is true: MLServer gives its requests no sequence id" in message, message
    assert "SequenceConfigError" not in message and "code 0" not in message, message  # one sentence, no class
    assert server.read_state(home) is None


@pytest.mark.matrix
def test_ab_split_as_seldon_routes_it(srv, store, tmp_path):
    """``tsctl export seldon --ab sentiment=90 --ab sentiment-b=10``'s Experiment, routed as Seldon Core 2
    does: each request to a candidate drawn by weight. 1,000 requests: the share of each is within 4
    standard deviations of its weight, and each answer is the in-process answer of the model that
    served it (the two models answer differently)."""
    import yaml

    from archiver.export.seldon import export as seldon

    out = tmp_path / "seldon"
    seldon.export(
        seldon.SeldonOptions(
            out=str(out),
            model_store=str(store),
            image="registry.example/tsctl:1",
            ab=[("sentiment", 90), ("sentiment-b", 10)],
        )
    )
    experiment = yaml.safe_load((out / "experiment.yaml").read_text())
    candidates = [(c["name"], c["weight"]) for c in experiment["spec"]["candidates"]]
    assert candidates == [("sentiment", 90), ("sentiment-b", 10)]
    names, weights = zip(*candidates)
    texts = [f"request number {i}: {'good' if i % 3 else 'bad'} news" for i in range(40)]
    want = {}
    for name in names:
        bodies = [v2([bytes_tensor([t])]) for t in texts]
        want[name] = [outputs(body) for _, body in in_process(store, name, bodies)]
    assert want[names[0]] != want[names[1]], "the two models must answer differently for the test to see who served"
    headers = {"Content-Type": "application/json", "seldon-model": f"{experiment['metadata']['name']}.experiment"}
    rng = random.Random(22)
    routes = [rng.choices(names, weights)[0] for _ in range(1000)]  # Seldon's experiment: a candidate by weight

    def send(i: int):
        body = v2([bytes_tensor([texts[i % len(texts)]])])
        return server.request(engines.predict_url(srv, routes[i]), body, "POST", headers, 60)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(send, range(len(routes))))
    served = {name: 0 for name in names}
    for i, (route, (status, body)) in enumerate(zip(routes, answers)):
        assert status == 200, body
        assert body["model_name"] == route
        assert_close(outputs(body), want[route][i % len(texts)])
        served[route] += 1
    total = len(routes)
    share = weights[0] / sum(weights)
    sigma = math.sqrt(total * share * (1 - share))
    assert abs(served[names[0]] - total * share) < 4 * sigma, served
    print("A/B served:", served)


@pytest.mark.matrix
def test_the_seldon_export_serves_and_its_pipeline_answers_as_the_archive(store, mlserver_python, tmp_path):
    """``export seldon --transformer-archive resnet18.mar --transformer-model resnet18-t``'s model folders,
    served by MLServer as Seldon's agent hands them over (the folders as they are), and its Pipeline run
    step after step as Seldon runs one (each step's outputs the next one's inputs): preprocessing (the
    image archive's handler, no weights), the tensor model, postprocessing. Each JPEG's answer equals
    the whole image archive's answer in-process."""
    import shutil

    import yaml

    from archiver.export.seldon import export as seldon

    out = tmp_path / "seldon"
    seldon.export(
        seldon.SeldonOptions(
            out=str(out),
            model_store=str(store),
            image="registry.example/tsctl:1",
            transformer_archive=str(store / "resnet18.mar"),
            transformer_model="resnet18-t",
        )
    )
    pipeline = yaml.safe_load((out / "pipeline.yaml").read_text())
    steps = [step["name"] for step in pipeline["spec"]["steps"]]
    assert steps == ["resnet18-pre", "resnet18-t", "resnet18-post"]
    repository = tmp_path / "repository"
    repository.mkdir()
    for step in steps:
        shutil.copytree(out / "models" / step, repository / step)
    home = short_tmp("mp-")
    running = ENGINE.serve_repository(repository, steps, home, timeout=300, python=mlserver_python)
    resnet18_local = LocalModel(store / "resnet18.mar")  # one worker for every picture
    try:
        for jpeg in JPEGS:
            body = v2([bytes_tensor([b64(jpeg)])])
            for step in steps:  # Seldon's pipeline: a step's outputs are the next step's inputs
                status, answer = server.request(
                    engines.predict_url(running, step), body, "POST", {"Content-Type": "application/json"}, 120
                )
                assert status == 200, (step, answer)
                body = json.dumps({"inputs": answer["outputs"]}).encode()
            [want] = resnet18_local.predict([jpeg])
            assert_close([json.loads(a) for a in answer["outputs"][0]["data"]], [want.json()])
        url = engines.predict_url(running, steps[0])
        status, answer = server.request(
            url, v2([bytes_tensor(["not base64!"])]), "POST", {"Content-Type": "application/json"}, 60
        )
        assert status == 400 and "base64" in answer["error"], answer
        # what an attacker sent the transformer's steps (found by one): each its own 4xx, the bounds the handler's
        fp32 = {"name": "o", "datatype": "FP32"}
        refused = [
            (steps[2], v2([{**fp32, "shape": [17, 1000], "data": [0.0] * 17000}]), 413),  # rows > max_items
            (steps[2], v2([{**fp32, "shape": [16, 7000], "data": [0.0] * 112000}]), 413),  # > max_json_values
            (steps[2], v2([{**fp32, "shape": [1000], "data": [0.0] * 1000}]), 400),  # not one row per image
            (steps[2], v2([{**fp32, "shape": [1, 1000, 1], "data": [0.0] * 1000}]), 400),
            (steps[2], v2([{"name": "o", "shape": [1, 1000], "datatype": "INT64", "data": [2**70] * 1000}]), 400),
            (steps[2], v2([{**fp32, "shape": [1, 1000], "data": [0.0] * 10}]), 400),  # shape and data disagree
            (steps[0], v2([]), 400),
            (steps[0], v2([bytes_tensor([b64(JPEGS[0])]), bytes_tensor([b64(JPEGS[1])])]), 400),  # two inputs
            (steps[0], v2([{**bytes_tensor([b64(JPEGS[0])]), "shape": [1000]}]), 400),
        ]
        for step, body, want in refused:
            status, answer = server.request(
                engines.predict_url(running, step), body, "POST", {"Content-Type": "application/json"}, 60
            )
            assert status == want and answer.get("error"), (step, body[:100], status, answer)
    finally:
        resnet18_local.close()
        ENGINE.stop(running)


def test_mlserver_missing_is_one_line(image_sample, tmp_path):
    """A Python without MLServer (this one: kserve's environment) is one line naming the fix, before anything
    is written or started."""
    store, home = tmp_path / "model-store", tmp_path / "h"
    package_resnet(image_sample, store)
    for python in ([], ["--python", sys.executable], ["--python", str(tmp_path / "nowhere" / "python")]):
        done = CliRunner().invoke(
            main, ["serve", "--engine", "mlserver", *python, "--model-store", str(store), "--home", str(home)]
        )
        assert done.exit_code == 2, done.output
        assert "mlserver" in done.output and "--python" in done.output and "Traceback" not in done.output
    assert not home.exists()
