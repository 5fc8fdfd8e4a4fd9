"""Seldon Core 1's graph, as ``tsctl export seldon --core 1`` writes it, run here with the real wrapper: each unit
of the SeldonDeployment under ``seldon-core-microservice`` (seldon-core 1.17.1 in a venv of its own,
samples/runtime_env.py) with its container's env and typed parameters, and the graph walked as Core 1's
executor walks it (tests/helpers/seldon_graph.py: transform-input, route, the chosen child's predict,
transform-output, meta.routing injected).

- the transformer alone (make test reads the same messages in-process: test_seldon_messages.py): its
  transform-input is the handler's batch in-process, its transform-output the handler's answers; names and
  meta come back; a bad message is Seldon's error shape with its 4xx, alone, hostile bodies too;
- the A/B graph (RANDOM_ABTEST, ratioA 0.7) over 1,000 requests: the split is within 4 sigma of ratioA, and
  every answer equals the in-process answer (LocalModel) of the image archive with the weights of the model
  meta.routing names; bad messages among good ones fail alone;
- three candidates through tsctl's router component (weights 50/30/20): each answer the routed model's.
"""

import base64
import http.client
import json
import math
import random
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from archiver.export.seldon import core1
from helpers import seldon_graph
from helpers.hostile import assert_close
from helpers.models import package_resnet
from samples import image_model, runtime_env
from serving.local_model import LocalModel

TENSOR_CONFIG = "minWorkers: 1\nbatchSize: 4\nmaxBatchDelay: 10\nhandler:\n  input_shape: [3, 224, 224]\n"
JPEGS = [image_model.sample_jpeg(seed, (256 + 8 * seed, 224)) for seed in range(12)]
SEEDS = {"vision-a": 0, "vision-b": 1, "vision-c": 2}  # each model's weights (resnet18 of this seed)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def assert_same_answers(got: list, want: list):
    """The handler's answers, each a mapping of label to probability, key order aside: the wrapper's Flask
    and the executor (Go's json.Marshal of a map, when it injects meta.routing) write keys sorted."""
    assert isinstance(got, list) and len(got) == len(want)
    assert_close([dict(sorted(a.items())) for a in got], [dict(sorted(a.items())) for a in want])


@pytest.fixture(scope="module")
def seldon_python():
    return runtime_env.ensure_seldon()


@pytest.fixture(scope="module")
def store(image_sample, tmp_path_factory):
    """vision (the transformer: the image archive, seed 0), vision-a/b/c (tensor archives of seeds 0, 1, 2) and
    refs/vision-X (image archives of the same weights: the in-process answers)."""
    root = tmp_path_factory.mktemp("seldon1")
    (root / "tensor.yaml").write_text(TENSOR_CONFIG)
    package_resnet(image_sample, root / "transformer", name="vision")
    for name, seed in SEEDS.items():
        sample = image_sample
        if seed:
            sample = root / f"weights-{seed}"
            sample.mkdir()
            torch.save(image_model.resnet18(seed).state_dict(), sample / "resnet18.pt")
            for file in ("model.py", "index_to_name.json", "model-config.yaml"):
                (sample / file).write_bytes((image_sample / file).read_bytes())
        package_resnet(
            sample,
            root / "model-store",
            name=name,
            handler="tensor",
            config_file=str(root / "tensor.yaml"),
            extra_files=[],
        )
        package_resnet(sample, root / "refs", name=name)
    return root


def export(store: Path, out: Path, **options) -> dict:
    core1.export(
        core1.SeldonCore1Options(
            out=str(out),
            image="registry.example/tsctl-seldon:1",
            model_store=str(store / "model-store"),
            transformer_archive=str(store / "transformer" / "vision.mar"),
            **options,
        )
    )
    return yaml.safe_load((out / "seldondeployment.yaml").read_text())


def in_process(store: Path, names) -> dict:
    """{model: [its image archive's answer in-process for each JPEG]}."""
    answers = {}
    for name in names:
        with LocalModel(store / "refs" / f"{name}.mar") as local:
            answers[name] = [r.json() for r in local.predict(JPEGS)]
    return answers


