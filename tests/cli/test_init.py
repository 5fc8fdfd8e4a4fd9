"""tsctl init: for every --from, a handler of one's own that passes the test generated with it,
validates and records itself when packaged (MAR-INF/tsctl.json), and, for the image kind, serves on a
real TorchServe as it answers in-process. The command itself imports no torch; the table it writes
model-config.yaml from is the real Settings classes'.

The generated tests run as a user runs them (``python -m pytest NAME/test_NAME.py`` where
``tsctl init`` ran), in two pytest processes started by the first test, each running several
handlers' tests together (as a user running ``python -m pytest`` over a project of several handlers
does), while the other tests go on; the last tests collect them."""

import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Set

import pytest
import yaml
from click.testing import CliRunner

from archiver import engines, handler_resolution, properties, scaffold, server
from archiver.cli import main
from archiver.model_config import check_model_config
from handlers import identity
from helpers import archive_reading
from helpers.models import export_tree
from helpers.paths import ROOT, short_tmp
from helpers.servers import RunningServer, batch_lines, post_concurrently, post_to_concurrently
from serving.local_model import LocalModel

# One NAME per kind: plain, short, one whose class would shadow the toolkit's, one with a hyphen.
NAMES = {
    "token_classifier": "ner",
    "text_embedder": "text_embedder",
    "text_classifier": "sentiment",
    "image_classifier": "pets",
    "blank": "scorer-v2",
}
CLASSES = {
    "token_classifier": "Ner",
    "text_embedder": "MyTextEmbedder",
    "text_classifier": "Sentiment",
    "image_classifier": "Pets",
    "blank": "ScorerV2",
}


