"""An outsider's attack on the engine's management API (#32): calls that race each other, and bad input
that must be one TorchServe-shaped 4xx, nothing else changed, no worker leaked.

One engine for the module (echo 1.0 on one worker, the model API on, tokens on, one listener), its
workers counted from /proc before and after each attack against what describe lists."""

import json
import time
import zipfile

import psutil
import pytest

from archiver import server
from helpers.engine import Engine
from helpers.management import build_store, query


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("attack-management")
    store = build_store(root)
    entry = {
        "1.0": {
            "defaultVersion": True,
            "marName": "echo.mar",
            "minWorkers": 1,
            "maxWorkers": 4,
            "batchSize": 1,
            "maxBatchDelay": 0,
            "responseTimeout": 60,
        }
    }
    from helpers.engine import write_config

    config = root / "config" / "config.properties"
    config.parent.mkdir()
    write_config(
        config,
        {"echo": entry},
        f"management_address=http://0.0.0.0:8085\nenable_model_api=true\nallowed_urls=file://{store}/.*\n",
    )
    config.write_text(config.read_text().replace("disable_token_authorization=true\n", ""))
    running = Engine(root, "--enable_grpc", "false").wait_ready()
    running.store = store
    yield running
    running.stop()


def call(engine, method, path, api="management", body=None, timeout=60):
    return server.request(engine.url + path, body, method, engine.headers(api), timeout=timeout)


def workers(engine) -> set:
    """The pids of the engine's worker processes (its fork servers' children; a spawned worker's parent
    is the engine), from /proc."""
    found = set()
    for child in psutil.Process(engine.process.pid).children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "--sock-name" in " ".join(child.cmdline()):
                found.add(child.pid)
            elif child.status() != psutil.STATUS_ZOMBIE and child.ppid() != engine.process.pid:
                found.add(child.pid)  # forked from a fork server: a worker
        except psutil.Error:
            pass
    return found


def described(engine) -> set:
    status, body = call(engine, "GET", "/models/echo/all")
    assert status == 200, body
    return {w["pid"] for version in body for w in version["workers"]}


def settled(engine, seconds: float = 15) -> tuple:
    """(workers running, workers described) once they have agreed for 2 s (a worker scaled away while it
    loaded is ended once loaded: not at once), or after ``seconds``."""
    deadline, agreed = time.monotonic() + seconds, None
    while True:
        running, listed = workers(engine), described(engine)
        agreed = (agreed or time.monotonic()) if running == listed else None
        if (agreed and time.monotonic() - agreed >= 2) or time.monotonic() > deadline:
            return running, listed
        time.sleep(0.25)


def test_scaling_up_and_down_without_waiting_leaves_no_worker_and_no_call_hanging(engine):
    """Scale calls that return at once (synchronous=false, the default) while the workers they added are
    still loading: a worker scaled away while it loads must not share its slot (its socket) with the one
    that takes the slot next. It did: two workers on one socket path, one load hanging for LOAD_TIMEOUT
    (300 s) and every management call behind it waiting as long."""
    before = workers(engine)
    for _ in range(4):
        for count in (4, 1):
            status, body = call(engine, "PUT", "/models/echo" + query(min_worker=count, max_worker=4))
            assert status == 202, body
    started = time.monotonic()
    status, body = call(engine, "PUT", "/models/echo" + query(min_worker=1, synchronous="true"), timeout=40)
    assert status == 200, body
    assert time.monotonic() - started < 30
    running, listed = settled(engine)
    assert running == listed and len(listed) == 1, (running, listed)
    assert call(engine, "POST", "/predictions/echo", "inference", b"x")[0] == 200
    assert len(before) == 1


