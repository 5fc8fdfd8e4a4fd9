"""The transformers handlers: packaging a Hugging Face directory, in-process and on real TorchServe."""

import json

import pytest
import torch
import transformers

from archiver import mar
from archiver.errors import UserError
from helpers import archive_reading
from helpers.models import package_text
from helpers.servers import RunningServer, batch_lines, post, post_concurrently
from serving.local_model import InProcessHandler, LocalModel

SENTENCES = [
    "The cat sits on the mat.",
    "A man is playing a guitar on stage in front of a large, cheering crowd.",
    "Hi",
    "TorchServe batches requests that arrive within the batch delay.",
    "Ünïcödé text, emoji 🙂 and numbers 12345.",
    "short",
    "This sentence is considerably longer than the others because it keeps going, clause after clause, "
    "so that dynamic padding has real work to do when it shares a batch with one-word texts.",
    "Embeddings of similar sentences are close.",
]
PEOPLE = "Ada Lovelace met Charles Babbage in London, and later wrote to the Royal Society."


@pytest.fixture(scope="module")
def text_store(text_samples, tmp_path_factory):
    store = tmp_path_factory.mktemp("text-serving") / "model-store"
    package_text(text_samples, store, "minilm", "text_embedder", "minilm")
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier")
    package_text(text_samples, store, "ner", "token_classifier", "tagger")
    return store


# The served checks are make matrix's (their TorchServe with three text models: 70 s of make test's); make test
# serves text archives on TorchServe in test_kserve_serving (v1/v2), test_hostile_served (the hostile corpus) and
# test_local_path (the README's local path).
@pytest.fixture(scope="module")
def srv(text_store):
    with RunningServer(text_store) as running:
        yield running


# ---- packaging ------------------------------------------------------------------------------------
def test_hf_directory_keeps_its_structure_and_asks_for_a_transformers_range(text_samples, text_store):
    names = {name for name, _ in archive_reading.members(text_store / "minilm.mar")}
    assert {"minilm/config.json", "minilm/model.safetensors", "minilm/1_Pooling/config.json"} <= names
    assert {"minilm/tokenizer.json", "minilm/vocab.txt", "handlers/embeddings.py"} <= names
    manifest = archive_reading.manifest(text_store / "minilm.mar")["model"]
    assert manifest["serializedFile"] == "minilm" and manifest["requirementsFile"] == "requirements.txt"
    # a range that installs on torchserve-kfs:0.9.0's Python 3.9 as well as here, never this machine's pin
    requirements = archive_reading.member(text_store / "minilm.mar", "requirements.txt").decode()
    assert requirements == "transformers>=4.34,<6\nsentence-transformers>=3,<7\n"  # a sentence-transformers dir


def test_user_requirements_are_kept_and_transformers_added_once(text_samples, tmp_path):
    own = tmp_path / "requirements.txt"
    own.write_text("sentencepiece>=0.2\n")
    options = mar.PackageOptions(
        model_name="c",
        handler="text_classifier",
        serialized_file=str(text_samples / "classifier"),
        requirements_file=str(own),
        export_path=str(tmp_path / "s"),
    )
    text = archive_reading.member(mar.package(options), "requirements.txt").decode()
    assert text.splitlines() == ["sentencepiece>=0.2", "transformers>=4.34,<6"]
    own.write_text("transformers>=4.40\n")
    options.force = True
    assert archive_reading.member(mar.package(options), "requirements.txt").decode() == "transformers>=4.40\n"


def test_bad_text_settings_are_refused_at_packaging(text_samples, tmp_path):
    with pytest.raises(UserError, match="'handler.function' must be one of auto, softmax, sigmoid"):
        package_text(text_samples, tmp_path / "s", "c", "text_classifier", "classifier", "handler:\n  function: tanh\n")


# ---- in process -----------------------------------------------------------------------------------
def test_each_bad_text_fails_alone_in_a_batch(text_store):
    with LocalModel(text_store / "sentiment.mar") as model:
        good, empty, binary, wrong, nothing, listed = model.predict(
            ["fine text", "", b"\xc3\x28 invalid", {"text": 5}, {"text": []}, {"text": ["one", "two"]}]
        )
    assert good.status == 200 and set(good.json()) == {"negative", "neutral", "positive"}
    assert (empty.status, empty.json()["message"]) == (400, "text is empty")
    assert binary.status == 400 and "not valid UTF-8" in binary.json()["message"]
    assert wrong.status == 400 and wrong.json()["message"] == "text must be a string, got int"
    assert nothing.status == 400 and "empty" in nothing.json()["message"]
    assert listed.status == 200 and len(listed.json()) == 2