def tsctl(*args, cwd: Path):
    """``tsctl ARGS`` run in ``cwd``, in-process."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, [str(arg) for arg in args])
    finally:
        os.chdir(old)


# The generated tests, in two pytest processes of several handlers each (about the same time each).
TOGETHER = (("blank", "image_classifier", "token_classifier"), ("text_classifier", "text_embedder"))
# Starts whose generated tests are make matrix's (the token classifier's process alone 60-95 s of make test's);
# make test runs the others'.
MATRIX_KINDS = ("token_classifier", "text_embedder", "text_classifier")
EACH = "test_the_generated_test_passes"
SEVERAL = "test_the_generated_tests_of_several_handlers_run_in_one_pytest_process"


def selected_kinds(session) -> Set[str]:
    """The starts whose generated tests this session's selected tests read: every start for the test of
    several handlers in one process."""
    if any(item.originalname == SEVERAL for item in session.items):
        return set(NAMES)
    return {item.callspec.params["kind"] for item in session.items if item.originalname == EACH}


def run_generated_tests(root: Path, names) -> subprocess.CompletedProcess:
    """``python -m pytest NAME/test_NAME.py ...`` for every name, in one pytest process, verbose (a line
    per test: ``NAME/test_NAME.py::test_x PASSED``)."""
    started = time.monotonic()
    tests = [f"{name}/{scaffold.test_file(name)}" for name in names]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *tests, "-v", "-rs", "-p", "no:cacheprovider"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    done.seconds = time.monotonic() - started
    return done


@dataclass
class Project:
    root: Path
    outputs: Dict[str, str]  # what tsctl init printed, per kind
    runs: Dict[str, concurrent.futures.Future]  # the generated tests, running: the process of each kind's

    def handler(self, kind: str) -> Path:
        return self.root / NAMES[kind] / "handler.py"

    def config(self, kind: str) -> Path:
        return self.root / NAMES[kind] / "model-config.yaml"


@pytest.fixture(scope="module")
def project(request, tmp_path_factory):
    """``tsctl init NAME --from HANDLER`` for every start in one directory; the generated tests the session
    selected start."""
    root = tmp_path_factory.mktemp("project")
    outputs = {}
    for kind, name in NAMES.items():
        result = tsctl("init", name, "--from", kind, cwd=root)
        assert result.exit_code == 0, result.output
        outputs[kind] = result.output
    pool = concurrent.futures.ThreadPoolExecutor(len(TOGETHER))
    runs = {}
    wanted = selected_kinds(request.session)
    for kinds in TOGETHER:
        kinds = [kind for kind in kinds if kind in wanted]
        if kinds:
            future = pool.submit(run_generated_tests, root, [NAMES[kind] for kind in kinds])
            runs.update({kind: future for kind in kinds})
    try:
        yield Project(root, outputs, runs)
    finally:
        for future in runs.values():
            future.cancel()
        pool.shutdown(wait=True)


def handler_class(path: Path):
    """The class the handler file serves with ``handle = entry_point(...)``, as tsctl package finds it."""
    return handler_resolution.load_handler_file(path).handle.handler_class


# ---- the files --------------------------------------------------------------------------------------
def test_init_writes_a_handler_its_config_and_a_test(project):
    for kind, name in NAMES.items():
        spec, klass = scaffold.STARTS[kind], CLASSES[kind]
        assert sorted(p.name for p in (project.root / name).iterdir()) == sorted(scaffold.files(name))
        source = project.handler(kind).read_text()
        assert f"class {klass}({spec.class_name}):" in source and f"handle = entry_point({klass})" in source
        assert f"class {klass}Settings({spec.settings}):" in source
        assert f"tsctl package --model-name {name} --handler {name}/handler.py" in source
        for hook in ("decode", "preprocess", "inference", "postprocess") + (("load_model",) if kind == "blank" else ()):
            assert f"    def {hook}(self" in source, (kind, hook)
        if kind != "blank":
            assert "return super().decode(item)" in source
        output = project.outputs[kind]
        for file_name in scaffold.files(name):
            assert f"wrote {name}/{file_name}" in output
        for command in (f"python -m pytest {name}/test_{name}.py", "tsctl config", "tsctl serve", "tsctl stop"):
            assert f"\n  {command}\n" in output, (kind, command)
        assert f"tsctl predict {name} {spec.predict}\n" in output
        assert f"  tsctl package --model-name {name} --handler {name}/handler.py --config-file " in output


def test_the_generated_files_are_lint_clean(project):
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed in this environment")
    done = subprocess.run(
        [str(ruff), "check", "--config", str(ROOT / "pyproject.toml"), "--no-cache", "."],
        cwd=project.root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("kind", list(NAMES))
def test_model_config_holds_every_setting_with_its_default_and_passes_validation(project, kind):
    config = yaml.safe_load(project.config(kind).read_text())
    assert {k: config[k] for k, _, _ in scaffold.WORKER_KEYS} == {k: v for k, v, _ in scaffold.WORKER_KEYS}
    settings = handler_class(project.handler(kind)).Settings
    defaults = {key: scaffold.plain(value) for key, value in dataclasses.asdict(settings()).items()}
    assert config["handler"] == defaults  # every key, the handler's own included, with its default
    check_model_config(project.config(kind), settings)  # what tsctl package checks
    text = project.config(kind).read_text()
    assert re.search(r"^  allow_pickle: false +# let torch.load unpickle", text, re.M)  # the field's comment


def test_the_settings_table_is_the_handlers_settings():
    """templates/settings.json is written from the Settings classes; a handler whose settings changed
    needs it written again."""
    assert json.loads(json.dumps(scaffold.settings_table())) == scaffold.read_table(), (
        "archiver/templates/settings.json is out of date: run .venv/bin/python -m archiver.scaffold"
    )


# ---- refusals, and no torch --------------------------------------------------------------------------
def test_init_refuses_what_it_cannot_write(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    (tmp_path / "afile").write_text("mine")
    cases = {
        ("taken", "blank"): "taken/ already exists and is not empty: pick another NAME, or remove it",
        ("afile", "blank"): "afile already exists and is not a directory",
        ("1st", "blank"): "invalid NAME '1st'",
        ("a b", "blank"): "invalid NAME 'a b'",
        ("../up", "blank"): "invalid NAME '../up'",
        ("x" * 65, "blank"): "invalid NAME",
        ("handlers", "blank"): "NAME 'handlers' is the name of one of tsctl's own packages",
    }
    for (name, kind), message in cases.items():
        result = tsctl("init", name, "--from", kind, cwd=tmp_path)
        assert result.exit_code == 2, result.output
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine" and sorted(os.listdir(tmp_path)) == [
        "afile",
        "taken",
    ]
    result = tsctl("init", "fine", "--from", "resnet", cwd=tmp_path)
    assert result.exit_code == 2 and "Invalid value for '--from'" in result.stderr
    assert "image_classifier" in result.stderr
    (tmp_path / "empty").mkdir()
    assert tsctl("init", "empty", "--from", "blank", cwd=tmp_path).exit_code == 0  # an empty directory is fine


def test_init_imports_no_torch(tmp_path):
    code = (
        "import sys, time\n"
        "started = time.monotonic()\n"
        "from click.testing import CliRunner\n"
        "from archiver.cli import main\n"
        "for kind in ('image_classifier', 'text_embedder', 'blank'):\n"
        "    result = CliRunner().invoke(main, ['init', 'x_' + kind, '--from', kind])\n"
        "    assert result.exit_code == 0, result.output\n"
        "print(sorted(m for m in ('torch', 'transformers', 'PIL', 'torchvision') if m in sys.modules))\n"
        "print(time.monotonic() - started)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    modules, seconds = done.stdout.splitlines()
    assert modules == "[]"
    assert float(seconds) < 20  # imports and three inits; importing torch alone takes longer on a busy machine


# ---- packaged, recorded, served ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def packaged(project, image_sample, text_samples):
    """Each generated handler packaged with ``tsctl package`` (the sample models), in a store of its own."""
    import torch

    weights = project.root / "weights.pt"
    torch.save({"weight": torch.tensor([0.5, -1.0, 2.0, 0.25])}, weights)
    files = {
        "image_classifier": [
            "--serialized-file",
            image_sample / "resnet18.pt",
            "--model-file",
            image_sample / "model.py",
            "--extra-files",
            image_sample / "index_to_name.json",
        ],
        "text_classifier": ["--serialized-file", text_samples / "classifier"],
        "token_classifier": ["--serialized-file", text_samples / "tagger"],
        "text_embedder": ["--serialized-file", text_samples / "classifier"],
        "blank": ["--serialized-file", weights],
    }
    archives = {}
    for kind, name in NAMES.items():
        store = project.root / f"store-{kind}"
        result = tsctl(
            "package",
            "--model-name",
            name,
            "--handler",
            f"{name}/handler.py",
            "--config-file",
            f"{name}/model-config.yaml",
            *files[kind],
            "--export-path",
            store,
            cwd=project.root,
        )
        assert result.exit_code == 0, result.output
        archives[kind] = store / f"{name}.mar"
    return archives


@pytest.mark.parametrize("kind", list(NAMES))
def test_the_package_records_the_generated_class(packaged, kind):
    record = identity.read(packaged[kind])
    spec = scaffold.STARTS[kind]
    assert (record["class"], record["input"]) == (CLASSES[kind], spec.input)
    assert (record["module"], record["entry"]) == ("handler", "handler.py")
    assert record["bases"][0] == f"{spec.module}.{spec.class_name}"
    names = {name for name, _ in archive_reading.members(packaged[kind])}
    assert {"handler.py", "model-config.yaml", "handlers/base.py"} <= names


@pytest.mark.matrix  # make matrix (53 s): make test serves it on tsctl's engine
def test_the_generated_image_handler_serves_on_torchserve_as_in_process(packaged, jpegs):
    archive = packaged["image_classifier"]
    with LocalModel(archive) as model:
        expected = [response.json() for response in model.predict(jpegs[:4])]
    assert all(len(answer) == 5 for answer in expected)
    with RunningServer(archive.parent) as srv:
        answers = post_concurrently(srv, "pets", jpegs[:4])
        assert max(line["size"] for line in batch_lines(srv)) > 1  # batchSize 8 from the generated config
    assert_same(answers, expected)


@pytest.mark.matrix
def test_the_generated_image_handler_serves_on_the_kserve_engine_as_in_process(packaged, jpegs):
    archive = packaged["image_classifier"]
    with LocalModel(archive) as model:
        expected = [response.json() for response in model.predict(jpegs[:4])]
    # the same archive, no Java
    engine = engines.ENGINES["tsctl"].start(archive.parent, home=short_tmp("ki-"), timeout=240)
    try:
        url = engines.predict_url(engine, "pets")[len(engine.inference) :]
        answers = post_to_concurrently(engine, url, jpegs[:4], "image/jpeg")
        assert max(line["size"] for line in batch_lines(engine)) > 1
    finally:
        server.stop(engine)
    assert_same(answers, expected)


def assert_same(answers, expected):
    for (status, body), want in zip(answers, expected):
        assert status == 200, body
        assert list(body) == list(want)
        assert list(body.values()) == pytest.approx(list(want.values()), rel=1e-4)


def test_export_keeps_the_generated_handlers_batch_size(packaged, tmp_path):
    """A subclass is the toolkit handler it is: KServe's envelope steps aside for it, so export keeps
    its batchSize (8, from the generated config) and says nothing about it."""
    shutil.copytree(packaged["image_classifier"].parent, tmp_path / "model-store")
    out = export_tree(tmp_path)
    config = out / "config" / "config.properties"
    snapshot = properties.snapshot_of(properties.read_properties(config), config)
    assert snapshot["models"]["pets"]["1.0"]["batchSize"] == 8


# ---- the generated tests, as a user runs them ------------------------------------------------------------
@pytest.mark.matrix  # make matrix (70 s): make test runs the generated tests of the starts not in MATRIX_KINDS
def test_the_generated_tests_of_several_handlers_run_in_one_pytest_process(project):
    """Each process ran several handlers' tests together: no two test files share a module name (two
    test_handler.py were pytest's "import file mismatch", exit 2 before any test ran)."""
    assert set(project.runs) == set(NAMES) and all(len(kinds) > 1 for kinds in TOGETHER)
    for kinds in TOGETHER:
        done = project.runs[kinds[0]].result(timeout=900)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        assert "import file mismatch" not in output
        ran = {line.split("/", 1)[0] for line in output.splitlines() if "::test_" in line and " PASSED" in line}
        assert ran == {NAMES[kind] for kind in kinds}, output


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.matrix) if k in MATRIX_KINDS else k for k in NAMES])
def test_the_generated_test_passes(project, kind):
    done = project.runs[kind].result(timeout=900)
    output = done.stdout + done.stderr
    name = NAMES[kind]
    mine = [line for line in output.splitlines() if line.startswith(f"{name}/{scaffold.test_file(name)}::")]
    outcomes = [line.split()[1] if len(line.split()) > 1 else "" for line in mine]
    assert len(mine) >= 3 and set(outcomes) == {"PASSED"}, output
    print(f"{name}/{scaffold.test_file(name)}: {len(mine)} passed (its process: {done.seconds:.0f} s)")


@pytest.mark.parametrize(
    "kind, weights, said",
    [
        ("text_classifier", "resnet18.pt", "subclasses text_classifier: --serialized-file {w} is a file, but"),
        ("image_classifier", "classifier", "subclasses image_classifier: --serialized-file {w} is a Hugging Face"),
    ],
)
def test_a_generated_handler_is_checked_against_its_model_as_its_toolkit_base_is(
    project, image_sample, text_samples, kind, weights, said
):
    """A TextClassifier subclass packaged resnet18.pt, an ImageClassifier subclass a BERT directory: both
    were written, and failed only when served ('--handler text_classifier' itself was refused)."""
    path = image_sample / weights if weights.endswith(".pt") else text_samples / weights
    name = NAMES[kind]
    store = project.root / f"misfit-{kind}"
    result = tsctl(
        "package",
        "--model-name",
        name,
        "--handler",
        f"{name}/handler.py",
        "--serialized-file",
        path,
        "--export-path",
        store,
        cwd=project.root,
    )
    assert result.exit_code == 2, result.output
    assert said.format(w=path) in result.output and not store.exists(), result.output
