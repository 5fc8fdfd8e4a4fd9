"""``run``, ``verify`` and ``package --golden`` on archives in the shape of pytorch/serve's examples
(issue #31): custom_metrics, whose handler gets a metric declared only in the example's metrics.yaml
(TorchServe's ``metrics_config``), and micro_batching, whose handler starts threads that never end.

The archive runs in a TorchServe worker process (``LocalModel``); the metrics.yaml it reads is
``--metrics-config FILE``, else the ``metrics_config`` of the config.properties it is served with
(``--config``, else config/config.properties when there is one), a relative path read from the
current directory as TorchServe started there reads it. The archives are samples/ts_examples.py's
stand-ins, or pytorch/serve's own files with ``TSCTL_PYTORCH_SERVE``. The options run through click's
runner; whether a command ends, and what it leaves running, through whole processes (``make matrix``;
``tsctl run`` as a whole process is in tests/conformance/test_conformance.py's default run).
"""

import json
import shutil
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver.cli import main
from helpers.processes import run_alone
from samples import ts_examples

SUFFIXES = {"image/png": ".png", "image/jpeg": ".jpg"}
CASES = ("custom_metrics", "micro_batching")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Each case's example, its archive packaged by tsctl (no golden answers), and its inputs as files."""
    root = tmp_path_factory.mktemp("run-examples")
    serve = ts_examples.checkout()
    examples = {
        "custom_metrics": ts_examples.build_custom_metrics(root / "custom_metrics", serve),
        "micro_batching": ts_examples.build_micro_batching(root / "micro_batching", serve),
    }
    archives, inputs = {}, {}
    for name, example in examples.items():
        archives[name] = ts_examples.package(example, "tsctl", root / "store")
        folder = root / f"{name}-inputs"
        folder.mkdir()
        for number, (body, kind) in enumerate(example.inputs):
            (folder / f"input{number}{SUFFIXES[kind]}").write_bytes(body)
        inputs[name] = sorted(folder.iterdir())
    return examples, archives, inputs


def cli(*args, cwd: Path):
    """``tsctl ARGS`` through click's runner in ``cwd`` (stdout and stderr apart)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        return CliRunner().invoke(main, [str(a) for a in args])


def statuses(result) -> list:
    return [r["status"] for r in json.loads(result.stdout)["results"]]


def metrics_yaml(built) -> Path:
    return Path(built[0]["custom_metrics"].properties["metrics_config"])


# ---- custom_metrics: the metrics.yaml -------------------------------------------------------------------
def test_run_without_the_metrics_yaml_names_the_metric_and_the_option(built, tmp_path):
    """As on TorchServe without the example's config: every request fails in get_metric (about 3 s)."""
    _, archives, inputs = built
    result = cli("run", archives["custom_metrics"], *inputs["custom_metrics"], cwd=tmp_path)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.stderr
    assert "MetricsCacheKeyError" in lines[0] and "--metrics-config" in lines[0], lines[0]


def test_run_takes_the_metrics_yaml_as_an_option(built, tmp_path):
    """(About 4 s; config/config.properties' metrics_config: test_conformance.py's tsctl run, below.)"""
    _, archives, inputs = built
    files = inputs["custom_metrics"]
    given = cli(
        "run", "--json", "--metrics-config", metrics_yaml(built), archives["custom_metrics"], *files, cwd=tmp_path
    )
    assert given.exit_code == 0 and statuses(given) == [200] * len(files), given.output


@pytest.mark.matrix  # about 10 s: two loads
def test_run_reads_a_config_s_metrics_yaml_relative_to_the_current_directory(built, tmp_path):
    """config/config.properties' metrics_config relative to the current directory, as TorchServe started
    there reads it; --config naming another config."""
    _, archives, inputs = built
    archive, files = archives["custom_metrics"], inputs["custom_metrics"]
    project = tmp_path / "project"
    (project / "config").mkdir(parents=True)
    (project / "metrics").mkdir()
    shutil.copy(metrics_yaml(built), project / "metrics" / "mine.yaml")
    (project / "config" / "config.properties").write_text("metrics_config=metrics/mine.yaml\n")
    found = cli("run", "--json", archive, *files, cwd=project)
    assert found.exit_code == 0 and statuses(found) == [200] * len(files), found.output
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "other.properties").write_text(f"metrics_config={metrics_yaml(built)}\n")
    other = cli("run", "--json", "--config", "other.properties", archive, files[0], cwd=elsewhere)
    assert other.exit_code == 0 and statuses(other) == [200], other.output


