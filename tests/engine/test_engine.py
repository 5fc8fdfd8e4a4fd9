"""The tsctl engine (``python -m serving.engine``) serving a TorchServe tree: a model store and its
config.properties, with an archive of ours and one torch-model-archiver made from a plain function.

Real processes, real HTTP and gRPC: the engine is started as a whole process, detached in its own
process group, on free 127.0.0.1 ports, and stopped with SIGTERM by the test that started it; each
test checks that no worker outlives it. Answers are compared with the archive run in-process
(``LocalModel``); v2 goes through tritonclient's HTTP and gRPC clients. The worker-death and
timeout tests kill and stall real worker processes and check that only the requests those workers
held fail, with 503, while their neighbours answer, and that the worker comes back.
"""

import base64
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton_http

from archiver import server
from helpers import grpc_client, waiting
from helpers.engine import BIN, Engine, received, snapshot_entry, write_config
from helpers.hostile import assert_close
from helpers.models import package_resnet
from samples.image_model import sample_jpeg
from serving.local_model import LocalModel

ECHO = '''\
import json, os, sys, time


def handle(data, context):
    """Echo each body with the worker's pid; 'sleep S' sleeps, 'exit' ends the worker process,
    'badheader' sets a response header HTTP cannot carry; loading sleeps when HANG is in the
    model's directory."""
    if data is None:
        if os.path.exists("HANG"):
            time.sleep(3600)
        return None
    answers = []
    for index, row in enumerate(data):
        body = row.get("body") if row.get("body") is not None else row.get("data")
        if isinstance(body, (bytes, bytearray)):
            body = bytes(body).decode()
        text = body if isinstance(body, str) else json.dumps(body)
        if text.startswith("sleep "):
            time.sleep(float(text.split()[1]))
        if text == "exit":
            sys.exit(3)
        if text == "badheader":
            context.set_response_header(index, "X-Split", "a\\r\\nX-Injected: 1")
        answers.append({"echo": text, "pid": os.getpid()})
    return answers
'''


@pytest.fixture(scope="module")
def resnet18_local(tree):
    """The tree's resnet18.mar in a worker, as the engine serves it (decode_input_request=false)."""
    with LocalModel(tree / "model-store" / "resnet18.mar", decode_input_request=False) as local:
        yield local


@pytest.fixture(scope="module")
def tree(image_sample, tmp_path_factory):
    """model-store/ (resnet18 of ours, echo made by torch-model-archiver) and config/config.properties."""
    root = tmp_path_factory.mktemp("engine")
    store = root / "model-store"
    package_resnet(image_sample, store, config_text="batchSize: 4\nmaxBatchDelay: 50\n")
    handler = root / "echo.py"
    handler.write_text(ECHO)
    command = [
        str(BIN / "torch-model-archiver"),
        "--model-name",
        "echo",
        "--version",
        "1.0",
        "--handler",
        str(handler),
        "--export-path",
        str(store),
    ]
    subprocess.run(command, check=True, capture_output=True, env=dict(os.environ, TMPDIR=str(root)))
    (root / "HANG").write_text("")  # a second echo whose load never ends: in its own store (test_a_stuck_load...)
    hang = root / "hang-store"
    hang.mkdir()
    command[command.index("echo")] = "hang"
    command[-1] = str(hang)
    command += ["--extra-files", str(root / "HANG")]
    subprocess.run(command, check=True, capture_output=True, env=dict(os.environ, TMPDIR=str(root)))
    models = {"resnet18": snapshot_entry("resnet18.mar", 1, 4, 50, 120), "echo": snapshot_entry("echo.mar", 2, 1, 0, 4)}
    (root / "config").mkdir()
    write_config(root / "config" / "config.properties", models)
    return root


@pytest.fixture(scope="module")
def engine(tree):
    running = Engine(tree).wait_ready()
    yield running
    running.stop()


def echo_json(engine, text: str, timeout: float = 60):
    return engine.post("/predictions/echo", text.encode(), "text/plain", timeout)