def test_tokenisation_pads_to_the_longest_text_not_max_length(text_store):
    with InProcessHandler(text_store / "sentiment.mar", batch_size=8) as model:  # its methods called: in this process
        handler = model.handler
        batch = handler.preprocess([handler.decode(text) for text in ("a b", "c", "d")])
        truncated = handler.preprocess([handler.decode("word " * 1000)])
    assert batch["input_ids"].shape == (3, 4)  # [CLS] a b [SEP]: the longest text, not max_length
    assert truncated["input_ids"].shape == (1, 512)


# ---- served ---------------------------------------------------------------------------------------
@pytest.mark.matrix
def test_served_embeddings_match_sentence_transformers(srv, text_samples):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(text_samples / "minilm"), device="cpu").encode(
        SENTENCES, convert_to_tensor=True
    )
    results = post_concurrently(srv, "minilm", [s.encode() for s in SENTENCES], "text/plain; charset=utf-8")
    served = torch.tensor([body for _, body in results])
    assert [status for status, _ in results] == [200] * len(SENTENCES)
    cosine = torch.nn.functional.cosine_similarity(served, reference.float(), dim=1)
    assert cosine.min().item() >= 0.9999, cosine.tolist()
    assert torch.allclose(served.norm(dim=1), torch.ones(len(SENTENCES)), atol=1e-4)

    status, body = post(srv, "minilm", json.dumps({"inputs": SENTENCES[:3]}).encode(), "application/json")
    assert status == 200 and torch.tensor(body).shape == (3, 384)
    v2 = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": SENTENCES[:2]}]}
    status, body = post(srv, "minilm", json.dumps(v2).encode(), "application/json")
    assert status == 200 and body["outputs"][0]["shape"] == [2, 384] and body["outputs"][0]["datatype"] == "FP32"


@pytest.mark.matrix
def test_served_classifier_equals_the_model_run_in_process(srv, text_samples):
    directory = text_samples / "classifier"
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    texts = SENTENCES + ["word " * 400]  # one beyond max_length: truncated
    expected = []
    with torch.no_grad():
        for text in texts:  # one at a time, unpadded
            inputs = tokenizer(text, truncation=True, max_length=512, return_tensors="pt")
            probabilities = torch.softmax(model(**inputs).logits, dim=-1)[0]
            expected.append({model.config.id2label[i]: p.item() for i, p in enumerate(probabilities)})
    before = len(batch_lines(srv))
    results = post_concurrently(srv, "sentiment", [t.encode() for t in texts], "text/plain")
    for (status, body), answer in zip(results, expected):
        assert status == 200, body
        assert sorted(body, key=body.get, reverse=True) == sorted(answer, key=answer.get, reverse=True)
        assert list(body.values()) == sorted(body.values(), reverse=True)
        for label, probability in answer.items():
            assert body[label] == pytest.approx(probability, abs=1e-5)
    sizes = [line["size"] for line in batch_lines(srv)[before:]]
    assert max(sizes) > 1, f"no batching: {sizes}"


@pytest.mark.matrix
def test_served_entities_index_back_into_the_text(srv, text_store):
    texts = [PEOPLE, "Grace Hopper worked in Arlington.", "   leading spaces and ünïcode Zürich"]
    with LocalModel(text_store / "ner.mar") as local:
        expected = [r.json() for r in local.predict(texts)]
    results = post_concurrently(srv, "ner", [t.encode() for t in texts], "text/plain; charset=utf-8")
    for text, (status, body), answer in zip(texts, results, expected):
        assert status == 200, body
        assert body, "random weights still tag some words"
        for entity in body:
            assert text[entity["start"] : entity["end"]] == entity["word"]
            assert entity["entity_group"] in {"PER", "LOC", "ORG"}
        assert [(e["start"], e["end"], e["entity_group"]) for e in body] == [
            (e["start"], e["end"], e["entity_group"]) for e in answer
        ]


@pytest.mark.matrix
def test_bad_texts_fail_alone_on_the_server(srv):
    bodies = [b"good text", b"\xff\xfe\xfd", b'{"text": 12}', b"another good one"]
    results = post_concurrently(srv, "sentiment", bodies, "application/octet-stream")
    assert [status for status, _ in results] == [200, 400, 400, 200]
    assert "not valid UTF-8" in results[1][1]["message"] and "must be a string" in results[2][1]["message"]