@pytest.mark.matrix  # 12 s, and the seldon-core venv built first; make test reads the messages in-process
def test_the_transformer_under_the_real_wrapper(store, seldon_python, tmp_path):
    """The export's transformer unit alone under seldon-core-microservice."""
    from serving.runtimes import split

    out = tmp_path / "out"
    manifest = export(store, out, transformer_model="vision-a")
    graph = seldon_graph.start(manifest, out, seldon_python, tmp_path / "logs", only=["transformer"])
    url = f"http://127.0.0.1:{graph.units['transformer'].port}"
    handler = split.load_handler(store / "transformer" / "vision.mar")
    try:
        meta = {"puid": "abc", "tags": {"client": "test"}}
        body = {"data": {"names": ["photo"], "ndarray": [b64(JPEGS[0]), b64(JPEGS[1])]}, "meta": meta}
        status, answer = seldon_graph.post(f"{url}/transform-input", json.dumps(body).encode())
        assert status == 200, answer
        message = json.loads(answer)
        assert message["meta"] == meta and message["data"]["names"] == ["photo"]
        tensor = message["data"]["tensor"]
        from handlers import protocol
        from handlers.base import Job

        want = split.batch(handler, Job(protocol.Request([b64(JPEGS[0]), b64(JPEGS[1])], protocol.V2)))
        assert tensor["shape"] == [2, 3, 224, 224]
        assert np.array_equal(np.asarray(tensor["values"], dtype=np.float32).reshape(tensor["shape"]), want)
        for single in ({"binData": b64(JPEGS[2])}, {"strData": b64(JPEGS[2])}, {"jsonData": [{"b64": b64(JPEGS[2])}]}):
            status, answer = seldon_graph.post(f"{url}/transform-input", json.dumps(single).encode())
            assert status == 200 and json.loads(answer)["data"]["tensor"]["shape"] == [1, 3, 224, 224], answer
            assert json.loads(answer)["meta"] == {}
        logits = np.random.default_rng(3).standard_normal((2, 1000)).astype(np.float32)
        body = {"data": {"tensor": {"shape": [2, 1000], "values": logits.reshape(-1).tolist()}}, "meta": meta}
        status, answer = seldon_graph.post(f"{url}/transform-output", json.dumps(body).encode())
        assert status == 200, answer
        assert_same_answers(json.loads(answer)["data"]["ndarray"], split.answers(handler, logits))
        assert json.loads(answer)["meta"] == meta
        refused = [
            (b'{"binData": "not base64!"}', 400, "base64"),
            (b'{"data": {"tensor": {"shape": [1], "values": [1]}}}', 400, "holds numbers"),
            (b'{"binData": "", "strData": ""}', 400, "one of"),
            (json.dumps({"data": {"ndarray": [b64(JPEGS[0])] * 17}}).encode(), 413, "max_items"),
            (b"not json", 400, "JSON"),
        ]
        for bad, code, words in refused:
            status, answer = seldon_graph.post(f"{url}/transform-input", bad)
            error = json.loads(answer)
            assert status == code and set(error) == {"status"}, answer
            assert error["status"]["reason"] == "MICROSERVICE_BAD_DATA" and error["status"]["status"] == 1
            assert words in error["status"]["info"], answer
        assert_hostile_bodies_fail_alone(url, graph.units["transformer"].log)
    finally:
        graph.stop()
        handler.pool and handler.pool.shutdown()


def chunked_post(url: str, chunks) -> int:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request(
            "POST", parts.path, body=iter(chunks), headers={"Content-Type": "application/json"}, encode_chunked=True
        )
        return connection.getresponse().status
    except OSError:  # the unit closed a chunked body it refused as it came
        return 0
    finally:
        connection.close()


def assert_hostile_bodies_fail_alone(url: str, log: Path):
    """What the wrapper reads before the unit does: a body past max_body_bytes (32 MiB for the image handler)
    was read whole (500 MB took the worker past its memory: killed, reloaded), one it cannot parse was its 500;
    a multipart file binData, NaN: serving/runtimes/seldon_components.py. Each its own 4xx; the worker lives."""
    boots = log.read_text(errors="replace").count("Booting worker")
    jpeg = b64(JPEGS[0]).encode()
    multipart = (
        b'--B\r\nContent-Disposition: form-data; name="binData"; filename="a.jpg"\r\n\r\n'
        + JPEGS[0]
        + b'\r\n--B\r\nContent-Disposition: form-data; name="meta"\r\n\r\n{"m": 1}\r\n--B--\r\n'
    )
    deep = b'{"jsonData": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # past Python's recursion limit
    form = b"json=" + urllib.parse.quote(json.dumps({"binData": jpeg.decode()})).encode()
    bad_meta = b'--B\r\nContent-Disposition: form-data; name="meta"\r\n\r\nnot json\r\n--B--\r\n'
    cases = [
        ("/transform-input", b'{"binData": "' + b"A" * (40 << 20) + b'"}', "application/json", 413, "max_body_bytes"),
        ("/transform-input", deep, "application/json", 400, "not JSON"),
        ("/transform-input", b"json=%7Bnot", "application/x-www-form-urlencoded", 400, "not JSON"),
        ("/transform-input", bad_meta, "multipart/form-data; boundary=B", 400, "not JSON"),
        ("/transform-output", b'{"data": {"ndarray": [[1.0, NaN, Infinity]]}}', "application/json", 400, "NaN"),
        ("/transform-input", multipart, "multipart/form-data; boundary=B", 200, '"m":1'),
        ("/transform-input", form, "application/x-www-form-urlencoded", 200, "tensor"),
    ]
    for path, body, kind, code, words in cases:
        status, answer = seldon_graph.post(url + path, body, {"Content-Type": kind})
        assert status == code and words in answer.decode(), (path, kind, status, answer[:300])
        if code != 200:
            assert json.loads(answer)["status"]["reason"] == "MICROSERVICE_BAD_DATA", answer
    huge = [b'{"binData": "'] + [b"A" * (1 << 20)] * 40 + [b'"}']
    assert chunked_post(url + "/transform-input", huge) in (413, 0)
    assert chunked_post(url + "/transform-input", [b'{"binData": "', jpeg, b'"}']) == 200
    assert log.read_text(errors="replace").count("Booting worker") == boots, "the unit's worker was restarted"


