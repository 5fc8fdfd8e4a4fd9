"""The text handlers against transformers' own pipelines and SentenceTransformer.encode, in process.

Small random models are built here (samples/text_models.py style): sequence classifiers with a
softmax, a one-logit, a regression and a multi-label head; the token classifier; sentence-transformers
directories with a Dense module, each pooling mode, do_lower_case and a default prompt. Every one is
packaged as an archive, run with LocalModel (one request per text, one batch) and compared with the
library on the same 48 texts: long ones, non-ASCII, decomposed accents, JSON-looking text.
"""

import json
import shutil
import sys
import unicodedata
import warnings
from pathlib import Path
from typing import Union

import pytest
import torch
import transformers

from handlers.embeddings import SENTENCE_TRANSFORMERS, TextEmbedder
from handlers.fit import pooling_modes
from handlers.text_classification import TextClassifier
from handlers.token_classification import drop_overlaps
from helpers import archive_reading
from helpers.models import package_text
from helpers.servers import RunningServer, post
from samples import text_models
from serving.local_model import InProcessHandler, LocalModel, RequestInput

LONG = (
    "Ada Lovelace wrote to Charles Babbage from London about the Analytical Engine, and Grace Hopper later "
    "worked in Arlington on compilers while Alan Turing visited Princeton. "
)
TEXTS = [
    "The cat sits on the mat.",
    "Hi",
    "short",
    "Ada Lovelace met Charles Babbage in London, and later wrote to the Royal Society.",
    "Grace Hopper worked in Arlington.",
    "   leading spaces and ünïcode Zürich",
    "Ünïcödé text, emoji 🙂 and numbers 12345.",
    unicodedata.normalize("NFD", "Crème brûlée in Zürich, São Paulo and Kraków"),  # decomposed accents
    unicodedata.normalize("NFD", "Ångström and Øresund: é è ê ë"),
    "Straße, Æsir, œuvre, ﬁne ligatures",
    "東京と大阪で会議があります。",
    "Москва и Санкт-Петербург — крупнейшие города России.",
    "مرحبا بالعالم",
    '{"text": "this is JSON-looking text, and stays text"}',
    '["a", "list", "of", "words"]',
    "tab\tseparated\ttext\nwith a newline",
    "UPPER CASE SHOUTING ABOUT PARIS AND BERLIN",
    "MiXeD CaSe NaMeS lIkE mArIe CuRiE",
    "email someone@example.com or visit https://example.org/path?q=1",
    "Prices: $12.50, €7, ¥300; temperatures −5 °C to 30 °C.",
    "He said: «bonjour», she replied “hello” — and left…",
    "A man is playing a guitar on stage in front of a large, cheering crowd.",
    "TorchServe batches requests that arrive within the batch delay.",
    "Embeddings of similar sentences are close.",
    "unbelievably unaffordable antidisestablishmentarianism",
    "x" * 300,
    "word " * 40,
    "Ünïcödé " * 30,
    LONG * 2,
    LONG * 9,  # ~270 words: past a 64-token window, not past 512
    LONG * 20,  # past 512 tokens: truncated without stride
    " ".join(f"Person{i} Smith visited City{i}" for i in range(60)),
    "The quick brown fox jumps over the lazy dog. " * 25,
    "¿Dónde está la biblioteca? Está en Madrid.",
    "Dankeschön für die Blumen aus München.",
    "Ελληνικά γράμματα στην Αθήνα",
    "한국어 문장도 있습니다",
    "नमस्ते दुनिया",
    "a\u0301e\u0301i\u0301o\u0301u\u0301 combining marks",
    "Zero\u200bwidth\u200bspaces and non\u00a0breaking",
    "@user #hashtag :) ;-) <3",
    "3.14159 2.71828 1.41421 numbers only 42",
    "New York, Los Angeles and San Francisco are in the United States.",
    "Barack Obama was born in Honolulu, Hawaii.",
    "Marie Curie won the Nobel Prize in Physics in 1903 in Stockholm.",
    "I love this movie!",
    "This is terrible and I want my money back.",
    "Neutral statement about the weather today.",
]
assert len(TEXTS) == 48

