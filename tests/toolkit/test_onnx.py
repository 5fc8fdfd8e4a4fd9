"""ONNX Runtime behind the toolkit handlers: the sample resnet18 and the real all-MiniLM-L6-v2 exported
with samples/onnx_export.py, packaged like their originals, answer as the originals do in-process and
served by TorchServe (top-k probabilities within 1e-4, embeddings at cosine >= 0.9999); the ONNX
archives ask for onnxruntime, the others do not; ``tsctl verify --golden-from`` replays the original's
golden answers against the export. The served comparison runs in ``make matrix``."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from archiver import golden as golden_answers
from archiver import mar
from archiver.cli import main
from handlers import golden as answers
from helpers import archive_reading
from helpers.hostile import assert_close
from helpers.models import package_resnet, package_text
from helpers.servers import RunningServer, post_concurrently
from samples import onnx_export
from serving.local_model import LocalModel

BATCHING = "batchSize: 4\nmaxBatchDelay: 100\n"
TEXTS = [b"The cat sits on the mat.", b"A man is playing a guitar on stage.", b"short", "Ünïcödé 🙂".encode()]


@pytest.fixture(scope="module")
def store(image_sample, text_samples, tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx")
    store = root / "model-store"
    onnx_file = root / "resnet18.onnx"
    assert onnx_export.export_image(image_sample, onnx_file) < 1e-4
    minilm_onnx = root / "minilm-onnx"
    assert onnx_export.export_text(text_samples / "minilm", minilm_onnx) < 1e-3
    classifier_onnx = root / "classifier-onnx"
    assert onnx_export.export_text(text_samples / "classifier", classifier_onnx) < 1e-4
    package_resnet(image_sample, store, config_text=BATCHING)
    tensor = root / "tensor.yaml"
    tensor.write_text(BATCHING + "handler:\n  input_shape: [3, 224, 224]\n")
    for name, weights in (("resnet18_t", None), ("resnet18_t_onnx", str(onnx_file))):
        extra = {"serialized_file": weights, "model_file": None} if weights else {}
        package_resnet(image_sample, store, name, handler="tensor", config_file=str(tensor), extra_files=[], **extra)
    package_resnet(image_sample, store, "resnet18_onnx", BATCHING, serialized_file=str(onnx_file), model_file=None)
    package_text(text_samples, store, "minilm", "text_embedder", "minilm", BATCHING)
    package_text(root, store, "minilm_onnx", "text_embedder", "minilm-onnx", BATCHING)
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier", BATCHING)
    package_text(root, store, "sentiment_onnx", "text_classifier", "classifier-onnx", BATCHING)
    assert onnx_export.export_text(text_samples / "tagger", root / "tagger-onnx") < 1e-4
    package_text(text_samples, store, "tagger", "token_classifier", "tagger", BATCHING)
    package_text(root, store, "tagger_onnx", "token_classifier", "tagger-onnx", BATCHING)
    return store


def test_the_tensor_handler_runs_an_onnx_model_as_the_eager_one(store):
    pixels = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    body = json.dumps({"instances": pixels.tolist()}).encode()
    [want] = in_process(store / "resnet18_t.mar", [body], "application/json")
    [got] = in_process(store / "resnet18_t_onnx.mar", [body], "application/json")
    assert np.abs(np.array(got["predictions"]) - np.array(want["predictions"])).max() < 1e-4


def test_the_token_classifier_runs_an_onnx_model_as_the_torch_one(store):
    want = in_process(store / "tagger.mar", TEXTS, "text/plain")
    got = in_process(store / "tagger_onnx.mar", TEXTS, "text/plain")
    assert sum(len(entities) for entities in want) > 0  # the sample tagger finds entities
    assert_close(got, want)


def requirements(archive) -> str:
    return (archive_reading.member(archive, "requirements.txt") or b"").decode()


def test_only_onnx_archives_ask_for_onnxruntime(store):
    for name in ("resnet18_onnx", "resnet18_t_onnx", "minilm_onnx", "sentiment_onnx", "tagger_onnx"):
        assert "onnxruntime>=" in requirements(store / f"{name}.mar"), name
    for name in ("resnet18", "resnet18_t", "minilm", "sentiment", "tagger"):
        assert "onnxruntime" not in requirements(store / f"{name}.mar"), name


def in_process(archive, inputs, content_type):
    with LocalModel(archive) as model:
        rows = [{"body": body} for body in inputs]
        return [r.json() for r in model.predict_rows(rows, [{"Content-Type": content_type}] * len(inputs))]


def cosines(got, want):
    a, b = np.array(got), np.array(want)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.matrix
def test_onnx_archives_answer_as_the_originals_in_process_and_served(store, jpegs):
    images = jpegs[:4]
    expected = {
        "resnet18": in_process(store / "resnet18.mar", images, "image/jpeg"),
        "minilm": in_process(store / "minilm.mar", TEXTS, "text/plain"),
        "sentiment": in_process(store / "sentiment.mar", TEXTS, "text/plain"),
    }
    local = {
        "resnet18": in_process(store / "resnet18_onnx.mar", images, "image/jpeg"),
        "minilm": in_process(store / "minilm_onnx.mar", TEXTS, "text/plain"),
        "sentiment": in_process(store / "sentiment_onnx.mar", TEXTS, "text/plain"),
    }
    with RunningServer(store) as srv:
        served = {
            "resnet18": post_concurrently(srv, "resnet18_onnx", images, "image/jpeg"),
            "minilm": post_concurrently(srv, "minilm_onnx", TEXTS, "text/plain"),
            "sentiment": post_concurrently(srv, "sentiment_onnx", TEXTS, "text/plain"),
        }
    for model, results in served.items():
        assert all(status == 200 for status, _ in results), results
        served[model] = [body for _, body in results]
    for answers_of in (local, served):
        assert_close(answers_of["resnet18"], expected["resnet18"])
        assert_close(answers_of["sentiment"], expected["sentiment"])
        assert cosines(answers_of["minilm"], expected["minilm"]).min() >= 0.9999
    low = cosines(served["minilm"], expected["minilm"]).min()
    print(f"ONNX vs torch: top-k equal within 1e-4 (resnet18, sentiment); minilm cosine >= {low:.7f}")


@pytest.mark.matrix  # 14 s; make test's golden replays: tests/cli/test_golden.py
def test_verify_replays_the_originals_golden_answers_against_the_export(store, jpegs, tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for index, image in enumerate(jpegs[:3]):
        (inputs / f"photo{index}.jpg").write_bytes(image)
    golden = tmp_path / "resnet18.mar"
    mar.rewrite_archive(
        store / "resnet18.mar",
        golden,
        {answers.GOLDEN: json.dumps(golden_answers.record(store / "resnet18.mar", inputs)).encode()},
    )
    result = CliRunner().invoke(main, ["verify", str(store / "resnet18_onnx.mar"), "--golden-from", str(golden)])
    assert result.exit_code == 0, result.output
    assert "3 of 3 golden answers match (in-process)" in result.output
