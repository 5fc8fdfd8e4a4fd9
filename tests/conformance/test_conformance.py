"""Conformance: archives of pytorch/serve's own example handlers and of TorchServe's built-in handlers
run unchanged wherever tsctl runs archives, with the same answers.

Every case of samples/ts_examples.py (an ImageClassifier subclass for MNIST, the built-in
image_classifier, object_detector and image_segmenter, custom metrics with their own metrics.yaml,
TorchServe's MicroBatching (threads that never end), a transformers handler that prints, the
``file.py:function`` entry point, the working-directory probe) is packaged by ``tsctl package`` and by
``torch-model-archiver`` and run five ways: in-process (``LocalModel``; each request its own batch, as
TorchServe runs them with batchSize 1), served by TorchServe 0.12, served by the KServe engine
(``archiver.engines.TsctlRuntime``: the tsctl engine), by ``tsctl run --json`` as a user runs it (a
whole process in a project whose config/config.properties holds what the example's README puts in
TorchServe's; it must print one JSON document, end within RUN_TIMEOUT and leave no process behind), and
served by MLServer 1.7.1 with tsctl's runtime (``tsctl serve --engine mlserver --config`` with
TorchServe's config; each input sent as ``tsctl predict --content-type`` sends it, one BYTES element of
the Open Inference Protocol, the answer read as a client reads it: the JSON of output-0's one BYTES
element, or the error's message; helpers/v2_answers.py). Equal means: the same statuses; the same JSON
structure (keys in the same order, lists of the same length, the same strings and integers); floats
within 1e-4 relative + 1e-5 absolute; errors with the same message (``tsctl run`` stops at a request the
handler failed as a whole, naming its error: ``compare_run``). The custom metrics must reach the
worker's log (TorchServe, in-process), and the names of /metrics (the tsctl engine, MLServer).

A case's reference is TorchServe serving torch-model-archiver's archive: pytorch/serve's own path.
Every other cell must equal it, or name why not: ``EXPECTED`` holds the documented reasons that are
nobody's bug here (the reference itself then answers that way too), ``BUGS`` the cells where tsctl
is at fault, marked xfail(strict=True) so that they fail the day the bug is fixed. resnet_18
packaged by tsctl runs tsctl's own image handler (``--handler image_classifier``): its cells are
compared with TorchServe's built-in like the others, and test_tsctl_image_classifier_is_within_1e_5
_of_the_builtin holds it to 1e-5 absolute, in ``make test``.

``make test`` runs the smoke path: the SMOKE cases packaged by tsctl, on one TorchServe, compared with
in-process (every case in ``make matrix``); ``tsctl run`` of the custom_metrics case (the
other ``RUN_CASES``, micro_batching and transformer, in ``make matrix``); and tsctl's acceptance of
torch-model-archiver's --handler spellings; MLServer's is tests/engine/test_mlserver.py (the mnist example
packaged by torch-model-archiver answering as in-process, ``make matrix``). ``pytest -m matrix
tests/conformance/test_conformance.py`` runs every cell (both packagers x the five runtimes: 13 minutes
alone, MLServer's two columns 3 of them) and writes the table to /tmp/conformance_table.md (or
``TSCTL_CONFORMANCE_TABLE``).

``TSCTL_PYTORCH_SERVE=/path/to/serve`` (a pytorch/serve checkout) runs the mnist, resnet_18,
custom_metrics, micro_batching and transformer cases with pytorch/serve's own handler and model files.
"""

import base64
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import pytest

from archiver import engines, server
from archiver.errors import ServerFailure, UserError
from archiver.properties import write_config
from handlers.requests import content_type
from helpers.paths import short_tmp
from helpers.processes import run_alone
from helpers.servers import RunningServer
from helpers.v2_answers import AnswerShape, ask_v2
from samples import runtime_env, ts_examples
from samples.ts_examples import PACKAGERS, RUNTIMES
from serving.local_model import LoadError, LocalModel, RequestInput