FULL = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 8\nmaxBatchDelay: 100\nresponseTimeout: 120\n"


def config(**handler) -> str:
    return FULL + "handler:\n" + "".join(f"  {key}: {json.dumps(value)}\n" for key, value in handler.items())


def answers(model: Union[LocalModel, InProcessHandler], texts=TEXTS) -> list:
    """Each text's answer, one request each in one batch (text/plain; an InProcessHandler, whose
    handler a test looks at, gets each as the worker hands it over: a str)."""
    if isinstance(model, InProcessHandler):
        responses = model.predict_rows([{"body": t} for t in texts], [{"Content-Type": "text/plain"}] * len(texts))
    else:
        responses = model.predict(list(texts))
    assert [r.status for r in responses] == [200] * len(texts), [r.json() for r in responses if r.status != 200]
    return [r.json() for r in responses]


def pipeline(task: str, directory: Path, max_length=None, **options):
    """transformers' own pipeline for ``task`` on the model directory (its tokenizer's limit set to
    ``max_length`` tokens, as the handler's ``max_length`` sets ours)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    if max_length:
        tokenizer.model_max_length = max_length
    kind = {"text-classification": "Sequence", "token-classification": "Token"}[task]
    model = getattr(transformers, f"AutoModelFor{kind}Classification").from_pretrained(directory)
    return transformers.pipeline(task, model=model, tokenizer=tokenizer, device="cpu", **options)


# ---- models ---------------------------------------------------------------------------------------
def head(out: Path, labels: dict, problem_type=None, seed=0) -> Path:
    """A 2-layer BERT sequence classifier with ``labels`` (one label: a one-logit head)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(text_models.minilm_dir())
    labelled = text_models.label_maps(labels)
    bert = text_models.tiny_bert_config(tokenizer.vocab_size, problem_type=problem_type, **labelled)
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(bert).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(10)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def models(text_samples, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("parity")
    for name in ("classifier", "tagger", "minilm"):
        shutil.copytree(text_samples / name, root / name)
    head(root / "one_logit", {0: "toxic"}, seed=3)  # no problem_type: the pipeline applies sigmoid
    head(root / "regression", {0: "rating"}, "regression", seed=4)  # raw scores
    head(root / "multi_label", {0: "a", 1: "b", 2: "c"}, "multi_label_classification", seed=5)
    head(root / "two_labels", {0: "no", 1: "yes"}, seed=6)  # softmax
    build_sentence_transformers(root)
    return root


def cased_tokenizer(out: Path):
    """MiniLM's tokenizer without its lower-casing: do_lower_case (sentence_bert_config.json) matters."""
    transformers.AutoTokenizer.from_pretrained(text_models.minilm_dir()).save_pretrained(out)
    for name, edit in (
        ("tokenizer.json", lambda d: d["normalizer"].update(lowercase=False)),
        ("tokenizer_config.json", lambda d: d.update(do_lower_case=False)),
    ):
        data = json.loads((out / name).read_text())
        edit(data)
        (out / name).write_text(json.dumps(data))
    assert transformers.AutoTokenizer.from_pretrained(out).tokenize("Paris") != ["paris"]


ST_POOLINGS = ("mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


def build_sentence_transformers(root: Path):
    """One sentence-transformers directory per pooling mode (each with a Dense module), one with two
    modes at once, one whose sentence_bert_config.json lower-cases for a cased tokenizer, one with a
    default prompt left out of the pooling."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from sentence_transformers import SentenceTransformer, models

    bert_dir = root / "st_bert"
    cased_tokenizer(bert_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert_dir)
    bert = text_models.tiny_bert_config(tokenizer.vocab_size)
    torch.manual_seed(7)
    transformers.BertModel(bert).save_pretrained(bert_dir)
    variants = {f"st_{mode}": dict(pooling=mode) for mode in ST_POOLINGS}
    variants["st_cls_max"] = dict(pooling=("cls", "max"), normalize=False)
    variants["st_prompt"] = dict(pooling="mean", prompt="query: ")
    for name, variant in variants.items():
        torch.manual_seed(len(name))
        transformer = models.Transformer(str(bert_dir), max_seq_length=48)
        pooling = models.Pooling(64, pooling_mode=variant["pooling"], include_prompt="prompt" not in variant)
        width = 64 * (len(variant["pooling"]) if isinstance(variant["pooling"], tuple) else 1)
        modules = [transformer, pooling, models.Dense(width, 24)]
        if variant.get("normalize", True):
            modules.append(models.Normalize())
        prompts = {"query": variant["prompt"]} if "prompt" in variant else None
        st = SentenceTransformer(
            modules=modules, device="cpu", prompts=prompts, default_prompt_name=prompts and "query"
        )
        st.save(str(root / name))
    # the sentence_bert_config.json older releases write: the cased tokenizer is lower-cased at load
    lower = root / "st_lower"
    SentenceTransformer(str(root / "st_mean"), device="cpu").save(str(lower))
    (lower / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40, "do_lower_case": True}))


# ---- sequence classification --------------------------------------------------------------------
@pytest.mark.parametrize(
    "directory, function",
    [
        ("classifier", "softmax"),
        ("two_labels", "softmax"),
        ("one_logit", "sigmoid"),
        ("regression", "none"),
        ("multi_label", "sigmoid"),
    ],
)
def test_classifier_scores_are_the_pipelines(models, tmp_path, directory, function):
    archive = package_text(models, tmp_path / "store", directory, "text_classifier", directory, config(top_k=0))
    with InProcessHandler(archive, batch_size=8) as model:  # its handler is looked at: in this process
        assert model.handler.function == function
        ours = answers(model)
    classify = pipeline("text-classification", models / directory)
    every = classify(TEXTS, top_k=None, truncation=True, max_length=512)
    top = classify(TEXTS, truncation=True, max_length=512)  # the pipeline's default answer: the top label
    for text, answer, expected, best in zip(TEXTS, ours, every, top):
        assert set(answer) == {e["label"] for e in expected}, text
        for e in expected:
            assert answer[e["label"]] == pytest.approx(e["score"], abs=1e-5), (text, e)
        assert list(answer.values()) == sorted(answer.values(), reverse=True)
        label, score = next(iter(answer.items()))
        assert best["score"] == pytest.approx(score, abs=1e-5) and answer[best["label"]] == pytest.approx(score)
    if function == "sigmoid" and directory == "one_logit":
        assert len({round(next(iter(a.values())), 6) for a in ours}) > 10  # not softmax's 1.0 for every text


def test_function_none_gives_the_raw_logits(models, tmp_path):
    archive = package_text(models, tmp_path / "s", "raw", "text_classifier", "classifier", config(function="none"))
    with LocalModel(archive) as model:
        ours = answers(model, TEXTS[:12])
    expected = pipeline("text-classification", models / "classifier")(TEXTS[:12], top_k=None, function_to_apply="none")
    for answer, labels in zip(ours, expected):
        assert answer == pytest.approx({e["label"]: e["score"] for e in labels}, abs=1e-5)
    assert any(value < 0 or value > 1 for answer in ours for value in answer.values())


# ---- token classification -----------------------------------------------------------------------
def spans(entities):
    return [(e["entity_group"], e["start"], e["end"]) for e in entities]


def check_entities(texts, ours, expected):
    for text, answer, reference in zip(texts, ours, expected):
        assert spans(answer) == spans(reference), text
        for entity, other in zip(answer, reference):
            assert entity["score"] == pytest.approx(float(other["score"]), abs=1e-5), (text, entity)
            assert text[entity["start"] : entity["end"]] == entity["word"]


@pytest.mark.matrix  # out of make test for its time (issue #32's tests took its room); make matrix runs it
@pytest.mark.parametrize("aggregation", ["average", "first", "max"])
def test_entities_are_the_pipelines(models, tmp_path, aggregation):
    archive = package_text(models, tmp_path / "s", "ner", "token_classifier", "tagger", config(aggregation=aggregation))
    with LocalModel(archive) as model:
        ours = answers(model)
    expected = pipeline("token-classification", models / "tagger", aggregation_strategy=aggregation)(TEXTS)
    check_entities(TEXTS, ours, expected)
    assert sum(map(len, ours)) > 50  # random weights still tag many words


@pytest.mark.parametrize("aggregation", [pytest.param("average", marks=pytest.mark.matrix), "first"])  # average: 5 s
def test_long_texts_are_tagged_to_the_end_with_stride(models, tmp_path, aggregation):
    settings = config(aggregation=aggregation, max_length=64, stride=16)
    archive = package_text(models, tmp_path / "s", "ner", "token_classifier", "tagger", settings)
    tagger = pipeline(
        "token-classification", models / "tagger", max_length=64, aggregation_strategy=aggregation, stride=16
    )
    truncated = package_text(models, tmp_path / "t", "cut", "token_classifier", "tagger", config(max_length=64))
    with InProcessHandler(archive, batch_size=8) as model, LocalModel(truncated) as cut:  # model's handler looked at
        ours = answers(model)
        short = answers(cut)
        windows = len(model.handler.decode(LONG * 20).extra)
    check_entities(TEXTS, ours, tagger(TEXTS))
    assert windows > 10
    tokenizer = transformers.AutoTokenizer.from_pretrained(models / "tagger")
    end_of_window = [tokenizer(t, truncation=True, max_length=64, return_offsets_mapping=True) for t in TEXTS]
    past = 0
    for text, answer, cut_answer, encoding in zip(TEXTS, ours, short, end_of_window):
        limit = max(end for _, end in encoding["offset_mapping"])
        assert all(e["end"] <= limit for e in cut_answer)  # without stride: nothing past the first window
        past += sum(e["start"] >= limit for e in answer)
        ordered = sorted(answer, key=lambda e: e["start"])
        assert all(a["end"] <= b["start"] for a, b in zip(ordered, ordered[1:])), text  # none overlaps
        assert len({(e["start"], e["end"]) for e in answer}) == len(answer)  # none twice
    assert past > 20, "entities past the first window are found"


def test_stride_windows_count_against_max_items(models, tmp_path):
    settings = config(max_length=32, stride=8, max_items=6)
    archive = package_text(models, tmp_path / "s", "ner", "token_classifier", "tagger", settings)
    with LocalModel(archive) as model:
        long, fits, neighbour = model.predict([LONG * 5, LONG, "Grace Hopper worked in Arlington."])
    assert long.status == 413 and "handler.max_items" in long.json()["message"], long.json()
    assert "windows" in long.json()["message"]
    assert fits.status == 200 and neighbour.status == 200


@pytest.mark.matrix  # 9 s
def test_a_stride_that_leaves_no_room_is_refused_at_load(models, tmp_path):
    archive = package_text(
        models, tmp_path / "s", "ner", "token_classifier", "tagger", config(max_length=16, stride=14)
    )
    with pytest.raises(Exception, match="handler.stride"):
        LocalModel(archive)


def test_drop_overlaps_keeps_the_longer_then_the_higher_scoring():
    found = [
        {"start": 0, "end": 5, "score": 0.5},
        {"start": 3, "end": 12, "score": 0.1},  # overlaps, longer: wins
        {"start": 3, "end": 12, "score": 0.9},  # as long, higher: wins
        {"start": 20, "end": 25, "score": 0.4},
        {"start": 20, "end": 25, "score": 0.4},  # the same span again: once
    ]
    assert drop_overlaps(found) == [found[2], found[3]]


# ---- sentence embeddings --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "directory", ["minilm"] + [f"st_{mode}" for mode in ST_POOLINGS] + ["st_cls_max", "st_prompt", "st_lower"]
)
def test_embeddings_are_sentence_transformers(models, tmp_path, directory):
    from sentence_transformers import SentenceTransformer

    archive = package_text(models, tmp_path / "s", "emb", "text_embedder", directory, FULL)
    with InProcessHandler(archive, batch_size=8) as model:  # its handler is looked at: in this process
        assert model.handler.sentence_model is not None
        ours = torch.tensor(answers(model))
    reference = SentenceTransformer(str(models / directory), device="cpu").encode(TEXTS, convert_to_tensor=True)
    assert ours.shape == reference.shape
    cosine = torch.nn.functional.cosine_similarity(ours, reference.float(), dim=1)
    assert cosine.min().item() >= 0.99999, (directory, cosine.min().item())
    assert torch.allclose(ours.norm(dim=1), reference.norm(dim=1), rtol=1e-4)


def test_lower_casing_and_the_prompt_change_the_answer(models, tmp_path):
    """Neither is a no-op here (a cased tokenizer on an uncased vocabulary; a prompt left out of the
    pooling), so the comparisons above check them."""
    from sentence_transformers import SentenceTransformer

    texts = ["UPPER CASE SHOUTING ABOUT PARIS AND BERLIN", "Some Words"]
    lower = SentenceTransformer(str(models / "st_lower"), device="cpu")
    plain = SentenceTransformer(str(models / "st_mean"), device="cpu")
    assert not torch.allclose(lower.encode(texts, convert_to_tensor=True), plain.encode(texts, convert_to_tensor=True))
    prompted = SentenceTransformer(str(models / "st_prompt"), device="cpu")
    assert prompted.default_prompt_name == "query"
    with_prompt = prompted.encode(texts, convert_to_tensor=True)
    assert not torch.allclose(with_prompt, prompted.encode(texts, convert_to_tensor=True, prompt=""))


def test_plain_directories_keep_the_transformers_path(models, tmp_path):
    archive = package_text(models, tmp_path / "s", "emb", "text_embedder", "st_bert", FULL)
    with InProcessHandler(archive, batch_size=8) as model:  # its handler is looked at: in this process
        assert model.handler.sentence_model is None and model.handler.pooling == "mean"
        [vector] = answers(model, ["a plain BERT, mean pooled"])
    assert len(vector) == 64


def test_without_the_package_only_what_the_plain_path_computes_exactly_loads(models, tmp_path, monkeypatch):
    """An archive made before its requirements asked for sentence-transformers, on a worker without it:
    MiniLM's modules (Transformer, mean Pooling, Normalize) are the plain path's; a Dense module is not."""
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(models / "minilm"), device="cpu").encode(TEXTS, convert_to_tensor=True)
    minilm = package_text(models, tmp_path / "s", "minilm", "text_embedder", "minilm", FULL)
    dense = package_text(models, tmp_path / "s", "dense", "text_embedder", "st_weightedmean", FULL)
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails as if not installed
    with InProcessHandler(minilm, batch_size=8) as model:  # in this process, where sentence_transformers is gone
        assert model.handler.sentence_model is None
        ours = torch.tensor(answers(model))
    assert torch.nn.functional.cosine_similarity(ours, reference.float(), dim=1).min().item() >= 0.99999
    with pytest.raises(
        Exception, match="needs the sentence-transformers package .a Dense module.*sentence-transformers>=3"
    ):
        InProcessHandler(dense)


@pytest.mark.matrix  # 11 s
def test_pooling_setting_is_refused_for_sentence_transformers_directories(models, tmp_path):
    archive = package_text(models, tmp_path / "s", "emb", "text_embedder", "st_cls", config(pooling="mean"))
    with pytest.raises(Exception, match="handler.pooling"):
        LocalModel(archive)


def test_pooling_modes_of_every_config_format():
    assert pooling_modes({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}) == {"mean"}
    assert pooling_modes({"pooling_mode_mean_sqrt_len_tokens": True, "pooling_mode_lasttoken": True}) == {
        "mean_sqrt_len",
        "lasttoken",
    }
    assert pooling_modes({"pooling_mode": "weightedmean"}) == {"weightedmean"}
    assert pooling_modes({"pooling_mode": ["cls", "max"]}) == {"cls", "max"}


def test_requirements_follow_the_directory(models):
    assert TextEmbedder.requirements_for(models / "minilm") == ("transformers>=4.34,<6", SENTENCE_TRANSFORMERS)
    assert TextEmbedder.requirements_for(models / "st_bert") == ("transformers>=4.34,<6",)
    assert TextClassifier.requirements_for(models / "classifier") == ("transformers>=4.34,<6",)
    assert SENTENCE_TRANSFORMERS == "sentence-transformers>=3,<7"


# ---- text bodies ----------------------------------------------------------------------------------
JSONISH = '{"text": "not this"}'


@pytest.mark.parametrize("decode_input_request", [True, pytest.param(False, marks=pytest.mark.matrix)])  # False: 15 s
def test_a_text_body_that_looks_like_json_stays_text(models, tmp_path, decode_input_request):
    """TorchServe hands a text/* body over as str (decode_input_request=true) or bytes (false, the
    Content-Type in the headers); an application/json body as parsed JSON or bytes."""
    archive = package_text(models, tmp_path / "s", "c", "text_classifier", "classifier", config(top_k=0))

    kinds = ["text/plain; charset=utf-8", "application/json", "text/plain", "application/json", "application/json"]
    texts = [JSONISH, JSONISH, "not this", '"a JSON string"', '["one", "two"]']
    with LocalModel(archive, decode_input_request=decode_input_request) as model:  # the worker decodes, or not
        responses = model.serve([RequestInput(t.encode(), {"Content-Type": k}) for t, k in zip(texts, kinds)])
        literal, inner = answers(model, [JSONISH, "not this"])
        string, one, two = answers(model, ["a JSON string", "one", "two"])
    assert [r.status for r in responses] == [200] * 5
    as_text, as_json, plain, json_string, json_list = (r.json() for r in responses)
    assert as_text == pytest.approx(literal) and as_text != pytest.approx(inner)
    assert as_json == pytest.approx(inner) and plain == pytest.approx(inner)
    assert json_string == pytest.approx(string)
    assert json_list == [pytest.approx(one), pytest.approx(two)]


def test_archives_of_sentence_transformers_directories_carry_their_files(models, tmp_path):
    archive = package_text(models, tmp_path / "s", "emb", "text_embedder", "st_weightedmean", FULL)
    names = {name for name, _ in archive_reading.members(archive)}
    assert {"st_weightedmean/modules.json", "st_weightedmean/2_Dense/config.json"} <= names


@pytest.mark.matrix  # out of make test for its time; test_text.py serves text bodies in make test
@pytest.mark.parametrize("decode_input_request", ["true", "false"])
def test_served_text_bodies_that_look_like_json_stay_text(models, tmp_path, decode_input_request):
    """The same on a real TorchServe, in both modes (``tsctl config`` writes false for toolkit stores)."""
    store = tmp_path / "store"
    package_text(models, store, "sentiment", "text_classifier", "classifier", config(top_k=0))
    with LocalModel(store / "sentiment.mar") as model:
        literal, inner, string = answers(model, [JSONISH, "not this", "a JSON string"])
    running = RunningServer(store)
    text = running.config.read_text()
    assert "decode_input_request=false" in text
    running.config.write_text(
        text.replace("decode_input_request=false", f"decode_input_request={decode_input_request}")
    )
    with running as srv:
        as_text = post(srv, "sentiment", JSONISH.encode(), "text/plain; charset=utf-8")
        as_json = post(srv, "sentiment", JSONISH.encode(), "application/json")
        json_string = post(srv, "sentiment", b'"a JSON string"', "application/json")
    assert [as_text[0], as_json[0], json_string[0]] == [200, 200, 200], (as_text, as_json, json_string)
    assert as_text[1] == pytest.approx(literal, abs=1e-5) and as_text[1] != pytest.approx(inner, abs=1e-5)
    assert as_json[1] == pytest.approx(inner, abs=1e-5)
    assert json_string[1] == pytest.approx(string, abs=1e-5)