@pytest.mark.parametrize(
    "flags, config, said",
    [
        (["--metrics-config", "missing.yaml"], None, "--metrics-config missing.yaml cannot be read"),
        (["--metrics-config", "list.yaml"], None, "not a YAML mapping"),
        ([], "metrics_config=missing.yaml\n", "metrics_config of config/config.properties missing.yaml cannot"),
        (["--config", "nowhere.properties"], None, "nowhere.properties does not exist"),
    ],
)
def test_a_metrics_yaml_that_cannot_be_read_is_one_line_before_the_archive_loads(built, tmp_path, flags, config, said):
    _, archives, inputs = built
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    if config:
        (tmp_path / "config").mkdir()
        (tmp_path / "config" / "config.properties").write_text(config)
    result = cli("run", *flags, archives["custom_metrics"], inputs["custom_metrics"][0], cwd=tmp_path)
    assert result.exit_code == 2 and said in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


def test_metrics_config_goes_with_an_in_process_run_only(built, tmp_path):
    examples, archives, _ = built
    yaml_file = metrics_yaml(built)
    served = cli(
        "verify", archives["custom_metrics"], "--url", "127.0.0.1:9", "--metrics-config", yaml_file, cwd=tmp_path
    )
    assert served.exit_code == 2 and "for the in-process run" in served.stderr, served.stderr
    flags = examples["custom_metrics"].flags("tsctl") + ["--export-path", tmp_path, "--metrics-config", yaml_file]
    package = cli("package", *flags, cwd=tmp_path)
    assert package.exit_code == 2 and "--metrics-config goes with --golden" in package.stderr, package.stderr


# ---- whole processes: package --golden and verify; nothing kept alive ---------------------------------------
def tsctl(*args, cwd: Path, env=None):
    return run_alone([ts_examples.BIN / "tsctl", *args], cwd=cwd, timeout=180, env=env)


def golden_package(example, inputs, project: Path, *extra, env=None):
    """``tsctl package ... --golden DIR`` of ``example`` into project/model-store, in ``project``."""
    golden = project / "golden"
    golden.mkdir(exist_ok=True)
    for path in inputs:
        shutil.copy(path, golden / path.name)
    flags = example.flags("tsctl") + ["--export-path", project / "model-store", "--golden", golden, "--force"]
    return tsctl("package", *flags, *extra, cwd=project, env=env), project / "model-store" / f"{example.name}.mar"


@pytest.mark.matrix  # about 30 s: four whole processes
def test_package_golden_and_verify_read_the_metrics_yaml_of_the_config(built, tmp_path):
    examples, _, inputs = built
    project = tmp_path / "project"
    (project / "config").mkdir(parents=True)
    (project / "config" / "config.properties").write_text(f"metrics_config={metrics_yaml(built)}\n")
    done, archive = golden_package(examples["custom_metrics"], inputs["custom_metrics"], project)
    assert done.code == 0, done.stderr
    verified = tsctl("verify", archive, cwd=project)
    assert verified.code == 0 and "3 of 3 golden answers match" in verified.stdout, verified.stdout + verified.stderr
    elsewhere = tsctl("verify", archive, cwd=tmp_path)  # TorchServe's metrics.yaml: every answer fails
    assert elsewhere.code == 1 and "0 of 3 golden answers match" in elsewhere.stdout, elsewhere.stdout
    given = tsctl("verify", archive, "--metrics-config", metrics_yaml(built), cwd=tmp_path)
    assert given.code == 0, given.stdout + given.stderr


@pytest.mark.matrix  # about 25 s each: three whole processes
@pytest.mark.parametrize("fork_server", ["1", "0"], ids=["forked", "spawned"])
def test_a_handlers_threads_keep_no_command_alive(built, tmp_path, fork_server):
    """micro_batching's MicroBatching threads never end: run, package --golden and verify each exit
    (within 60 s; each takes about 7) and leave no process of theirs running, its worker forked from
    the fork server or spawned (TSCTL_FORK_SERVER=0: a worker whose Python would wait for the threads
    at its exit)."""
    examples, archives, inputs = built
    env = {"TSCTL_FORK_SERVER": fork_server}
    runs = {"run": tsctl("run", archives["micro_batching"], *inputs["micro_batching"], cwd=tmp_path, env=env)}
    example = examples["micro_batching"]
    runs["package --golden"], archive = golden_package(example, inputs["micro_batching"], tmp_path, env=env)
    runs["verify"] = tsctl("verify", archive, cwd=tmp_path, env=env)
    for command, done in runs.items():
        assert done.code == 0 and done.seconds < 60, (command, done.code, done.seconds, done.stderr[-500:])
        assert not done.left, f"{command} left processes {done.left} running"