def routed(answer: dict) -> str:
    return answer["meta"]["routing"]


def run_requests(executor, bodies, threads=4):
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda body: executor.predict(body), bodies))


@pytest.mark.matrix
def test_the_ab_graph_splits_by_ratio_and_answers_as_the_routed_model(store, seldon_python, tmp_path):
    out = tmp_path / "out"
    manifest = export(store, out, ab=[("vision-a", 70), ("vision-b", 30)])
    predictor = manifest["spec"]["predictors"][0]
    [router] = predictor["graph"]["children"]
    assert router["implementation"] == "RANDOM_ABTEST" and router["parameters"][0]["value"] == "0.7"
    children = [child["name"] for child in router["children"]]
    want = in_process(store, children)
    assert want[children[0]] != want[children[1]], "the models must answer differently for the test to see who served"
    injection = {e["name"]: e["value"] for e in predictor["svcOrchSpec"]["env"]}["SELDON_ENABLE_ROUTING_INJECTION"]
    graph = seldon_graph.start(manifest, out, seldon_python, tmp_path / "logs")
    try:
        executor = seldon_graph.Executor(predictor["graph"], graph.ports(), random.Random(34), injection == "true")
        total = 1000
        bodies = [
            json.dumps({"binData": b64(JPEGS[i % len(JPEGS)]), "meta": {"tags": {"i": i}}}).encode()
            for i in range(total)
        ]
        served = {name: 0 for name in children}
        for i, (status, body) in enumerate(run_requests(executor, bodies)):
            assert status == 200, body
            answer = json.loads(body)
            route = routed(answer)
            assert route["transformer"] == -1 and route[children[route["router"]]] == -1, route
            model = children[route["router"]]
            served[model] += 1
            assert answer["meta"]["tags"] == {"i": i}
            assert_same_answers(answer["data"]["ndarray"], [want[model][i % len(JPEGS)]])
        share = 0.7
        sigma = math.sqrt(total * share * (1 - share))
        print(f"A/B served: {served} (ratioA 0.7: {total * share:.0f} +- {sigma:.1f})")
        assert abs(served[children[0]] - total * share) < 4 * sigma, served
        # finite values the model overflows on: its output NaN, once answered as a 200 whose body was not JSON
        huge = {"data": {"tensor": {"shape": [1, 3, 224, 224], "values": [3e38] * (3 * 224 * 224)}}}
        status, body = seldon_graph.post(
            f"http://127.0.0.1:{graph.ports()[children[0]]}/predict", json.dumps(huge).encode()
        )
        assert status == 500 and "NaN or Infinity" in json.loads(body)["status"]["info"], body[:300]
        # bad messages among good ones: each its own Seldon error, its neighbours their answers
        mixed = [json.dumps({"binData": b64(JPEGS[i])}).encode() if i % 2 else b'{"binData": "%%%"}' for i in range(12)]
        for i, (status, body) in enumerate(run_requests(executor, mixed, threads=6)):
            if i % 2:
                assert status == 200, body
                answer = json.loads(body)
                assert_same_answers(answer["data"]["ndarray"], [want[children[routed(answer)["router"]]][i]])
            else:
                assert status == 400 and json.loads(body)["status"]["reason"] == "MICROSERVICE_BAD_DATA", body
    finally:
        graph.stop()


@pytest.mark.matrix
def test_three_candidates_go_through_the_tsctl_router(store, seldon_python, tmp_path):
    out = tmp_path / "out"
    manifest = export(store, out, ab=[("vision-a", 50), ("vision-b", 30), ("vision-c", 20)])
    predictor = manifest["spec"]["predictors"][0]
    [router] = predictor["graph"]["children"]
    assert router["type"] == "ROUTER" and router["parameters"] == [
        {"name": "weights", "value": "50,30,20", "type": "STRING"}
    ]
    children = [child["name"] for child in router["children"]]
    want = in_process(store, children)
    graph = seldon_graph.start(manifest, out, seldon_python, tmp_path / "logs")
    try:
        executor = seldon_graph.Executor(predictor["graph"], graph.ports(), random.Random(7), True)
        total = 300
        bodies = [json.dumps({"binData": b64(JPEGS[i % len(JPEGS)])}).encode() for i in range(total)]
        served = {name: 0 for name in children}
        for i, (status, body) in enumerate(run_requests(executor, bodies)):
            assert status == 200, body
            answer = json.loads(body)
            model = children[routed(answer)["router"]]
            served[model] += 1
            assert_same_answers(answer["data"]["ndarray"], [want[model][i % len(JPEGS)]])
        print("router served:", served)
        for name, weight in zip(children, (50, 30, 20)):
            share = weight / 100
            assert abs(served[name] - total * share) < 4 * math.sqrt(total * share * (1 - share)), served
    finally:
        graph.stop()