SERVE = ts_examples.checkout()  # None: the stand-ins; else pytorch/serve's files for the cases below
REAL = SERVE is not None
CASES = (
    "mnist",
    "resnet_18",
    "resnet_18_ts",
    "object_detector",
    "image_segmenter",
    "custom_metrics",
    "micro_batching",
    "transformer",
    "function",
    "function_named",
    "workdir",
)
# make test's cases: the rest (object_detector's and image_segmenter's 160 and 136 MB models, the transformer,
# micro_batching's threads) took 150 of the smoke's 230 s, and are make matrix's
SMOKE = ("mnist", "resnet_18", "resnet_18_ts", "custom_metrics", "function", "function_named", "workdir")
TMA = "torch-model-archiver"
IN_PROCESS, TORCHSERVE, KSERVE, TSCTL_RUN, MLSERVER = RUNTIMES
REFERENCE = (TMA, TORCHSERVE)
RTOL, ATOL = 1e-4, 1e-5
TABLE = Path(os.environ.get("TSCTL_CONFORMANCE_TABLE", "/tmp/conformance_table.md"))
SUFFIXES = {"image/png": ".png", "image/jpeg": ".jpg", "application/json": ".json", "text/plain": ".txt"}
RUN_TIMEOUT = 180  # s for one `tsctl run`: a run the handler's threads keep alive fails its cell
RUN_FAILED = "tsctl run failed: "
MLSERVER_ENGINE = engines.ENGINES["mlserver"]

# ---- why a cell may differ ----------------------------------------------------------------------------
# Documented, and nobody's bug here: the reference answers the same way.
EXPECTED = {
    "transformer": "pytorch/serve's Transformer_handler_generalized.py calls tokenizer.encode_plus, which "
    "transformers 5 removed: every request fails in preprocess (503 Prediction failed) on every runtime",
}
EXPECTED = {case: reason for case, reason in EXPECTED.items() if REAL}

# tsctl's: (short, for the table; long, for the xfail)
BUGS: Dict[str, Tuple[str, str]] = {}  # none open: metrics_config and the handler spellings were fixed


def bug(case: str, runtime: str) -> Optional[str]:
    """The BUGS key of a cell answering unlike TorchServe because of tsctl, or None."""
    return None


def marked(case: str, runtime: str, packager: str = "tsctl"):
    key = bug(case, runtime)
    if key is None:
        return pytest.param(case, packager, runtime, id=f"{case}-{packager}-{runtime}")
    return pytest.param(
        case,
        packager,
        runtime,
        id=f"{case}-{packager}-{runtime}",
        marks=pytest.mark.xfail(strict=True, reason=BUGS[key][1]),
    )


def smoke_or_matrix(param, case: str):
    """``param`` as it is for a SMOKE case, else make matrix's."""
    if case in SMOKE:
        return param
    return pytest.param(*param.values, id=param.id, marks=[*param.marks, pytest.mark.matrix])