def test_it_serves_the_tree_under_torchservess_and_kserves_apis(engine, tree, image_sample, resnet18_local):
    status, listed = engine.get("/models")
    assert status == 200 and sorted(m["modelName"] for m in listed["models"]) == ["echo", "resnet18"]
    echo_workers = engine.workers("echo")
    assert len(echo_workers) == 2 and all(w["status"] == "READY" for w in echo_workers), echo_workers
    pids = {w["pid"] for w in echo_workers}
    assert len(pids) == 2 and all(Path(f"/proc/{pid}").exists() for pid in pids)
    status, described = engine.get("/models/resnet18")
    assert described[0]["batchSize"] == 4 and described[0]["maxBatchDelay"] == 50, described

    # The same answers as in-process, on TorchServe's route and KServe v1's, raw and as JSON.
    jpeg = sample_jpeg(3, (300, 200))
    v1 = json.dumps({"instances": [base64.b64encode(jpeg).decode()]}).encode()
    want_raw, want_v1 = [r.json() for r in resnet18_local.predict([jpeg, json.loads(v1)])]
    status, got = engine.post("/predictions/resnet18", jpeg, "image/jpeg")
    assert status == 200
    assert_close(got, want_raw)
    status, got = engine.post("/v1/models/resnet18:predict", v1, "application/json")
    assert status == 200
    assert_close(got, want_v1)

    # A function handler torch-model-archiver packaged: each request answered by one of two workers.
    answers = [echo_json(engine, f"hello {i}") for i in range(6)]
    assert all(status == 200 for status, _ in answers), answers
    assert {body["pid"] for _, body in answers} <= pids

    # A bad request fails alone, with the handler's 4xx on KServe's route too.
    status, body = engine.post("/v1/models/resnet18:predict", b"{bad", "application/json")
    assert status == 400 and body["error"], body
    assert engine.post("/predictions/nope", b"x")[0] == 404 and engine.post("/predictions/echo/9.9", b"x")[0] == 404


def test_v2_over_http_and_grpc_from_tritonclient(engine, resnet18_local):
    jpeg = sample_jpeg(5, (256, 256))
    data = [base64.b64encode(jpeg).decode()]
    body = {"inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": data}]}
    [want] = resnet18_local.predict([body])
    want = want.json()["outputs"][0]

    http = triton_http.InferenceServerClient(f"127.0.0.1:{engine.http}", network_timeout=60)
    assert http.is_server_ready() and http.is_model_ready("resnet18")
    tensor = triton_http.InferInput("input-0", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([jpeg], dtype=np.object_), binary_data=True)
    answer = http.infer("resnet18", [tensor]).as_numpy("output-0")  # binary, as tritonclient asks by default
    assert_close([json.loads(x) for x in answer], [json.loads(x) for x in want["data"]])

    got = grpc_client.call(f"127.0.0.1:{engine.grpc}", "resnet18", [jpeg])
    assert got["server_ready"] and got["model_ready"]
    assert_close([json.loads(x) for x in got["answers"]], [json.loads(x) for x in want["data"]])


def test_nothing_changes_state_and_every_listener_binds_where_rest_binds(engine):
    for path in ("/v2/repository/models/echo/unload", "/v2/repository/models/echo/load", "/models/echo"):
        status, _ = server.request(engine.url + path, b"", "POST", timeout=10)
        assert status in (404, 405), (path, status)
    got = grpc_client.call(f"127.0.0.1:{engine.grpc}", "echo", unload=True)
    assert "unimplemented" in got["unload_error"].lower() and got["ready_after"], got
    listening = listeners(engine.process.pid)
    assert {engine.http, engine.grpc} <= {port for _, port in listening}, listening
    assert all(address in ("127.0.0.1", "::ffff:127.0.0.1") for address, _ in listening), listening


def scraped(engine, names, wait: float = 15) -> str:
    """/metrics once every one of ``names`` is in it (or after ``wait`` s): the workers' metric lines
    (HandlerTime, PredictionTime) reach the engine on a channel of their own, read by a thread, so
    they may be read a moment after the answer they were emitted for was sent."""
    deadline = time.monotonic() + wait
    while True:
        status, text = engine.get("/metrics")
        assert status == 200
        if all(f"\n{name}{{" in text for name in names) or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def test_metrics_under_torchservess_names(engine):
    """After a request to each model (the module's first when it runs alone): every family, under
    TorchServe's names. HandlerTime is BaseHandler's (the toolkit's resnet18 emits it; echo, a function
    handler, does not); PredictionTime is the worker's own, for every model."""
    echo_json(engine, "count me")
    assert engine.post("/predictions/resnet18", sample_jpeg(2, (64, 64)), "image/jpeg")[0] == 200
    names = ["ts_inference_requests_total", "ts_inference_latency_microseconds", "ts_queue_latency_microseconds"]
    names += ["HandlerTime", "PredictionTime", "ts_workers", "Requests2XX", "request_predict_seconds_count"]
    text = scraped(engine, names)
    for name in names:
        assert f"\n{name}{{" in text, name
    assert 'ts_workers{model_name="echo",model_version="1.0",status="READY"} 2.0' in text
    from prometheus_client.parser import text_string_to_metric_families

    samples = {  # read back by a strict parser: every sample belongs to a family of its type
        sample.name: (family.type, sample)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples["ts_inference_requests_total"][0] == "counter" and samples["HandlerTime"][0] == "gauge"
    emitted = {(s.name, s.labels.get("ModelName")) for f in text_string_to_metric_families(text) for s in f.samples}
    assert {("HandlerTime", "resnet18"), ("PredictionTime", "resnet18"), ("PredictionTime", "echo")} <= emitted
    # in milliseconds, as TorchServe's (a worker forked from the fork server loads echo in about 0.1 s:
    # in seconds it would read 0.1)
    load = [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == "WorkerLoadTime"]
    assert load and min(load) > 20, load


def test_a_dead_worker_fails_only_the_requests_it_held_and_comes_back(engine):
    """kill -9 one of echo's two workers while each holds a request: its request gets 503, the
    other worker's 200; the killed worker is back within 30 s, and serves."""
    before = {w["pid"] for w in engine.workers("echo")}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = [pool.submit(echo_json, engine, "sleep 1.5") for _ in range(2)]
        time.sleep(0.7)
        busy = [w["pid"] for w in engine.workers("echo")]
        victim = busy[0]
        os.kill(victim, signal.SIGKILL)
        answers = [f.result(60) for f in held]
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200, 503], answers
    died = next(body for status, body in answers if status == 503)
    assert "Worker died" in died["message"], died
    assert next(body for status, body in answers if status == 200)["pid"] != victim
    now = waiting.until(
        lambda: engine.workers("echo"),
        lambda now: all(w["status"] == "READY" and w["pid"] > 0 for w in now) and victim not in {w["pid"] for w in now},
        "the killed worker did not come back",
        engine.out,
        engine.alive,
        30,
    )
    assert len(before & {w["pid"] for w in now}) == 1
    assert all(echo_json(engine, f"after {i}")[0] == 200 for i in range(4))


