"""tsctl bench --capacity (docs/capacity.md): the knee and the p99 point on made-up curves, the stopping
rule, the queue gauge read from an exposition, the result file's reader refusing bad files, one-line
refusals of bad values; then real sweeps: the tsctl engine started by bench inside a cgroup (make test),
TorchServe 0.12 and MLServer (matrix), and a server 'tsctl serve' started, measured through --home."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver import engines, properties
from archiver.capacity import sweep as capacity
from archiver.capacity.cgroup_limits import ROOT as CGROUPS
from archiver.capacity.cgroup_limits import parse_memory
from archiver.cli import main
from archiver.errors import UserError
from helpers.management import BIN, ECHO
from helpers.paths import short_tmp


def curve(*points, errors=()):
    """Steps at 1, 2, 4, ... with (throughput, p99) each; the concurrencies in ``errors`` had errors."""
    steps = []
    for index, (rate, p99) in enumerate(points):
        concurrency = 2**index
        steps.append(
            {
                "concurrency": concurrency,
                "requests": 100,
                "seconds": 1.0,
                "throughput_rps": rate,
                "p50_ms": p99 / 2,
                "p90_ms": p99 * 0.8,
                "p99_ms": p99,
                "errors": 3 if concurrency in errors else 0,
                "queue_depth": None,
            }
        )
    return steps


def test_the_knee_is_the_fewest_clients_reaching_95_percent_of_the_best():
    steps = curve((10, 20), (19, 22), (30, 30), (31, 60), (31.5, 130), (30, 260))
    assert capacity.knee(steps) == {"concurrency": 4, "throughput_rps": 30, "p99_ms": 30}  # 30 >= 0.95 * 31.5
    rising = curve((10, 20), (20, 22), (40, 30))
    assert capacity.knee(rising)["concurrency"] == 4  # still growing: the last step
    flat = curve((50, 20), (50, 40), (49, 80))
    assert capacity.knee(flat)["concurrency"] == 1
    # a step with errors does not count, however fast its failures come back
    shedding = curve((10, 20), (19, 22), (80, 5), errors=(4,))
    assert capacity.knee(shedding)["concurrency"] == 2
    assert capacity.knee(curve((10, 20), errors=(1,))) is None


def test_within_p99_is_the_most_clients_holding_the_target():
    steps = curve((10, 20), (19, 40), (30, 90), (31, 210))
    assert capacity.within_p99(steps, 100) == {"concurrency": 4, "throughput_rps": 30, "p99_ms": 90}
    assert capacity.within_p99(steps, 40)["concurrency"] == 2  # at the target holds it
    assert capacity.within_p99(steps, 10) is None  # none holds it
    assert capacity.within_p99(steps, None) is None  # no target
    assert capacity.within_p99(curve((10, 20), (19, 40), errors=(2,)), 100)["concurrency"] == 1


def test_a_p99_from_too_few_answers_is_kept_marked_and_not_used():
    """Issue #47: a sweep on a loaded machine gave a "p99" from 7 requests, and the export sized from it."""
    steps = curve((10, 20), (19, 40), (30, 90))
    steps[2]["requests"] = capacity.MIN_P99_REQUESTS - 1
    assert capacity.within_p99(steps, 100)["concurrency"] == 2
    doc = capacity.document(
        "m", "tsctl", {}, [("a.jpg", 1)], 100, steps, "flat", measured_on={"cpus": 2, "load_average": 0.3}
    )
    assert doc["within_p99"]["concurrency"] == 2 and doc["machine"] == {"cpus": 2, "load_average": 0.3}
    assert doc["notes"] == [
        "p99 from too few answers (99 at concurrency 4; under 100): not a percentile, not used "
        "for within_p99; measure with --requests 100 or more and a --duration long enough for "
        "them"
    ]
    busy = capacity.document(
        "m", "tsctl", {}, [("a.jpg", 1)], 100, curve((10, 20)), "flat", measured_on={"cpus": 2, "load_average": 1.5}
    )
    assert busy["notes"] == [
        "the machine was busy before the sweep (1-minute load average 1.5 on 2 CPUs): other "
        "work shared its CPUs, so the throughput and p99 are lower bounds; measure on a quiet "
        "machine"
    ]