# ---- tsctl serve in the project directory: a relative metrics_config ------------------------------------
@pytest.fixture
def project(built, tmp_path):
    """The user's project: model-store/custom_metrics.mar, metrics/mine.yaml, and config/config.properties
    from 'tsctl config' naming it relatively (``metrics_config=metrics/mine.yaml``) as the example's README
    names its own, with ``model_metrics_auto_detect=true``."""
    _, archives, _ = built
    project = tmp_path / "project"
    (project / "model-store").mkdir(parents=True)
    (project / "metrics").mkdir()
    shutil.copy(archives["custom_metrics"], project / "model-store")
    shutil.copy(metrics_yaml(built), project / "metrics" / "mine.yaml")
    done = cli("config", cwd=project)
    assert done.exit_code == 0, done.output
    with open(project / "config" / "config.properties", "a") as config:
        config.write("metrics_config=metrics/mine.yaml\nmodel_metrics_auto_detect=true\n")
    return project


def test_the_config_s_metrics_yaml_is_read_from_the_current_directory(project, tmp_path):
    """What every engine of 'tsctl serve' is given (each runs in --home, .tsctl here): the config's relative
    metrics_config read from the current directory, as TorchServe started there reads it; a file that
    is not there is one line before any server starts."""
    from archiver.properties import config_metrics

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        assert config_metrics("config/config.properties") == str(project / "metrics" / "mine.yaml")
        assert config_metrics(None) is None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for engine in ("torchserve", "tsctl", "mlserver"):
        done = cli(
            "serve",
            "--engine",
            engine,
            "--config",
            project / "config" / "config.properties",
            "--model-store",
            project / "model-store",
            cwd=elsewhere,
        )
        said = "metrics_config of "
        assert done.exit_code == 2 and said in done.stderr and "metrics/mine.yaml cannot be read" in done.stderr, (
            engine,
            done.output,
        )
    assert not (elsewhere / ".tsctl").exists()


@pytest.mark.matrix  # about 100 s: TorchServe twice, the tsctl engine, MLServer
def test_serve_reads_a_relative_metrics_config_as_torchserve_started_in_the_project(built, project):
    """The user's flow (issue #31's custom_metrics): ``tsctl serve`` in the project directory. TorchServe 0.12
    started there reads ``metrics_config=metrics/mine.yaml`` from there (its frontend's working directory),
    and every request of the example answers; so does 'tsctl serve' on every engine, each running its
    server in --home (.tsctl, where that path is not), and 'tsctl run'."""
    from archiver import server
    from archiver.engines import torchserve_launch
    from samples import runtime_env

    _, _, inputs = built
    files = inputs["custom_metrics"]
    config, store = project / "config" / "config.properties", project / "model-store"
    # the reference: TorchServe run in the project directory (home), resolving the relative path itself
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        srv = torchserve_launch.start(config, store, project, env={"TS_METRICS_CONFIG": "metrics/mine.yaml"})
    try:
        want = [
            server.request(
                f"{srv.inference}/predictions/custom_metrics", f.read_bytes(), "POST", {"Content-Type": "image/png"}, 60
            )[0]
            for f in files
        ]
    finally:
        server.stop(srv)
    assert want == [200] * len(files), want
    python = ["--python", runtime_env.ensure_mlserver()]
    for engine, extra in (("torchserve", []), ("tsctl", []), ("mlserver", python)):
        done = cli("serve", "--engine", engine, *extra, "--timeout", 300, cwd=project)
        try:
            assert done.exit_code == 0, (engine, done.output)
            asked = cli("predict", "--json", "custom_metrics", *files, cwd=project)
            got = [r["status"] for r in json.loads(asked.stdout)["results"]]
        finally:
            stopped = cli("stop", cwd=project)
        assert stopped.exit_code == 0, stopped.output
        assert got == want, (engine, asked.output)
    ran = cli("run", "--json", project / "model-store" / "custom_metrics.mar", *files, cwd=project)
    assert ran.exit_code == 0 and statuses(ran) == want, ran.output


