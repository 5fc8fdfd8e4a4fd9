"""The engine's management API and token authorization where TorchServe has nothing to compare with
(tests/conformance/test_management_api.py compares the rest): one listener for both APIs, the key file
itself, a store without a config (tokens on, as TorchServe), and what happens to requests in flight
when a version is unregistered or its workers scaled down."""

import concurrent.futures
import json
import os
import stat
import time

import pytest

from archiver import server
from helpers.engine import Engine, write_config
from helpers.management import ECHO, build_store, query

# echo whose worker holds a request of body "slow" for 3 s
SLEEP = "        if body == 'slow':\n            __import__('time').sleep(3)\n"
SLEEPY = ECHO.replace("        out.append(", SLEEP + "        out.append(")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-management")
    build_store(root, echo=SLEEPY)
    return root


def shared_config(root, extra: str = ""):
    """echo 1.0 on 1 worker, inference and management on one address (tsctl config's, KServe's), tokens on."""
    entry = {
        "1.0": {
            "defaultVersion": True,
            "marName": "echo.mar",
            "minWorkers": 1,
            "maxWorkers": 1,
            "batchSize": 1,
            "maxBatchDelay": 0,
            "responseTimeout": 60,
        }
    }
    config = root / "config" / "config.properties"
    config.parent.mkdir(exist_ok=True)
    write_config(config, {"echo": entry}, "management_address=http://0.0.0.0:8085\nenable_model_api=true\n" + extra)
    text = config.read_text().replace("disable_token_authorization=true\n", "")  # TorchServe's default: tokens on
    config.write_text(text)
    return config


@pytest.fixture(scope="module")
def engine(root):
    shared_config(root)
    running = Engine(root, "--enable_grpc", "false").wait_ready()
    yield running
    running.stop()
    assert not (running.home / "key_file.json").exists()  # removed when the engine stops


def call(engine, method, path, api="management", body=None):
    return server.request(engine.url + path, body, method, engine.headers(api), timeout=60)


def test_one_listener_gives_each_path_its_own_key_and_the_key_file_is_torchserves(engine):
    key_file = engine.home / "key_file.json"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    keys = json.loads(key_file.read_text())
    assert set(keys) == {"management", "inference", "API"} and set(keys["API"]) == {"key"}
    for kind in ("management", "inference"):
        assert len(keys[kind]["key"]) == 8 and keys[kind]["expiration time"].endswith("Z"), keys
    # TorchServe 0.12 checks both keys on such a port, so no key opens its management API there: here each
    # path takes its own.
    assert call(engine, "GET", "/models")[0] == 200
    assert call(engine, "GET", "/models", "inference")[0] == 400
    assert call(engine, "POST", "/predictions/echo", "inference", b"x")[0] == 200
    assert call(engine, "POST", "/predictions/echo", "management", b"x")[0] == 400
    assert server.request(engine.url + "/metrics", timeout=30)[0] == 200  # no key: TorchServe's metrics API
    before = engine.headers("inference")
    assert call(engine, "POST", "/token?type=inference", "API") == (200, "\n")
    assert engine.headers("inference") != before
    assert server.request(engine.url + "/ping", headers=before, timeout=30)[0] == 400
    assert call(engine, "GET", "/ping", "inference")[0] == 200


def test_unregistering_answers_what_was_queued_and_lets_the_held_batch_finish(engine):
    assert call(engine, "POST", "/models" + query(url="echo2.mar", initial_workers=1, synchronous="true"))[0] == 200
    pids = [w["pid"] for w in call(engine, "GET", "/models/echo/2.0")[1][0]["workers"]]
    # the first request holds the version's one worker for 3 s, the second waits in its queue
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        held = pool.submit(call, engine, "POST", "/predictions/echo/2.0", "inference", b"slow")
        time.sleep(0.5)
        queued = pool.submit(call, engine, "POST", "/predictions/echo/2.0", "inference", b"queued")
        time.sleep(0.5)
        gone = pool.submit(call, engine, "DELETE", "/models/echo/2.0")
        assert held.result(timeout=60)[0] == 200
        status, body = queued.result(timeout=60)
        assert status == 503 and "unregistered" in body["message"], body
        assert gone.result(timeout=60) == (200, {"status": 'Model "echo" unregistered'})
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)
    assert call(engine, "GET", "/models/echo/2.0")[0] == 404


def test_tokens_are_on_unless_the_config_or_the_command_line_says_otherwise(root, tmp_path, monkeypatch):
    """As TorchServe 0.12: with no config file, or one that does not say disable_token_authorization=true;
    a TS_* variable wins with enable_envvars_config=true; the engine's --disable_token_auth turns them off."""
    from serving.engine import main as engine_module

    bare = tmp_path / "bare"
    (bare / "model-store").mkdir(parents=True)
    (bare / "model-store" / "echo.mar").write_bytes((root / "model-store" / "echo.mar").read_bytes())

    def frontend(*args, config=None):
        given = ["--ts_config", str(config)] if config else []
        parsed = engine_module.parse_args(["--model_store", str(bare / "model-store"), *given, *args])
        return engine_module.load_specs(parsed)[1]

    assert frontend().token_authorization and not frontend().enable_model_api
    assert not frontend("--disable_token_auth").token_authorization
    config = tmp_path / "config.properties"
    snapshot = '{"name": "s", "modelCount": 1, "models": {"echo": {"1.0": {"marName": "echo.mar"}}}}'
    for text, tokens in (
        ("", True),
        ("disable_token_authorization=TRUE\n", False),
        ("disable_token_authorization=false\n", True),
    ):
        config.write_text(f"{text}model_snapshot={snapshot}\n")
        assert frontend(config=config).token_authorization is tokens, text
    config.write_text(f"enable_envvars_config=true\ndisable_token_authorization=true\nmodel_snapshot={snapshot}\n")
    monkeypatch.setenv("TS_DISABLE_TOKEN_AUTHORIZATION", "false")
    monkeypatch.setenv("TS_ENABLE_MODEL_API", "true")
    assert frontend(config=config).token_authorization and frontend(config=config).enable_model_api
    assert frontend("--enable_model_api", "false", config=config).enable_model_api is False
    # MLServer has no tokens: a config asking for them is refused there, in one line, before anything starts
    from archiver.engines import named
    from archiver.errors import UserError

    config.write_text(f"disable_token_authorization=false\nmodel_snapshot={snapshot}\n")
    with pytest.raises(UserError, match="token authorization, which MLServer does not have"):
        named("mlserver").start(bare / "model-store", config, tmp_path / "home", 10)