def test_the_sweep_stops_flat_past_twice_the_target_or_on_errors():
    def reason(steps, target=None):
        return capacity.stop_reason(steps, target)

    assert reason(curve((10, 20), (19, 22))) is None
    assert reason(curve((10, 20), (19, 22), (30, 30), (31, 60))) is None  # one flat step is not enough
    assert reason(curve((10, 20), (19, 22), (30, 30), (31, 60), (31.4, 130))) == "flat"  # two under 5%
    assert reason(curve((10, 20), (19, 22), (30, 30), (31, 60), (40, 130))) is None  # growth again
    assert reason(curve((10, 20), (19, 22), (18, 30), (17, 60))) == "flat"  # falling counts as flat
    assert reason(curve((10, 20), (19, 201)), target=100) == "p99"
    assert reason(curve((10, 20), (19, 200)), target=100) is None  # twice the target is not past it
    assert reason(curve((10, 20), (19, 22), errors=(2,))) == "errors"
    assert capacity.concurrencies(8) == [1, 2, 4, 8] and capacity.concurrencies(12) == [1, 2, 4, 8, 12]
    assert capacity.concurrencies(1) == [1]


def test_the_queue_gauge_is_read_per_model_summed_over_versions():
    exposition = """\
# HELP ts_queue_size Requests waiting in the model version's job queue for a worker
# TYPE ts_queue_size gauge
ts_queue_size{model_name="echo",model_version="1.0",hostname="h"} 3.0
ts_queue_size{model_name="echo",model_version="2.0",hostname="h"} 2.0
ts_queue_size{model_name="other",model_version="1.0",hostname="h"} 7.0
ts_queue_size_total{model_name="echo"} 100.0
ts_requests_in_flight{model_name="echo",model_version="1.0",hostname="h"} 9.0
"""
    assert capacity.queue_depth(exposition, "echo") == 5.0
    assert capacity.queue_depth(exposition, "other") == 7.0
    assert capacity.queue_depth(exposition, "missing") is None
    assert capacity.queue_depth('ts_inference_requests_total{model_name="echo"} 4.0\n', "echo") is None


def test_memory_quantities_are_kubernetes_ones():
    assert parse_memory("4Gi") == 4 * 2**30 and parse_memory("4G") == 4 * 10**9
    assert parse_memory("512Mi") == 512 * 2**20 and parse_memory("1.5Gi") == 3 * 2**29
    assert parse_memory(str(2**30)) == 2**30
    for bad in ("lots", "4GB", "-1Gi", "1Mi", ""):
        with pytest.raises(UserError, match="--memory"):
            parse_memory(bad)