BAD_CALLS = [
    ("POST", "/models" + query(url="a" * 300)),  # a name too long for the file system: was a 500 naming the store
    ("POST", "/models" + query(url="é" * 200 + ".mar")),
    ("POST", "/models" + query(url="echo2.mar", initial_workers="1_0")),  # int() read it as 10
    ("PUT", "/models/echo" + query(min_worker="1_0")),
    ("PUT", "/models/echo" + query(min_worker="9" * 5000)),
    ("GET", "/models" + query(limit="1_0")),
    ("POST", "/models" + query(url="echo2.mar", batch_size="0x10")),
]


@pytest.mark.parametrize("method, path", BAD_CALLS, ids=[f"{m} {p[:40]}" for m, p in BAD_CALLS])
def test_bad_input_is_one_torchserve_shaped_4xx_and_changes_nothing(engine, method, path):
    before, listing = workers(engine), call(engine, "GET", "/models")
    status, body = call(engine, method, path)
    assert 400 <= status < 500 and set(body) == {"code", "type", "message"} and body["code"] == status, body
    assert "model-store" not in body["message"]  # nothing of the server's paths
    assert call(engine, "GET", "/models") == listing and workers(engine) == before


def test_unregistering_leaves_no_socket_file_behind(engine):
    """Each register takes new worker ids (socket paths): those of an unregistered version must go with it,
    or a register/unregister loop fills the engine's temporary directory."""
    (run_dir,) = engine.home.glob("tsctl-engine-*")
    before = {p.name for p in run_dir.glob(".ts.sock.*")}
    for _ in range(3):
        status, body = call(
            engine,
            "POST",
            "/models" + query(url="echo2.mar", model_name="passing", initial_workers=2, synchronous="true"),
        )
        assert status == 200, body
        assert call(engine, "DELETE", "/models/passing")[0] == 200
    assert {p.name for p in run_dir.glob(".ts.sock.*")} == before


def test_scaling_down_loses_no_request(engine):
    """A worker scaled away while idle left its wait for the next batch behind: that wait took the next
    request off the queue and no one ran it (the client waited until its own timeout), one per worker."""
    for count in (3, 1):
        status, body = call(engine, "PUT", "/models/echo" + query(min_worker=count, max_worker=3, synchronous="true"))
        assert status == 200, body
    for _ in range(4):
        assert call(engine, "POST", "/predictions/echo", "inference", b"x", timeout=10)[0] == 200


def test_a_key_followed_by_whitespace_is_the_key(engine):
    """HTTP's whitespace around a header's value is not part of it: TorchServe 0.12 (Netty) takes
    ``Bearer KEY `` as KEY, and so must the engine; a wrong key stays refused however it is padded."""
    key = engine.headers("inference")["Authorization"]
    for value, status in ((key + " ", 200), (key + "\t", 200), (key + "x ", 400), ("Bearer  ", 400)):
        got = server.request(engine.url + "/ping", headers={"Authorization": value}, timeout=30)[0]
        assert got == status, repr(value)


def test_a_version_an_archive_names_cannot_write_lines_of_its_own_in_the_engine_log(engine):
    """The model store's archives are read as untrusted (docs/safe-defaults.md): a version with a line
    break and a terminal escape in its MANIFEST.json is logged escaped, on the engine's line."""
    forged = "2026-01-01 00:00:00,000 ERROR tsctl.engine: FORGED"
    store = engine.store
    with zipfile.ZipFile(store / "echo2.mar") as source, zipfile.ZipFile(store / "forged.mar", "w") as out:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == "MAR-INF/MANIFEST.json":
                manifest = json.loads(data)
                manifest["model"]["modelVersion"] = f"9\n{forged}\x1b[31m"
                data = json.dumps(manifest).encode()
            out.writestr(item, data)
    status, body = call(engine, "POST", "/models" + query(url="forged.mar", model_name="forged", initial_workers=1))
    assert status == 200, body
    assert call(engine, "DELETE", "/models/forged")[0] == 200
    log = engine.output()
    assert "FORGED" in log and not any(line.startswith(forged) for line in log.splitlines()) and "\x1b" not in log
