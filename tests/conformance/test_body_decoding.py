"""Conformance, issue #31 items 5 and 6: what a handler receives for a body and its Content-Type, and what
a client reads back, on every runtime, whichever tool built the archive.

TorchServe's worker hands a handler each body decoded by its Content-Type: the decoded JSON for
application/json, a str for text/..., the bytes for anything else (or when it cannot decode them). The
cases (samples/ts_probes.py, resnet_18 samples/ts_examples.py):

- ``xgboost``: pytorch/serve's xgboost_classfication, a BaseHandler reading each body as CSV bytes; its
  requests without a Content-Type (its README's ``curl -T``), as bytes, as text/plain (a ``.txt`` as
  ``tsctl predict`` sends it: a str, refused) and as a JSON list. With ``TSCTL_PYTORCH_SERVE`` its own
  handler, and a model trained by its own ``xgboost_train.py`` (xgboost and scikit-learn must be
  importable, by the workers too: else skipped);
- ``body_probe``: a handler answering the type and value of what it received, for each row of the
  worker's table (JSON object, list, string and invalid JSON, ``; charset=``, UTF-8 and other text,
  text/csv, a PNG, bytes, no type, an empty body);
- ``resnet_18``: ``--handler image_classifier``, which tsctl packages as its own handler and
  torch-model-archiver as TorchServe's built-in: on MLServer, one answer shape for both.

Each is packaged by tsctl and by torch-model-archiver and run in-process (``LocalModel``), by ``tsctl run
--json --content-type TYPE ARCHIVE FILE...`` (a whole process per archive and type, each file as that
type; ``''``: none, as curl -T sends it), on TorchServe 0.12, on tsctl's engine and on MLServer 1.7.1.
``tsctl run`` reports a batch the handler failed as a whole (TorchServe's 5xx) as its own error, exit 1:
that cell equals a reference answering 5xx there. On MLServer each file goes as ``tsctl predict
--content-type TYPE`` sends it (one BYTES element, its type the element's ``content_type``) and the
answer read is the JSON of the one BYTES output ``output-0``'s element, whose name, datatype and shape
are checked too. Every cell must equal TorchServe serving torch-model-archiver's archive: the same
statuses, error messages and answers (floats within 1e-4 relative). ``make matrix`` only (about three
minutes); ``make test``'s smoke path is tests/engine/test_v2_requests.py (the mapping, through
TorchServe's worker) and tests/engine/test_mlserver.py (the real MLServer, both packagers).
"""

import base64
import concurrent.futures
import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from archiver import engines, server
from handlers.errors import error_message
from helpers.paths import short_tmp
from helpers.processes import run_alone
from helpers.servers import RunningServer
from helpers.v2_answers import ask_v2
from samples import runtime_env, ts_examples, ts_probes
from serving.local_model import LocalModel, RequestInput

pytestmark = pytest.mark.matrix

SERVE = ts_examples.checkout()
PACKAGERS = {"tsctl": "tsctl", "torch-model-archiver": "tma"}  # packager: the suffix of its model names
RUNTIMES = ("in-process", "tsctl run", "TorchServe", "tsctl engine", "MLServer")
REFERENCE = ("torch-model-archiver", "TorchServe")
RTOL, ATOL = 1e-4, 1e-5
MLSERVER = engines.ENGINES["mlserver"]
Answers = List[Tuple[int, object]]  # (status, the answer as a client of TorchServe reads it, or the error's message)


def xgboost_importable() -> bool:
    return importlib.util.find_spec("xgboost") is not None and importlib.util.find_spec("sklearn") is not None


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Dict[str, ts_examples.Example]:
    root = tmp_path_factory.mktemp("bodies")
    if SERVE is not None and not xgboost_importable():
        pytest.skip("TSCTL_PYTORCH_SERVE: pytorch/serve's xgboost example needs xgboost and scikit-learn here")
    built = [
        ts_probes.build_xgboost(root / "xgboost", SERVE),
        ts_probes.build_body_probe(root / "probe"),
        ts_examples.build_resnet_18(root / "resnet_18", SERVE)[0],
    ]
    return {example.name: example for example in built}


@pytest.fixture(scope="module")
def store(examples, tmp_path_factory) -> Path:
    """Every case by both packagers, in one store: ``NAME_tsctl`` and ``NAME_tma``."""
    store = short_tmp("bd-")
    for example in examples.values():
        for packager, suffix in PACKAGERS.items():
            ts_examples.package(dataclasses.replace(example, name=f"{example.name}_{suffix}"), packager, store)
    yield store
    shutil.rmtree(store, ignore_errors=True)