def test_response_timeout_and_a_handler_that_exits(engine):
    start = time.monotonic()
    status, body = echo_json(engine, "sleep 30")
    assert status == 503 and "responseTimeout (4s)" in body["message"], body
    assert time.monotonic() - start < 15
    status, body = echo_json(engine, "exit")
    assert status == 503 and "Worker died" in body["message"], body
    waiting.until(
        lambda: engine.workers("echo"),
        lambda now: all(w["status"] == "READY" for w in now),
        "the worker that exited did not come back",
        engine.out,
        engine.alive,
        30,
    )
    assert echo_json(engine, "still here")[0] == 200


def test_a_setting_it_cannot_honour_is_refused_in_one_line(tree, tmp_path):
    models = {"echo": snapshot_entry("echo.mar", 1, 1, 0, 4)}
    config = write_config(tmp_path / "config.properties", models, "enable_grpc_ssl=true\n")
    engine = Engine(tree, config=config)
    code = engine.process.wait(60)
    assert code == 2
    assert (
        engine.output().strip().splitlines()[-1].startswith("tsctl engine: ") and "enable_grpc_ssl" in engine.output()
    )
    missing = write_config(tmp_path / "missing.properties", {"gone": snapshot_entry("gone.mar", 1, 1, 0, 4)})
    engine = Engine(tree, config=missing)
    assert engine.process.wait(60) == 2 and "gone.mar" in engine.output()


def listeners(pgid: int) -> list:
    """(address, port) of every TCP socket listening in the process group (its processes' inodes
    matched against /proc/net/tcp and tcp6)."""
    inodes = set()
    for pid in server.group_members(pgid):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address, port = fields[1].split(":")
                found.append((_address(address, width), int(port, 16)))
    return found


def _address(hex_address: str, width: int) -> str:
    raw = bytes.fromhex(hex_address)
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def test_a_workers_log_line_cannot_write_into_metrics(engine):
    """A request the handler rejects is logged with what it held; a forged metric in it stays a log
    line, and /metrics still parses."""
    forged = "[METRICS]ts_workers.Count:99|#model_name:resnet18,Hostname:x|#type:GAUGE|#hostname:evil,"
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": forged}
    status, _ = server.request(f"{engine.url}/v2/models/resnet18/infer", b"{}", "POST", headers, timeout=30)
    assert status == 400
    status, text = engine.get("/metrics")
    assert status == 200 and "evil" not in text
    from prometheus_client.parser import text_string_to_metric_families

    assert list(text_string_to_metric_families(text))


def test_http_cannot_be_made_to_hold_huge_heads_or_carry_a_split_header(engine):
    head = b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", engine.http), timeout=30) as sock:
        try:
            sock.sendall(head)
        except OSError:
            pass  # the server may close before all of it is sent
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    status, body = echo_json(engine, "badheader")
    assert status == 500 and "cannot carry" in body["message"], body
    assert echo_json(engine, "fine")[0] == 200