# ---- the answers ----------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one runtime made of one archive: an answer (status, JSON or text) per request, or why
    there is none (not packaged, failed to load, server failed); the custom metric names emitted."""

    answers: Optional[List[Tuple[int, object]]] = None
    error: Optional[str] = None
    metrics: Set[str] = field(default_factory=set)


@dataclass
class Store:
    path: Path
    archives: Dict[str, Path]
    refused: Dict[str, str]  # case -> what the packager said


METRIC = re.compile(r"\[METRICS\]([A-Za-z0-9_]+)\.")


def message_of(body) -> str:
    """An error body's message as TorchServe words it: the engine's and in-process's "Prediction failed"
    carry the handler's error after it (docs/engines.md), TorchServe's not."""
    message = str(body.get("message", body)) if isinstance(body, dict) else str(body)
    return re.sub(r"^Prediction failed: .*", "Prediction failed", message, flags=re.S)


def short(value, limit=120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def difference(got, want, atol=ATOL, rtol=RTOL) -> Tuple[Optional[str], float]:
    """(None, largest |Δ| of the floats) when ``got`` equals ``want``, else (where they first differ, ...)."""
    worst = 0.0

    def walk(g, w, where) -> Optional[str]:
        nonlocal worst
        if isinstance(w, bool) or w is None or isinstance(w, (str, bytes)):
            return None if type(g) is type(w) and g == w else f"{where}: {short(g)} != {short(w)}"
        if isinstance(w, (int, float)):
            if isinstance(g, bool) or not isinstance(g, (int, float)):
                return f"{where}: {short(g)} != {w!r}"
            if isinstance(w, int) and isinstance(g, int):
                return None if g == w else f"{where}: {g} != {w}"
            delta = abs(g - w)
            worst = max(worst, delta)
            return None if delta <= atol + rtol * abs(w) else f"{where}: {g!r} != {w!r} (|Δ| {delta:.2g})"
        if isinstance(w, dict):
            if not isinstance(g, dict) or list(g) != list(w):
                keys = list(g) if isinstance(g, dict) else g
                return f"{where}: {short(keys)} != keys {short(list(w))}"
            return next((r for r in (walk(g[k], w[k], f"{where}.{k}") for k in w) if r), None)
        if isinstance(w, list):
            if not isinstance(g, list) or len(g) != len(w):
                return f"{where}: {short(g)} != a list of {len(w)}"
            return next((r for r in (walk(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(g, w))) if r), None)
        return None if g == w else f"{where}: {short(g)} != {short(w)}"

    return walk(got, want, "answer"), worst


def compare_run(got: Outcome, want: Outcome) -> Tuple[Optional[str], float]:
    """``compare`` for `tsctl run`, which stops at the first request the handler failed as a whole
    (one line with the handler's error, exit 1) where TorchServe answers it 503 Prediction failed:
    equal when the reference answers every request so."""
    failed = want.answers and all(status == 503 and message_of(a) == "Prediction failed" for status, a in want.answers)
    if failed and got.error and got.error.startswith(RUN_FAILED) and "the handler failed on" in got.error:
        return None, 0.0
    return compare(got, want)


def compare(got: Outcome, want: Outcome, atol=ATOL, rtol=RTOL) -> Tuple[Optional[str], float]:
    """(None, largest |Δ|) when every answer of ``got`` equals ``want``'s, else (the first difference, ...)."""
    if want.error:
        return f"the reference has no answers: {want.error}", 0.0
    if got.error:
        return got.error, 0.0
    if len(got.answers) != len(want.answers):
        return f"{len(got.answers)} answers for {len(want.answers)} requests", 0.0
    worst = 0.0
    for i, ((status, answer), (want_status, wanted)) in enumerate(zip(got.answers, want.answers)):
        if status != want_status:
            return f"request {i}: status {status} != {want_status} ({short(message_of(answer))})", worst
        if status >= 400:
            if message_of(answer) != message_of(wanted):
                return f"request {i}: {short(message_of(answer))} != {short(message_of(wanted))}", worst
            continue
        problem, delta = difference(answer, wanted, atol, rtol)
        worst = max(worst, delta)
        if problem:
            return f"request {i}: {problem}", worst
    return None, worst


# ---- building and running ------------------------------------------------------------------------
class Runs:
    """Every (packager, runtime) of every case, each computed once per session, on demand."""

    def __init__(self, examples: Dict[str, ts_examples.Example], root: Path):
        self.examples, self.root = examples, root
        self.stores: Dict[str, Store] = {}
        self.columns: Dict[Tuple[str, str], Dict[str, Outcome]] = {}

    def store(self, packager: str) -> Store:
        if packager not in self.stores:
            path = self.root / packager / "model-store"
            archives, refused = {}, {}
            for name, example in self.examples.items():
                try:
                    archives[name] = ts_examples.package(example, packager, path)
                except ts_examples.PackagingError as exc:
                    said = exc.output.splitlines()[-1] if exc.output else f"exit code {exc.code}"
                    handler = example.spelled.get(packager, example.handler)
                    refused[name] = f"{Path(exc.command[0]).name} --handler {handler}: {said}"
            self.stores[packager] = Store(path, archives, refused)
        return self.stores[packager]

    def outcome(self, case: str, packager: str, runtime: str) -> Outcome:
        key = (packager, runtime)
        if runtime == TSCTL_RUN:  # one process per archive: computed per case
            column, store = self.columns.setdefault(key, {}), self.store(packager)
            if case not in column:
                refused = store.refused.get(case)
                archive = store.archives.get(case)
                column[case] = Outcome(error=f"not packaged: {refused}") if refused else self.tsctl_run(case, archive)
            return column[case]
        if key not in self.columns:
            runners = {
                IN_PROCESS: self.in_process,
                TORCHSERVE: self.torchserve,
                KSERVE: self.kserve_engine,
                MLSERVER: self.mlserver,
            }
            run = runners[runtime]
            store = self.store(packager)
            column = {name: Outcome(error=f"not packaged: {why}") for name, why in store.refused.items()}
            column.update(run(packager, store))
            self.columns[key] = column
        return self.columns[key][case]

    def in_process(self, packager: str, store: Store) -> Dict[str, Outcome]:
        outcomes = {}
        for name, archive in store.archives.items():
            try:
                metrics_config = self.examples[name].properties.get("metrics_config")
                with LocalModel(archive, batch_size=1, metrics_config=metrics_config) as model:
                    answers = []
                    for body, kind in self.examples[name].inputs:
                        [response] = model.predict([RequestInput(body, {"Content-Type": kind})])
                        answers.append((response.status, response.answer()))
                # closed: every line the worker's metrics cache logged has been read
                outcomes[name] = Outcome(answers, metrics={m for line in model.metrics for m in METRIC.findall(line)})
            except Exception as exc:  # noqa: BLE001 - the handler's own error (raised in its worker: LoadError) is the outcome
                error = exc.error_type.rpartition(".")[2] if isinstance(exc, LoadError) else type(exc).__name__
                outcomes[name] = Outcome(error=f"LocalModel failed to load: {error}: {exc}"[:400])
        return outcomes

    def tsctl_run(self, case: str, archive: Path) -> Outcome:
        """``tsctl run --json ARCHIVE FILE...`` as a user runs it: a whole process, in a project whose
        config/config.properties holds what the example's README puts in TorchServe's (metrics_config),
        each input a file whose suffix gives its content type. Its stdout must be one JSON document (a
        handler's prints go to its log), and it must end within RUN_TIMEOUT, the handler's threads or
        not, leaving no process behind."""
        example = self.examples[case]
        project = Path(tempfile.mkdtemp(prefix=f"run-{case}-", dir=self.root))
        files = []
        for number, (body, kind) in enumerate(example.inputs):
            files.append(project / f"input{number}{SUFFIXES[kind]}")
            files[-1].write_bytes(body)
            assert content_type(files[-1]) == kind, (files[-1], kind)
        if example.properties:
            (project / "config").mkdir()
            lines = "".join(f"{key}={value}\n" for key, value in example.properties.items())
            (project / "config" / "config.properties").write_text(lines)
        done = run_alone([ts_examples.BIN / "tsctl", "run", "--json", archive, *files], project, RUN_TIMEOUT)
        if done.code is None:
            return Outcome(error=f"tsctl run did not exit within {RUN_TIMEOUT} s: {done.stderr[-300:]}")
        if done.left:
            return Outcome(error=f"tsctl run exited ({done.seconds:.0f} s) leaving processes {done.left} running")
        try:
            document = json.loads(done.stdout)
        except ValueError:
            return Outcome(error=f"tsctl run's stdout is not one JSON document: {short(done.stdout, 300)}")
        if "error" in document:
            return Outcome(error=RUN_FAILED + document["error"]["message"][:400])
        answers = [
            (r["status"], base64.b64decode(r["answer"]) if r["base64"] else r["answer"]) for r in document["results"]
        ]
        return Outcome(answers)

    def groups(self, packager: str, store: Store) -> List[List[str]]:
        """Archives served together: those that loaded in-process share one server; one that did not is
        served alone, so it cannot take the others down."""
        loaded = [name for name in store.archives if self.outcome(name, packager, IN_PROCESS).answers is not None]
        return [loaded] + [[name] for name in store.archives if name not in loaded]

    def serve(self, packager: str, store: Store, start) -> Dict[str, Outcome]:
        outcomes = {}
        for group in filter(None, self.groups(packager, store)):
            outcomes.update(self.serve_group(store, group, start))
        return outcomes

    def serve_group(self, store: Store, names: List[str], start) -> Dict[str, Outcome]:
        directory = short_tmp("cf-")
        try:
            for name in names:
                os.link(store.archives[name], directory / store.archives[name].name)
            try:
                return start(directory, names)
            except (ServerFailure, UserError) as exc:
                if len(names) > 1:  # find the one that failed; the others still get their answers
                    outcomes = {}
                    for name in names:
                        outcomes.update(self.serve_group(store, [name], start))
                    return outcomes
                return {names[0]: Outcome(error=f"the server did not start: {exc}"[:400])}
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def requests(self, srv, names: List[str]) -> Dict[str, Outcome]:
        outcomes = {}
        for name in names:
            answers = []
            for body, kind in self.examples[name].inputs:
                status, answer = server.request(
                    engines.predict_url(srv, name), body, "POST", {"Content-Type": kind}, 120
                )
                answers.append((status, answer))
            outcomes[name] = Outcome(answers)
        return outcomes

    def torchserve(self, packager: str, store: Store) -> Dict[str, Outcome]:
        def start(directory: Path, names: List[str]) -> Dict[str, Outcome]:
            running = RunningServer(directory)
            lines = [f"{k}={v}" for name in names for k, v in self.examples[name].properties.items()]
            if lines:  # what the example's README puts in config.properties (metrics_config)
                with open(running.config, "a") as config:
                    config.write("\n".join(lines) + "\n")
            try:
                with running as srv:
                    outcomes = self.requests(srv, names)
                    logs = "\n".join(p.read_text(errors="replace") for p in sorted(srv.logs.glob("*.log")))
            finally:
                shutil.rmtree(running.home, ignore_errors=True)  # also when it did not start
            for name in names:
                worker = re.compile(rf"W-\d+-{re.escape(name)}_[0-9.]+-std(out|err)")  # the worker's own lines
                outcomes[name].metrics = {
                    m.group(1) for line in logs.splitlines() if worker.search(line) for m in METRIC.finditer(line)
                }
            return outcomes

        return self.serve(packager, store, start)

    def kserve_engine(self, packager: str, store: Store) -> Dict[str, Outcome]:
        def start(directory: Path, names: List[str]) -> Dict[str, Outcome]:
            home = short_tmp("ke-")
            try:
                properties = [self.examples[n].properties for n in names]
                metrics_config = next((p["metrics_config"] for p in properties if "metrics_config" in p), None)
                engine = engines.ENGINES["tsctl"]
                srv = engine.start(directory, home=home, timeout=300, metrics_config=metrics_config)
                try:
                    outcomes = self.requests(srv, names)
                    status, exposed = server.request(srv.metrics_url, timeout=30)  # the workers' metrics, by name
                finally:
                    engine.stop(srv)
            finally:
                shutil.rmtree(home, ignore_errors=True)
            seen = exposed_names(exposed) if status == 200 else set()
            for name in names:  # one /metrics for every model: names only
                outcomes[name].metrics = seen
            return outcomes

        return self.serve(packager, store, start)

    def mlserver(self, packager: str, store: Store) -> Dict[str, Outcome]:
        """MLServer with tsctl's runtime, started as ``tsctl serve --engine mlserver --config`` starts it
        (the config TorchServe gets: what the example's README puts in config.properties); each input sent
        as ``tsctl predict --content-type`` sends it, the answer read as a client reads it (``ask_v2``)."""

        def start(directory: Path, names: List[str]) -> Dict[str, Outcome]:
            home = short_tmp("mc-")
            try:
                extra = {k: v for name in names for k, v in self.examples[name].properties.items()}
                config = write_config(directory, home / "config.properties", extra=extra)
                srv = MLSERVER_ENGINE.start(
                    directory, config=str(config), home=home, timeout=300, python=str(runtime_env.ensure_mlserver())
                )
                try:
                    outcomes = {name: self.over_v2(srv, name) for name in names}
                    wanted = {m for name in names for m in self.examples[name].metrics}
                    seen = scrape_names(srv, wanted)
                finally:
                    MLSERVER_ENGINE.stop(srv)
            finally:
                shutil.rmtree(home, ignore_errors=True)
            for name in names:  # one /metrics for every model: names only
                outcomes[name].metrics = seen
            return outcomes

        return self.serve(packager, store, start)

    def over_v2(self, srv, name: str) -> Outcome:
        try:
            return Outcome([ask_v2(srv, name, body, kind) for body, kind in self.examples[name].inputs])
        except AnswerShape as exc:
            return Outcome(error=f"not one BYTES output-0: {exc}")


HISTOGRAM_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*?)(?:_bucket|_count|_sum)?[{ ]", re.M)  # a histogram's by its name


def exposed_names(text: str) -> Set[str]:
    """The metric names of a Prometheus exposition's samples."""
    return set(HISTOGRAM_SAMPLE.findall(text))


def scrape_names(srv, wanted: Set[str], within: float = 10) -> Set[str]:
    """The metric names on ``srv``'s /metrics, read again until each of ``wanted`` is there (the workers'
    last metric lines reach MLServer's registry after their answers) or ``within`` s passed."""
    deadline = time.monotonic() + within
    while True:
        status, text = server.request(srv.metrics_url, timeout=30)
        seen = exposed_names(text) if status == 200 else set()
        if wanted <= seen or time.monotonic() > deadline:
            return seen
        time.sleep(0.5)


@pytest.fixture(scope="session")
def examples(tmp_path_factory) -> Dict[str, ts_examples.Example]:
    built = ts_examples.build(tmp_path_factory.mktemp("ts_examples"), SERVE)
    assert tuple(e.name for e in built) == CASES
    return {e.name: e for e in built}


@pytest.fixture(scope="session")
def runs(examples, tmp_path_factory) -> Runs:
    return Runs(examples, tmp_path_factory.mktemp("conformance"))


@pytest.fixture(scope="session")
def smoke_runs(examples, tmp_path_factory) -> Runs:
    """``make test``'s cases alone (SMOKE), on a TorchServe of their own."""
    return Runs({name: examples[name] for name in SMOKE}, tmp_path_factory.mktemp("smoke"))


def runs_of(request, case: str) -> Runs:
    """The runs a make-test check of ``case`` reads: the smoke's for a SMOKE case, else every case's."""
    return request.getfixturevalue("smoke_runs" if case in SMOKE else "runs")


# ---- the table --------------------------------------------------------------------------------------
CELLS: Dict[Tuple[str, str, str], str] = {}


@pytest.fixture(scope="module", autouse=True)
def table(request):
    """Written once the module ran, when the matrix ran (every cell, both packagers)."""
    yield
    if not any(packager == TMA for _, packager, _ in CELLS):
        return
    examples = request.getfixturevalue("examples")
    source = f"pytorch/serve's files from {SERVE}" if REAL else "stand-ins (samples/ts_examples/)"
    notes = [f"- `{e.name}`: {e.note}" for e in examples.values() if e.note]
    notes += [f"- `{case}`: {reason}" for case, reason in EXPECTED.items()]
    found = sorted({bug(case, runtime) for case, _, runtime in CELLS} - {None})
    notes += [f"- {BUGS[key][0]}: {BUGS[key][1]}" for key in found]
    text = (
        f"Each case packaged by `tsctl package` and by `torch-model-archiver`, run in-process (`LocalModel`), "
        f"on TorchServe 0.12, on the KServe engine, by `tsctl run --json` (a whole process) and on MLServer 1.7.1 "
        f"(each input as `tsctl predict --content-type` sends it, output-0's BYTES element read as JSON); every answer "
        f"compared with TorchServe serving torch-model-archiver's archive (the reference): equal = same statuses "
        f"and JSON, floats within {RTOL:.0e} relative + {ATOL:.0e} absolute (Δ: the largest float difference). "
        f"Handler and model files: "
        f"{source}.\n\n" + ts_examples.render_table(list(examples.values()), CELLS) + "\n" + "\n".join(notes) + "\n"
    )
    TABLE.write_text(text)
    print(f"\nconformance table written to {TABLE}\n{text}")


def verdict(problem: Optional[str], delta: float, reference: Outcome) -> str:
    if problem:
        return f"differs: {problem}"
    text = "equal" + (f" (Δ {delta:.1e})" if delta else "")
    statuses = sorted({status for status, _ in reference.answers})
    if statuses != [200]:
        text += f" (all {'/'.join(map(str, statuses))}: see note)"
    return text


# ---- checks shared by the smoke test and the matrix ----------------------------------------------
def check_reference(example: ts_examples.Example, outcome: Outcome, where: str):
    """The answers a reference must give: every request answered (200, unless EXPECTED says why not),
    and the working-directory probe in its model directory."""
    assert outcome.error is None, f"{example.name} on {where}: {outcome.error}"
    statuses = [status for status, _ in outcome.answers]
    if example.name in EXPECTED:
        assert all(s >= 400 for s in statuses), (example.name, EXPECTED[example.name], outcome.answers)
    else:
        assert statuses == [200] * len(example.inputs), (example.name, where, outcome.answers)
    if example.name == "workdir":
        for _, answer in outcome.answers:
            assert answer == {"cwd_is_model_dir": True, "relative_path_finds_archive_file": True}, (where, answer)


def check_metrics(example: ts_examples.Example, outcome: Outcome, where: str):
    if example.metrics and outcome.answers and example.name not in EXPECTED:
        missing = sorted(set(example.metrics) - outcome.metrics)
        assert not missing, f"{where}: custom metrics not emitted: {missing} (seen: {sorted(outcome.metrics)})"


# ---- make test: tsctl's archives on TorchServe and in-process --------------------------------------
@pytest.mark.matrix  # 138 s: every archive on TorchServe; make test serves some (test_bundling, README flow)
def test_torchserve_serves_every_tsctl_archive(runs, examples):
    """One TorchServe, every case packaged by tsctl: each answers (or fails as EXPECTED says, as the
    reference does), the custom metrics reach the worker's log, the probe runs in its model directory."""
    for case, example in examples.items():
        served = runs.outcome(case, "tsctl", TORCHSERVE)
        check_reference(example, served, "TorchServe")
        check_metrics(example, served, "TorchServe")


@pytest.mark.parametrize("case, packager, runtime", [smoke_or_matrix(marked(case, IN_PROCESS), case) for case in CASES])
def test_tsctl_archive_answers_in_process_as_on_torchserve(case, packager, runtime, request, examples):
    runs = runs_of(request, case)
    local = runs.outcome(case, packager, runtime)
    problem, _ = compare(local, runs.outcome(case, packager, TORCHSERVE))
    assert problem is None, f"{case}: in-process {problem}"
    check_metrics(examples[case], local, "in-process")


# issue #31: a metrics.yaml from config/config.properties, a handler's threads that never end, its prints
RUN_CASES = ("custom_metrics", "micro_batching", "transformer")


@pytest.mark.parametrize("case", [RUN_CASES[0], *(pytest.param(c, marks=pytest.mark.matrix) for c in RUN_CASES[1:])])
def test_tsctl_run_answers_as_torchserve(case, request):
    """`tsctl run --json` as a whole process (``Runs.tsctl_run``, about 7 s each): it finds the example's
    metrics.yaml as `tsctl serve` would, ends though the handler's threads do not, prints one JSON
    document though the handler prints, and answers as TorchServe does."""
    runs = runs_of(request, case)
    problem, _ = compare_run(runs.outcome(case, "tsctl", TSCTL_RUN), runs.outcome(case, "tsctl", TORCHSERVE))
    assert problem is None, f"{case}: tsctl run {problem}"


def test_tsctl_image_classifier_is_within_1e_5_of_the_builtin(smoke_runs):
    """``--handler image_classifier`` is tsctl's own handler: its answers against TorchServe's built-in
    (the same files packaged with ``--handler ts.torch_handler.image_classifier``), in-process."""
    ours = smoke_runs.outcome("resnet_18", "tsctl", IN_PROCESS)
    builtin = smoke_runs.outcome("resnet_18_ts", "tsctl", IN_PROCESS)
    assert ours.error is None and builtin.error is None, (ours.error, builtin.error)
    problem, delta = compare(ours, builtin, atol=1e-5, rtol=0)
    assert problem is None, f"max |Δ| {delta:.1e}: {problem}"


class TsctlRefused(Exception):
    pass


@pytest.mark.parametrize("spelling", ["DIR/my_handler:my_function", "DIR/my_handler"])
def test_tsctl_package_takes_torch_model_archivers_handler_spellings(spelling, examples, smoke_runs, tmp_path):
    """torch-model-archiver appends ``.py`` to a handler without one (and so takes ``my_handler:function``
    but not ``my_handler.py:function``); tsctl must take what it takes, to the same archive behaviour."""
    handler = spelling.replace("DIR", str(ts_examples.STAND_INS / "function"))
    case = "function_named" if ":" in spelling else "function"
    example = ts_examples.Example(case, handler, examples[case].inputs, serialized_file=examples[case].serialized_file)
    assert ts_examples.package(example, TMA, tmp_path / "tma").is_file()  # the premise: it takes this spelling
    try:
        archive = ts_examples.package(example, "tsctl", tmp_path / "tsctl")
    except ts_examples.PackagingError as exc:
        raise TsctlRefused(str(exc)) from None
    with LocalModel(archive, batch_size=1) as model:
        answers = [model.predict([RequestInput(body, {"Content-Type": kind})])[0] for body, kind in example.inputs]
    reference = smoke_runs.outcome(case, "tsctl", IN_PROCESS)
    problem, _ = compare(Outcome([(r.status, r.answer()) for r in answers]), reference)
    assert problem is None, problem


# ---- make matrix: every cell -----------------------------------------------------------------------
MATRIX = [marked(case, runtime, packager) for case in CASES for packager in PACKAGERS for runtime in RUNTIMES]


def reference_of(example: ts_examples.Example, packager: str) -> Tuple[str, str, str]:
    """(case, packager, runtime) whose answers this case's cells must equal."""
    case = example.same_as or example.name
    return (case, *REFERENCE) if TMA in example.packagers else (case, "tsctl", TORCHSERVE)


@pytest.mark.matrix
@pytest.mark.parametrize("case, packager, runtime", MATRIX)
def test_cell(case, packager, runtime, runs, examples):
    example = examples[case]
    if packager not in example.packagers:  # a spelling this packager refuses: check that it does
        got = runs.outcome(case, packager, runtime)
        CELLS[(case, packager, runtime)] = f"not packaged ({packager} refuses this --handler)"
        assert got.error and got.error.startswith("not packaged"), f"{packager} now packages {case}: {got}"
        return
    ref_case, ref_packager, ref_runtime = reference_of(example, packager)
    reference = runs.outcome(ref_case, ref_packager, ref_runtime)
    check_reference(examples[ref_case], reference, f"{ref_packager} on {ref_runtime}")
    got = runs.outcome(case, packager, runtime)
    if (case, packager, runtime) == (ref_case, ref_packager, ref_runtime):
        CELLS[(case, packager, runtime)] = "reference"
        check_metrics(example, got, runtime)
        return
    problem, delta = (compare_run if runtime == TSCTL_RUN else compare)(got, reference)
    key = bug(case, runtime)
    CELLS[(case, packager, runtime)] = (
        f"differs ({BUGS[key][0]})" if problem and key else verdict(problem, delta, reference)
    )
    assert problem is None, f"{case} {packager} {runtime}: {problem}"
    if runtime != TSCTL_RUN:  # run prints answers; its worker's metrics stay in its log
        check_metrics(example, got, runtime)