def headers_of(kind: str) -> Dict[str, str]:
    return {"Content-Type": kind} if kind else {}  # no type: as curl -T sends a file


def read(status: int, body) -> object:
    return body if status == 200 else error_message(body)


def in_process(store: Path, examples) -> Dict[str, Answers]:
    answers = {}
    for archive in sorted(store.glob("*.mar")):
        example = examples[archive.stem.rsplit("_", 1)[0]]
        with LocalModel(archive) as model:
            replies = [model.predict([RequestInput(body, headers_of(kind))])[0] for body, kind in example.inputs]
        answers[archive.stem] = [(r.status, r.answer() if r.status == 200 else error_message(r.body)) for r in replies]
    return answers


FAILED = "the handler failed as a whole"  # what tsctl run says instead of TorchServe's 5xx


def run_type(archive: Path, example, kind: str, folder: Path) -> Dict[int, Tuple[object, object]]:
    """The answers to ``example``'s inputs of type ``kind`` (by their index) from ``tsctl run --json
    --content-type KIND ARCHIVE FILE...`` (the files in order, written to ``folder``); an input the
    handler fails as a whole (run's error, exit 1) is (FAILED, its error), the others run again without it."""
    got: Dict[int, Tuple[object, object]] = {}
    pending = [i for i, (_, k) in enumerate(example.inputs) if k == kind]
    while pending:
        files = []
        for i in pending:
            files.append(folder / f"{archive.stem}-{i}.bin")
            files[-1].write_bytes(example.inputs[i][0])
        done = run_alone(
            [ts_examples.BIN / "tsctl", "run", "--json", "--content-type", kind, archive, *files],
            cwd=folder,
            timeout=300,
        )
        assert done.code in (0, 1) and not done.left, (archive.stem, kind, done)
        report = json.loads(done.stdout)
        if "error" in report:  # "ARCHIVE: the handler failed on FILE: ERROR"
            message = report["error"]["message"]
            failed = next(i for i, path in zip(pending, files) if f"the handler failed on {path}:" in message)
            got[failed] = (FAILED, message)
            pending = [i for i in pending if i != failed]
            continue
        for i, result in zip(pending, report["results"]):
            answer = base64.b64decode(result["answer"]) if result["base64"] else result["answer"]
            got[i] = (result["status"], read(result["status"], answer))
        pending = []
    return got


def by_tsctl_run(store: Path, examples, folder: Path) -> Dict[str, Answers]:
    """Each archive's inputs answered by ``tsctl run``, one process per archive and content type
    (``run_type``), two at a time."""
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for archive in sorted(store.glob("*.mar")):
            example = examples[archive.stem.rsplit("_", 1)[0]]
            for kind in dict.fromkeys(kind for _, kind in example.inputs):
                jobs[archive.stem, kind] = pool.submit(run_type, archive, example, kind, folder)
    answers: Dict[str, Answers] = {}
    for archive in sorted(store.glob("*.mar")):
        example = examples[archive.stem.rsplit("_", 1)[0]]
        got = {}
        for (stem, _), job in jobs.items():
            got.update(job.result() if stem == archive.stem else {})
        answers[archive.stem] = [got[i] for i in range(len(example.inputs))]
    return answers


def over_http(srv, store: Path, examples) -> Dict[str, Answers]:
    answers = {}
    for archive in sorted(store.glob("*.mar")):
        example = examples[archive.stem.rsplit("_", 1)[0]]
        url = engines.predict_url(srv, archive.stem)
        replies = [server.request(url, body, "POST", headers_of(kind), 120) for body, kind in example.inputs]
        answers[archive.stem] = [(status, read(status, body)) for status, body in replies]
    return answers


def over_v2(srv, store: Path, examples) -> Dict[str, Answers]:
    """Each file as ``tsctl predict --content-type`` sends it to MLServer; the element of output-0 as JSON."""
    answers = {}
    for archive in sorted(store.glob("*.mar")):
        example = examples[archive.stem.rsplit("_", 1)[0]]
        answers[archive.stem] = [ask_v2(srv, archive.stem, body, kind) for body, kind in example.inputs]
    return answers