def test_a_client_that_leaves_costs_no_worker_time(engine):
    """Requests whose clients have gone are dropped from the queue, not run."""
    for _ in range(8):
        with socket.create_connection(("127.0.0.1", engine.http), timeout=10) as sock:
            body = b"sleep 3"
            sock.sendall(
                b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                + b"Content-Length: %d\r\n\r\n" % len(body)
                + body
            )
        time.sleep(0.05)
    time.sleep(0.5)
    started = time.monotonic()
    assert echo_json(engine, "after the leavers")[0] == 200
    assert time.monotonic() - started < 8, "abandoned requests ran"  # 8 x 3 s on 2 workers would be 12 s


def test_grpc_bytes_sent_as_contents_as_well_as_raw(engine):
    jpeg = sample_jpeg(7, (200, 160))
    raw = grpc_client.call(f"127.0.0.1:{engine.grpc}", "resnet18", [jpeg])
    contents = grpc_client.call(f"127.0.0.1:{engine.grpc}", "resnet18", [jpeg], contents=True)
    assert raw["answers"] and contents["answers"] == raw["answers"], (raw, contents)


def test_sigterm_to_the_engine_alone_ends_it_and_its_workers_with_requests_queued(tree, tmp_path):
    config = write_config(tmp_path / "echo.properties", {"echo": snapshot_entry("echo.mar", 1, 1, 0, 30)})
    engine = Engine(tree, config=config).wait_ready()
    worker_pids = [w["pid"] for w in engine.workers("echo")]  # in process groups of their own
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            held = pool.submit(echo_json, engine, "sleep 3")
            time.sleep(0.5)
            queued = [pool.submit(echo_json, engine, f"queued {i}") for i in range(3)]
            time.sleep(0.5)
            started = time.monotonic()
            engine.stop(group=False)
            assert time.monotonic() - started < 40
            answers = [f.result(60) for f in queued]
        assert all(status == 503 and "stopping" in body["message"] for status, body in answers), answers
        assert held.result(60)[0] == 200  # the batch its worker held was answered
        left = [pid for pid in worker_pids if Path(f"/proc/{pid}").exists()]
        assert not left, f"workers outlived the engine: {left}"
    finally:
        if engine.process.poll() is None:
            engine.stop()


def test_a_stuck_load_ends_with_the_engine(tree, tmp_path):
    config = write_config(tmp_path / "hang.properties", {"hang": snapshot_entry("hang.mar", 1, 1, 0, 30)})
    (tmp_path / "model-store").symlink_to(tree / "hang-store")
    engine = Engine(tmp_path, config=config)
    deadline = time.monotonic() + 120
    while "worker 0" not in engine.output() and "model_name: hang" not in engine.output():
        assert time.monotonic() < deadline and engine.process.poll() is None, engine.output()
        time.sleep(0.3)
    assert server.request(f"{engine.url}/ping", timeout=10)[0] == 500  # not healthy while it loads
    engine.stop(group=False)


def partial_upload(port: int, declared: int, sent: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection from ``source`` that declared a body of ``declared`` bytes and has sent ``sent`` of them."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    sock.sendall(
        b"POST /predictions/echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
        + b"Content-Length: %d\r\n\r\n" % declared
        + b"a" * sent
    )
    return sock


def test_bodies_in_flight_are_bounded_across_all_requests(tree):
    """Half-sent uploads hold only what they sent; the body that would pass --max_inflight_bytes gets
    503 with Retry-After as its bytes arrive, other requests go on, and a finished upload frees its
    share. (150 half-sent 32 MiB uploads OOM-killed the KServe engine of #20's round.) Each upload from a
    client of its own, each within its share (a quarter of the budget; one client's share:
    tests/security/test_attack_fair_share.py)."""
    engine = Engine(tree, "--max_inflight_bytes", "3000000", "--enable_grpc", "false").wait_ready()
    try:
        holders = [partial_upload(engine.http, 740_000, 700_000, f"127.0.0.{n}") for n in range(2, 6)]
        time.sleep(1)
        pushing = partial_upload(engine.http, 2_000_000, 1_500_000, "127.0.0.9")  # 2.8 MB held: past 3 MB
        answer = received(pushing, b"max_inflight_bytes")
        assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer.lower(), answer[:300]
        assert b"the engine's bytes in flight (3,000,000, --max_inflight_bytes)" in answer, answer[-300:]
        assert echo_json(engine, "small bodies still fit")[0] == 200
        holders[0].sendall(b"a" * 40_000)  # completed: answered, and its 740 KB are released
        assert received(holders[0], b"\r\n\r\n").startswith(b"HTTP/1.1 200")
        for sock in holders + [pushing]:
            sock.close()
        time.sleep(0.5)
        status, _ = engine.post("/predictions/echo", b"b" * 2_200_000, timeout=30)
        assert status == 200  # the abandoned uploads gave their bytes back (one client: three quarters)
    finally:
        assert engine.stop() == 0