# ---- stateful: the files are one sequence ---------------------------------------------------------------
def test_run_sends_a_stateful_archives_files_as_one_sequence(tmp_path):
    """pytorch/serve's stateful example (sequenceBatching: true) sums a sequence's requests: run's files are
    one sequence, in order, the first with TorchServe's start header and the last with its end."""
    from samples import ts_stateful

    archives = ts_stateful.build(tmp_path / "store", idle_ms=5000)
    files = []
    for number in (1, 2, 3):
        files.append(tmp_path / f"input{number}.txt")
        files[-1].write_text(str(number))
    result = cli("run", archives["stateful"], *files, "--json", cwd=tmp_path)
    assert result.exit_code == 0, result.output
    assert [r["answer"] for r in json.loads(result.stdout)["results"]] == [1, 3, 6]
    result = cli("run", archives["running_sum"], *files, "--json", cwd=tmp_path)
    answers = [r["answer"] for r in json.loads(result.stdout)["results"]]
    seen = [(a["sum"], a["start"], a["end"]) for a in answers]
    assert seen == [(1, True, False), (3, False, False), (6, False, True)]


# ---- continuous batching and the model-config's other keys -----------------------------------------------
def test_run_drives_a_continuous_archives_steps_to_the_end(tmp_path):
    """A continuousBatching archive answers one token a step, ``ts_stream_next`` until its stopping
    criterion says done: run sends each request again step after step (it waited for ever on the first
    step before) and answers the parts joined (against TorchServe: tests/conformance/test_continuous_parity.py)."""
    from samples import ts_continuous

    archive = ts_continuous.build(tmp_path / "store", batch=4, step=0.01)
    (tmp_path / "prompt.json").write_text(json.dumps({"prompt": "hello there", "max_new_tokens": 4}))
    done = run_alone(
        [ts_examples.BIN / "tsctl", "run", "--json", archive, tmp_path / "prompt.json", tmp_path / "prompt.json"],
        cwd=tmp_path,
        timeout=120,
    )
    assert done.code == 0, done.stderr
    chunks = "".join(json.dumps({"text": f" hello{n}"}) for n in range(1, 5))
    assert [(r["status"], r["answer"]) for r in json.loads(done.stdout)["results"]] == [(200, chunks)] * 2


def test_run_takes_the_model_config_keys_as_the_engine_does(tmp_path):
    """serving/model_config_keys.py: a key the engine refuses stops run in one line naming the archive and
    the key; one it does not do is one note on stderr, the answers unchanged."""
    from samples import ts_continuous

    for key, refused in (("asyncCommunication", True), ("useJobTicket", False)):
        archive = ts_continuous.build(tmp_path / key, batch=2, step=0.01)
        with zipfile.ZipFile(archive) as mar:
            members = {name: mar.read(name) for name in mar.namelist()}
        members["model-config.yaml"] += f"{key}: true\n".encode()
        with zipfile.ZipFile(archive, "w") as mar:
            for name, data in members.items():
                mar.writestr(name, data)
        (tmp_path / "prompt.json").write_text(json.dumps({"prompt": "a", "max_new_tokens": 1}))
        result = cli("run", archive, tmp_path / "prompt.json", cwd=tmp_path)
        lines = result.stderr.strip().splitlines()
        if refused:
            assert result.exit_code == 2 and len(lines) == 1, result.output
            assert str(archive) in lines[0] and "asyncCommunication" in lines[0] and "traceback" not in result.output
        else:
            assert result.exit_code == 0, result.output
            assert lines == [
                f"note: {archive}'s model-config.yaml: useJobTicket: True is not done by the tsctl "
                "engine: requests wait in the job queue when every worker is busy, not refused at once"
            ]
            # at a terminal, where progress lines show too: the note still once, not again as progress
            shown = at_a_terminal(["run", str(archive), str(tmp_path / "prompt.json")], cwd=tmp_path)
            assert shown.count("is not done by the tsctl engine") == 1, shown


def at_a_terminal(args, cwd: Path) -> str:
    """What ``tsctl ARGS`` writes on stderr when its stdout is a terminal (a pseudo-terminal here)."""
    import os
    import pty
    import subprocess
    import sys

    controller, terminal = pty.openpty()
    try:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "tsctl"), *args],
            cwd=cwd,
            stdout=terminal,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=300,
        )
    finally:
        os.close(terminal)
        os.close(controller)
    assert done.returncode == 0, done.stderr
    return done.stderr