@pytest.fixture(scope="module")
def runs(store, examples) -> Dict[str, Dict[str, Answers]]:
    """Every archive's answers, by runtime."""
    runs = {"in-process": in_process(store, examples)}
    files = short_tmp("bdr-")
    try:
        runs["tsctl run"] = by_tsctl_run(store, examples, files)
    finally:
        shutil.rmtree(files, ignore_errors=True)
    with RunningServer(store) as srv:
        runs["TorchServe"] = over_http(srv, store, examples)
    engine = engines.ENGINES["tsctl"]
    srv = engine.start(store, home=short_tmp("bde-"), timeout=300)
    try:
        runs["tsctl engine"] = over_http(srv, store, examples)
    finally:
        engine.stop(srv)
    srv = MLSERVER.start(store, home=short_tmp("bdm-"), timeout=300, python=str(runtime_env.ensure_mlserver()))
    try:
        runs["MLServer"] = over_v2(srv, store, examples)
    finally:
        MLSERVER.stop(srv)
    return runs


def close(got, want) -> bool:
    """The same JSON structure (keys in the same order), floats within 1e-4 relative + 1e-5 absolute (the
    conformance suite's: tsctl's image handler and TorchServe's differ by 1.7e-6)."""
    if isinstance(want, dict):
        return isinstance(got, dict) and list(got) == list(want) and all(close(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(close(g, w) for g, w in zip(got, want))
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return abs(got - want) <= ATOL + RTOL * abs(want)
    return type(got) is type(want) and got == want


TABLE: Dict[Tuple[str, str, str], str] = {}


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    if TABLE:
        cases = sorted({case for case, _, _ in TABLE})
        lines = ["| case | packager | " + " | ".join(RUNTIMES) + " |", "|---|---|" + "---|" * len(RUNTIMES)]
        for case in cases:
            for packager in PACKAGERS:
                cells = [TABLE.get((case, packager, runtime), "not run") for runtime in RUNTIMES]
                lines.append(f"| {case} | {packager} | " + " | ".join(cells) + " |")
        print("\n" + "\n".join(lines))


CELLS = [
    (case, packager, runtime)
    for case in ("xgboost", "body_probe", "resnet_18")
    for packager in PACKAGERS
    for runtime in RUNTIMES
]


@pytest.mark.parametrize("case, packager, runtime", CELLS, ids=["-".join(cell) for cell in CELLS])
def test_cell(case, packager, runtime, runs, examples):
    reference_packager, reference_runtime = REFERENCE
    want = runs[reference_runtime][f"{case}_{PACKAGERS[reference_packager]}"]
    got = runs[runtime][f"{case}_{PACKAGERS[packager]}"]
    assert len(got) == len(want) == len(examples[case].inputs)
    if runtime == "tsctl run":  # run's own error for a batch the handler failed as a whole: a 5xx of TorchServe's
        want = [(FAILED, None) if status >= 500 else (status, answer) for status, answer in want]
        got = [(FAILED, None) if status == FAILED else (status, answer) for status, answer in got]
    equal = [status for status, _ in got] == [status for status, _ in want] and close(
        [answer for _, answer in got], [answer for _, answer in want]
    )
    TABLE[(case, packager, runtime)] = (
        ("reference" if (packager, runtime) == REFERENCE else "equal") if equal else "differs"
    )
    assert equal, f"{case} by {packager} on {runtime}: {got} != {want}"


def test_the_reference_answers_as_the_example_does(runs):
    """TorchServe's own answers, the premise: the CSV sent as bytes is classified, as text/plain (a str)
    it is not; the probe saw every row of the worker's table."""
    xgboost = runs["TorchServe"]["xgboost_tma"]
    assert [status for status, _ in xgboost[:3]] == [200, 200, 200], xgboost
    if SERVE is None:
        assert [answer for _, answer in xgboost[:3]] == ["versicolor", "setosa", "virginica"]
        assert xgboost[3][0] == 400 and "got str" in xgboost[3][1], xgboost
        assert xgboost[4][0] == 400 and "got list" in xgboost[4][1], xgboost
    else:
        assert xgboost[3][0] == 503 and xgboost[4][0] == 200, xgboost  # a str fails in xgboost; a list is read
    probe = runs["TorchServe"]["body_probe_tma"]
    assert {answer["type"] for _, answer in probe} == {"dict", "list", "str", "bytearray"}, probe