def good_document():
    return capacity.document(
        "echo",
        "tsctl",
        {"workers": 1, "batch_size": 4, "max_batch_delay_ms": 10, "cpu": None, "memory_bytes": None},
        [("in.txt", 6)],
        100.0,
        curve((10, 20), (19, 40), (30, 90)),
        "bound",
    )


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda d: d.update(format="tsctl-capacity/2"), "format"),
        (lambda d: d.pop("model"), "model"),
        (lambda d: d["server"].update(workers="two"), "server.workers"),
        (lambda d: d["server"].update(cpu=-1), "server.cpu"),
        (lambda d: d.update(steps=[]), "steps"),
        (lambda d: d["steps"][1].update(throughput_rps=None), "steps[1].throughput_rps"),
        (lambda d: d["steps"][0].update(concurrency=0), "steps[0].concurrency"),
        (lambda d: d["steps"][2].update(errors=True), "steps[2].errors"),
        (lambda d: d["steps"][0].update(queue_depth={"mean": "x", "max": 1}), "steps[0].queue_depth.mean"),
        (lambda d: d.pop("knee"), "knee"),
        (lambda d: d["knee"].update(p99_ms=float("nan")), "knee.p99_ms"),
        (lambda d: d.update(within_p99=[4]), "within_p99"),
        (lambda d: d.update(p99_target_ms="fast"), "p99_target_ms"),
    ],
)
def test_the_reader_names_the_file_and_the_key(tmp_path, change, key):
    doc = good_document()
    path = tmp_path / "good.json"
    path.write_text(json.dumps(doc))
    assert capacity.load(path) == json.loads(json.dumps(doc))
    change(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError) as refused:
        capacity.load(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: key {key!r} must be ") and "\n" not in message, message


def test_the_reader_refuses_what_is_not_a_result(tmp_path):
    cases = [
        ("none.json", None, "cannot read it"),
        ("text.json", "kitten", "not JSON"),
        ("list.json", "[1]", "key 'format'"),
        ("bytes.json", b"\xff\xfe", "not JSON"),
    ]
    for name, text, said in cases:
        path = tmp_path / name
        if isinstance(text, bytes):
            path.write_bytes(text)
        elif text is not None:
            path.write_text(text)
        with pytest.raises(UserError, match=said) as refused:
            capacity.load(path)
        assert str(refused.value).startswith(str(path)) and "\n" not in str(refused.value)


@pytest.fixture(scope="module")
def echo_tree(tmp_path_factory):
    """root/model-store/echo.mar (batchSize 4, maxBatchDelay 10, 2 workers) and root/config.properties
    naming it, root/in.txt to send."""
    root = tmp_path_factory.mktemp("capacity")
    (root / "echo.py").write_text(ECHO)
    (root / "echo.yaml").write_text("minWorkers: 2\nmaxWorkers: 2\nbatchSize: 4\nmaxBatchDelay: 10\n")
    store = root / "model-store"
    store.mkdir()
    command = [
        str(BIN / "torch-model-archiver"),
        "--model-name",
        "echo",
        "--version",
        "1.0",
        "--handler",
        str(root / "echo.py"),
        "--config-file",
        str(root / "echo.yaml"),
        "--export-path",
        str(store),
    ]
    subprocess.run(command, check=True, capture_output=True, env=dict(os.environ, TMPDIR=str(root)))
    properties.write_config(store, root / "config.properties")
    (root / "in.txt").write_text("hello")
    return root


@pytest.fixture(autouse=True)
def elsewhere(tmp_path, monkeypatch):
    """Each test runs in a directory of its own: a command given no --config reads ./config/config.properties,
    which the README's flow writes in the checkout (found by the newcomer: two tests failed after it)."""
    monkeypatch.chdir(tmp_path)


def capacity_groups():
    return sorted(str(p) for p in CGROUPS.rglob("tsctl-capacity-*") if p.is_dir())


@pytest.mark.parametrize(
    "args, said",
    [
        ("--capacity --p99-ms 0", "--p99-ms 0 must be a number above 0"),
        ("--capacity --p99-ms nan", "--p99-ms nan must be a number above 0"),
        ("--capacity --model-store {store} --cpu 0", "--cpu 0 must be a number above 0"),
        ("--capacity --model-store {store} --memory lots", "--memory 'lots' must be bytes or a quantity"),
        ("--capacity --model-store {store} --engine triton", "--engine 'triton' must be one of"),
        ("--capacity --model-store {root}/nowhere", "is not a directory"),
        ("--capacity --cpu 1", "--cpu is for the server bench starts: give --model-store too"),
        ("--capacity --concurrency 4", "--capacity sweeps the concurrency itself"),
        ("--capacity --max-concurrency 1000", "above 256"),
        ("--capacity --out {root}/nowhere/r.json", "its directory does not exist"),
        ("--capacity", "no server is running from"),
        ("--p99-ms 100 --requests 5", "--p99-ms is an option of --capacity"),
    ],
)
def test_bad_values_are_one_line_refusals(echo_tree, args, said):
    args = args.format(store=echo_tree / "model-store", root=echo_tree).split()
    command = ["bench", "echo", "--input", str(echo_tree / "in.txt"), "--home", str(echo_tree / "no-server"), *args]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and said in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_a_model_the_store_does_not_serve_is_refused_before_anything_starts(echo_tree):
    for extra in ([], ["--config", str(echo_tree / "config.properties")]):
        command = [
            "bench",
            "nosuch",
            "--capacity",
            "--input",
            str(echo_tree / "in.txt"),
            "--model-store",
            str(echo_tree / "model-store"),
            "--engine",
            "tsctl",
            *extra,
        ]
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2 and "serves no model 'nosuch': it serves echo" in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def sweep(root: Path, engine: str, *extra: str):
    out = root / f"{engine}.json"
    args = [
        "bench",
        "--capacity",
        "echo",
        "--input",
        str(root / "in.txt"),
        "--requests",
        "150",
        "--duration",
        "1",
        "--max-concurrency",
        "4",
        "--p99-ms",
        "2000",
        "--out",
        str(out),
        *extra,
    ]
    result = CliRunner().invoke(main, args)
    return result, out


def check_result(result, out: Path, engine: str, as_json: bool = False):
    """What every sweep's result must say, whichever server ran it (``as_json``: printed as the file is)."""
    assert result.exit_code == 0, result.output
    doc = capacity.load(out)
    if as_json:
        assert json.loads(result.output) == doc
        return doc
    assert doc["engine"] == engine and doc["model"] == "echo" and doc["input"] == {"files": ["in.txt"], "bytes": [5]}
    steps = doc["steps"]
    assert [s["concurrency"] for s in steps] == [1, 2, 4][: len(steps)] and doc["stopped"] in ("bound", "flat")
    assert all(s["errors"] == 0 and 0 < s["requests"] <= 150 and s["seconds"] < 1 + 5 for s in steps)
    assert all(0 < s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"] for s in steps)
    assert doc["knee"]["concurrency"] in [s["concurrency"] for s in steps]
    assert doc["within_p99"] is not None and doc["p99_target_ms"] == 2000
    lines = result.output.splitlines()
    assert lines[0].startswith("echo on the ") and lines[1].split()[:3] == ["clients", "req/s", "p50"]
    assert any(line.startswith("knee: ") for line in lines)
    assert any(line.startswith("within p99 2000 ms: ") for line in lines)
    return doc


def test_the_engine_started_in_a_cgroup_is_swept(echo_tree, tmp_path):
    """About 8 s: the tsctl engine started by bench on the store (workers and batching from the archive's
    model-config.yaml), inside 1 CPU and 1Gi where a cgroup can be made, queue depth from its /metrics;
    the result file, its plot, the cgroups removed after."""
    before = capacity_groups()
    result, out = sweep(
        echo_tree,
        "tsctl",
        "--model-store",
        str(echo_tree / "model-store"),
        "--engine",
        "tsctl",
        "--cpu",
        "1",
        "--memory",
        "1Gi",
        "--plot",
        str(tmp_path / "curve.png"),
    )
    doc = check_result(result, out, "tsctl")
    server = doc["server"]
    assert (server["workers"], server["batch_size"], server["max_batch_delay_ms"]) == (2, 4, 10)
    if "runs in a cgroup v" in doc["notes"][0]:
        assert server["cpu"] == 1.0 and server["memory_bytes"] == 2**30
    else:  # this machine makes none: said so, and nothing claimed
        assert "not applied" in doc["notes"][0] and server["cpu"] is None and server["memory_bytes"] is None
    assert f"note: {doc['notes'][0]}" in result.output
    assert all(s["queue_depth"] is not None and s["queue_depth"]["samples"] >= 1 for s in doc["steps"])
    assert doc["queue_gauge"] == "ts_queue_size"
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not set(capacity_groups()) - set(before)  # released (another suite's groups may come and go meanwhile)


@pytest.mark.matrix  # TorchServe's JVM: about 15 s
def test_torchserve_is_swept_with_its_config(echo_tree):
    result, out = sweep(
        echo_tree,
        "torchserve",
        "--model-store",
        str(echo_tree / "model-store"),
        "--config",
        str(echo_tree / "config.properties"),
        "--engine",
        "torchserve",
    )
    doc = check_result(result, out, "torchserve")
    assert (doc["server"]["workers"], doc["server"]["batch_size"]) == (2, 4)
    assert all(s["queue_depth"] is None for s in doc["steps"]) and doc["queue_gauge"] is None
    assert any("exports no ts_queue_size" in note for note in doc["notes"])


@pytest.mark.matrix  # MLServer's start: about 20 s
def test_mlserver_is_swept(echo_tree):
    from samples import runtime_env

    python = str(runtime_env.ensure_mlserver())
    result, out = sweep(
        echo_tree,
        "mlserver",
        "--model-store",
        str(echo_tree / "model-store"),
        "--engine",
        "mlserver",
        "--python",
        python,
        "--json",
    )
    doc = check_result(result, out, "mlserver", as_json=True)
    assert (doc["server"]["workers"], doc["server"]["batch_size"]) == (2, 4)
    assert all(s["queue_depth"] is None for s in doc["steps"])


@pytest.mark.matrix  # about 8 s
def test_the_server_tsctl_serve_started_is_swept_through_home(echo_tree):
    home = short_tmp("cap-")
    srv = engines.ENGINES["tsctl"].start(echo_tree / "model-store", None, home)
    try:
        result, out = sweep(echo_tree, "tsctl", "--home", str(home))
        doc = check_result(result, out, "tsctl")
    finally:
        engines.engine_of(srv).stop(srv)
    server = doc["server"]  # read from its management API; no limits applied by bench
    assert (server["workers"], server["batch_size"], server["max_batch_delay_ms"]) == (2, 4, 10)
    assert server["cpu"] is None and server["memory_bytes"] is None and doc["notes"] == []


def test_a_quota_below_the_cores_is_noted_unless_threads_are_set(monkeypatch):
    from archiver.capacity.replica import threads_note

    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads_note(None) is None and threads_note(cores) is None
    assert f"TorchServe sees {cores} cores under a 0.5 CPU quota" in threads_note(0.5, "torchserve")
    # the tsctl engine and MLServer's runtime give each worker OMP_NUM_THREADS from the quota themselves
    assert threads_note(0.5, "tsctl") is None and threads_note(0.5, "mlserver") is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads_note(0.5) is None


@pytest.mark.matrix  # about 15 s: the engine started twice, interrupted while it starts and mid-sweep
@pytest.mark.parametrize("after", [1.5, 8.0])
def test_ctrl_c_leaves_no_cgroup_and_no_server(echo_tree, after):
    """Ctrl-C (SIGINT to tsctl's process group; the server it started has a session of its own) while the
    engine starts and while the sweep runs: tsctl exits 130 (one line), its cgroups are removed (which the kernel allows
    only once no process is left in them) and no process of the server is left."""
    import signal
    import time

    before = capacity_groups()
    args = [
        str(BIN / "tsctl"),
        "bench",
        "--capacity",
        "echo",
        "--input",
        str(echo_tree / "in.txt"),
        "--duration",
        "3",
        "--max-concurrency",
        "8",
        "--model-store",
        str(echo_tree / "model-store"),
        "--config",
        str(echo_tree / "config.properties"),
        "--engine",
        "tsctl",
        "--cpu",
        "1",
        "--memory",
        "1Gi",
    ]
    run = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, text=True)
    time.sleep(after)
    during = [g for g in capacity_groups() if g not in before]
    held = {
        pid
        for g in during
        for name in ("tasks", "cgroup.procs")
        if (Path(g) / name).exists()
        for pid in (Path(g) / name).read_text().split()
    }
    os.killpg(run.pid, signal.SIGINT)
    try:
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130 and "Traceback" not in err, err
    if during:  # this machine made the cgroups: they held the server, and are gone with it
        assert held, "the server was not inside its cgroup"
        assert not set(capacity_groups()) - set(before)
        assert not [pid for pid in held if Path(f"/proc/{pid}").exists()]


def test_the_engine_in_a_cpu_quota_gives_its_workers_the_quotas_threads(tmp_path, monkeypatch):
    """About 4 s. The tsctl engine started inside a 1-CPU cgroup on a machine of more cores gives a model of
    one worker OMP_NUM_THREADS=1 (torch and numpy read it; the toolkit's handlers too): it gave the machine's
    cores, so every handler ran threads the quota then throttled (2-3x slower at 1 client, measured)."""
    from archiver.capacity.cgroup_limits import PodLimits
    from handlers import cpu_limit

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: a 1-CPU quota changes nothing here")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    (tmp_path / "echo.py").write_text(ECHO)
    (tmp_path / "echo.yaml").write_text("minWorkers: 1\nmaxWorkers: 1\n")
    store = tmp_path / "model-store"
    store.mkdir()
    archiver_args = [
        str(BIN / "torch-model-archiver"),
        "--model-name",
        "echo",
        "--version",
        "1.0",
        "--handler",
        str(tmp_path / "echo.py"),
        "--config-file",
        str(tmp_path / "echo.yaml"),
        "--export-path",
        str(store),
    ]
    subprocess.run(archiver_args, check=True, capture_output=True, env=dict(os.environ, TMPDIR=str(tmp_path)))
    config = properties.write_config(store, tmp_path / "config.properties")
    limits = PodLimits.make(1.0, None)
    if limits.reason:
        pytest.skip(limits.describe())
    home = short_tmp("omp-")
    try:
        with limits.joined():
            srv = engines.serve("tsctl", str(config), str(store), str(home), 120)
        try:
            group = limits.groups[0][0]
            pids = [p for p in (group / "cgroup.procs").read_text().split() if p != str(srv.pid)]
            threads = set()
            for pid in pids:
                try:
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                threads |= {v.split(b"=", 1)[1] for v in environ if v.startswith(b"OMP_NUM_THREADS=")}
        finally:
            engines.engine_of(srv).stop(srv)
    finally:
        limits.release()
    assert threads == {b"1"}, threads  # outside the quota it would be the cores: cpu_limit.usable()
    assert cpu_limit.usable() >= 2
