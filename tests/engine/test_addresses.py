"""The engine on a typical TorchServe config (issue #32's newcomer): it binds what config.properties'
``inference_address``, ``management_address`` and ``metrics_address`` say, the command line's ports winning
(serving/engine/listeners.py), and serves ``load_models`` (``all``, ``FILE``, ``NAME=FILE``) without a model_snapshot,
as TorchServe 0.12's ModelServer.initModelStore. Before, it ignored the addresses, crashed on gRPC's bind of
8081 (management_address's port) and refused any config without a model_snapshot.

Servers here bind the config's addresses with free ports written into the config (a typical config's
8080/8081/8082 are only planned, ``listeners.plan``, never bound). Times on this shared 2-core machine: the
plan and reader tests under 0.1 s each; the engine on a typical config 6.5 to 8 s; a clash under 1 s; a gRPC
port in use 5 to 7 s; ``tsctl serve`` 7 to 9 s; the export 0.6 s (the module's store: torch-model-archiver,
0.4 s); the matrix comparisons with TorchServe 0.12 8.5 to 9.5 s each.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver import engines, server
from archiver.cli import main
from archiver.engines import torchserve_launch
from helpers import management, waiting
from helpers.engine import free_port, free_ports
from helpers.paths import ROOT, short_tmp
from serving import config_properties, frontend_settings, ts_config
from serving.engine import listeners


# ---- where it listens: the plan, no server -------------------------------------------------------
def frontend(**keys) -> frontend_settings.Frontend:
    return frontend_settings.frontend_of({key: str(value) for key, value in keys.items()}, "config.properties")


TYPICAL = dict(
    inference_address="http://127.0.0.1:8080",
    management_address="http://127.0.0.1:8081",
    metrics_address="http://127.0.0.1:8082",
)


def ports(found: listeners.Bindings) -> dict:
    every = found.rest + ([found.grpc] if found.grpc else [])
    return {listener.role: (listener.host, listener.port) for listener in every}


def test_a_typical_torchserve_config_is_bound_as_written_and_kserve_grpc_moves_off_8081():
    found = listeners.plan(frontend(**TYPICAL), Namespace())
    assert ports(found) == {
        "inference": ("127.0.0.1", 8080),
        "management": ("127.0.0.1", 8081),
        "metrics": ("127.0.0.1", 8082),
        "grpc": ("127.0.0.1", 8083),
    }
    [note] = found.notes
    assert "8083" in note and "management_address=http://127.0.0.1:8081 takes 8081" in note and "--grpc_port" in note


def test_the_command_line_wins_and_one_address_is_one_listener():
    kserve = Namespace(http_port=8080, grpc_port=8081)  # what the exported runtime passes
    tsctl_config = frontend(
        inference_address="http://0.0.0.0:8085",
        management_address="http://0.0.0.0:8085",
        metrics_address="http://0.0.0.0:8082",
    )
    assert ports(listeners.plan(tsctl_config, kserve)) == {
        "both": ("0.0.0.0", 8080),
        "metrics": ("0.0.0.0", 8082),
        "grpc": ("0.0.0.0", 8081),
    }
    local = Namespace(host="127.0.0.1", http_port=1001, grpc_port=1002, management_port=1003, metrics_port=1001)
    assert ports(listeners.plan(frontend(**TYPICAL), local)) == {
        "inference": ("127.0.0.1", 1001),
        "management": ("127.0.0.1", 1003),
        "grpc": ("127.0.0.1", 1002),
    }
    quiet = frontend(**TYPICAL, enable_metrics_api="false")
    assert "metrics" not in ports(listeners.plan(quiet, Namespace()))
    assert ports(listeners.plan(frontend(), Namespace(enable_grpc="false"))) == {"both": ("0.0.0.0", 8080)}


@pytest.mark.parametrize(
    "keys, args, words",
    [
        (
            TYPICAL,
            Namespace(http_port=8080, grpc_port=8081),
            "--grpc_port 8081 (KServe's v2 gRPC) and management_address=http://127.0.0.1:8081 both take port 8081",
        ),
        (
            {**TYPICAL, "metrics_address": "http://0.0.0.0:8081"},
            Namespace(),
            "metrics_address=http://0.0.0.0:8081 and management_address=http://127.0.0.1:8081 both take port 8081",
        ),
        ({**TYPICAL, "grpc_inference_port": "8082"}, Namespace(), "grpc_inference_port (TorchServe's gRPC inference"),
        ({"inference_address": "https://0.0.0.0:8443"}, Namespace(), "inference_address is https"),
        ({"management_address": "unix:/tmp/m.sock"}, Namespace(), "management_address='unix:/tmp/m.sock' is not"),
    ],
)
def test_what_cannot_be_bound_is_one_line_naming_the_keys(keys, args, words):
    with pytest.raises(config_properties.ConfigError) as caught:
        listeners.plan(frontend(**keys), args)
    assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


# ---- load_models, read ---------------------------------------------------------------------------
def test_load_models_forms_as_torchserve_reads_them(store):
    config = Path("config.properties")

    def served(value: str, **extra):
        properties = {"load_models": value, "default_workers_per_model": "1", **extra}
        specs, front = ts_config.from_properties(properties, config, store)
        return [(s.name, s.version, s.url, s.default, s.min_workers, s.loaded_at_startup) for s in specs], front.notes

    every, notes = served("ALL")  # in the directory's order, as TorchServe lists it: its first echo the default
    assert sorted(every) == [
        ("broken", "1.0", "broken.mar", True, 1, True),
        ("echo", "1.0", "echo.mar", True, 1, True),
        ("echo", "2.0", "echo2.mar", False, 1, True),
    ] or sorted(every)[1:] == [("echo", "1.0", "echo.mar", False, 1, True), ("echo", "2.0", "echo2.mar", True, 1, True)]
    assert [s[2] for s in every] == [p.name for p in store.iterdir()] and notes == []
    assert served("echo2.mar, mine=echo.mar")[0] == [
        ("echo", "2.0", "echo2.mar", True, 1, True),
        ("mine", "1.0", "echo.mar", True, 1, True),
    ]
    specs, [missing, twice, relative] = served("echo.mar,missing.mar,echo.mar,../echo.mar,")
    assert [s[:2] for s in specs] == [("echo", "1.0")]
    assert "Failed to load model: ../echo.mar (Relative path is not allowed in url: ../echo.mar)" in relative
    assert "load_models: Failed to load model: missing.mar (Model not found at: missing.mar)" in missing
    assert "echo.mar (Model version 1.0 is already registered for model echo)" in twice
    specs, _ = ts_config.from_properties({"load_models": "echo.mar"}, config, store)
    assert specs[0].min_workers == ts_config.torchserve_workers()  # no default_workers_per_model: TorchServe's CPUs
    for value in ("", "missing.mar"):
        with pytest.raises(config_properties.ConfigError, match="enable_model_api is off"):
            ts_config.from_properties({"load_models": value}, config, store)
    assert served("", enable_model_api="true") == ([], [])  # TorchServe starts with no model; register adds them


# ---- the engine, running -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """echo.mar (echo 1.0), echo2.mar (echo 2.0), broken.mar (fails to load): tests/helpers/management.py."""
    found = tmp_path_factory.mktemp("addresses")
    management.build_store(found)
    return found


@pytest.fixture
def store(root) -> Path:
    return root / "model-store"


def typical(path: Path, store: Path, load_models: str, **extra) -> dict:
    """A typical TorchServe config (inference, management, metrics apart; TorchServe's gRPC ports) with free
    ports written in; returns them."""
    keys = ("inference", "management", "metrics", "grpc_inference", "grpc_management")
    chosen = dict(zip(keys, free_ports(len(keys))))  # different ports (free_port twice can give one port twice)
    lines = [f"{key}_address=http://127.0.0.1:{chosen[key]}" for key in ("inference", "management", "metrics")]
    lines += [f"grpc_{api}_port={chosen[f'grpc_{api}']}" for api in ("inference", "management")]
    settings = {"model_store": str(store), "load_models": load_models, "disable_token_authorization": "true", **extra}
    path.write_text("\n".join(lines + [f"{key}={value}" for key, value in settings.items()]) + "\n")
    return chosen


class Direct:
    """``python -m serving.engine`` or ``torchserve --foreground`` started on a config as it is: every address
    from it (the engine also gets a free --grpc_port: its KServe v2 default 8081 is no free port here)."""

    def __init__(self, side: str, store: Path, config: Path, ports: dict):
        self.home, self.ports = short_tmp(f"addr-{side}-"), ports
        (self.home / "logs").mkdir()
        if side == "tsctl":
            command = [
                sys.executable,
                "-m",
                "serving.engine",
                "--model_store",
                str(store),
                "--ts_config",
                str(config),
                "--grpc_port",
                str(free_port()),
            ]
        else:
            arguments = ["--start", "--foreground", "--ncs", "--model-store", str(store), "--ts-config", str(config)]
            command = torchserve_launch.torchserve_command() + arguments
        env = dict(
            os.environ,
            TEMP=str(self.home),
            PYTHONPATH=str(ROOT),
            LOG_LOCATION=str(self.home / "logs"),
            METRICS_LOCATION=str(self.home / "logs"),
            TS_INITIAL_WORKER_PORT=str(free_port() // 100 * 100),
        )
        with open(self.home / "out", "wb") as out:
            self.process = subprocess.Popen(
                command,
                cwd=self.home,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def url(self, api: str) -> str:
        return f"http://127.0.0.1:{self.ports[api]}"

    def get(self, api: str, path: str):
        return server.request(self.url(api) + path, timeout=10)

    def wait(self, models, timeout: float = 120) -> "Direct":
        """Until every model's workers are READY (the management API's describe), as long as the engine makes
        progress (helpers/waiting.py)."""

        def states():
            described = [self.get("management", f"/models/{name}/all") for name in models]
            return [
                (status, [tuple(w["status"] for w in m["workers"]) for m in body] if status == 200 else body)
                for status, body in described
            ]  # each version's workers' states

        def ready(shown):
            return bool(shown) and all(
                status == 200 and all(v and set(v) == {"READY"} for v in versions) for status, versions in shown
            )

        waiting.until(
            states, ready, f"models {models} not ready", self.home / "out", lambda: self.process.poll() is None, timeout
        )
        return self

    def output(self) -> str:
        return (self.home / "out").read_text(errors="replace")

    def stop(self):
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(45)
        finally:
            if server.group_members(self.process.pid):
                os.killpg(self.process.pid, signal.SIGKILL)
            shutil.rmtree(self.home, ignore_errors=True)


def test_the_engine_answers_on_each_address_of_a_typical_config(tmp_path, store):
    """Inference, management and metrics each on the config's address, TorchServe's gRPC on its ports; a
    load_models entry naming no archive is one warning line and the rest is served. 6.5 to 8 s."""
    config = tmp_path / "config.properties"
    chosen = typical(config, store, "echo.mar,missing.mar,e2=echo2.mar", default_workers_per_model=1)
    engine = Direct("tsctl", store, config, chosen)
    try:
        engine.wait(["echo", "e2"], timeout=60)
        assert engine.get("inference", "/ping") == (200, {"status": "Healthy"})
        status, body = server.request(engine.url("inference") + "/predictions/e2", b"hi", "POST", timeout=30)
        assert status == 200 and body["echo"] == "hi", body
        assert engine.get("management", "/models")[1]["models"] == [
            {"modelName": "e2", "modelUrl": "echo2.mar"},
            {"modelName": "echo", "modelUrl": "echo.mar"},
        ]
        assert engine.get("inference", "/models")[0] == 404  # management is on its own listener
        for api in ("metrics", "inference"):  # /metrics also on the HTTP port, as the engine documents it
            status, text = engine.get(api, "/metrics")
            assert status == 200 and "ts_inference_requests_total" in str(text), (api, str(text)[:300])
        assert engine.get("metrics", "/ping")[0] == 404
        assert grpc_ping(chosen["grpc_inference"]) == "Healthy"
        out = engine.output()
        warnings = [line for line in out.splitlines() if "missing.mar" in line]
        assert len(warnings) == 1 and "Failed to load model: missing.mar" in warnings[0], out[-2000:]
        assert f"metrics 127.0.0.1:{chosen['metrics']}" in out and "Traceback" not in out
    finally:
        engine.stop()


def grpc_ping(port: int) -> str:
    """TorchServe's gRPC Ping (serving/engine/protos' inference.proto), its health string."""
    import grpc
    from google.protobuf import empty_pb2

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        ping = channel.unary_unary(
            "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Ping",
            request_serializer=empty_pb2.Empty.SerializeToString,
            response_deserializer=lambda raw: raw,
        )
        raw = ping(empty_pb2.Empty(), timeout=10)
    return json.loads(raw[2:].decode())["status"] if raw else ""


def test_a_port_two_listeners_would_share_is_one_line_before_anything_binds(tmp_path, store):
    """KServe's runtime arguments on a typical config: --grpc_port is management_address's port.
    Refused before any model is opened (0.8 s)."""
    config = tmp_path / "config.properties"
    chosen = typical(config, store, "echo.mar")
    command = [
        sys.executable,
        "-m",
        "serving.engine",
        "--model_store",
        str(store),
        "--ts_config",
        str(config),
        "--grpc_port",
        str(chosen["management"]),
    ]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT), TEMP=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = [line for line in done.stderr.splitlines() if line.startswith("tsctl engine:")]
    assert f"--grpc_port {chosen['management']} (KServe's v2 gRPC) and management_address=" in line, line
    assert "Traceback" not in done.stderr


def test_a_grpc_port_in_use_is_one_line_naming_it(tmp_path, store):
    """A port another process holds: one line naming it and --grpc_port, before any worker starts (before
    listeners.check_free: grpc's bind error, after the HTTP listeners and the workers had started, 5 to 7 s)."""
    config = tmp_path / "config.properties"
    typical(config, store, "echo.mar", default_workers_per_model=1)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        command = [
            sys.executable,
            "-m",
            "serving.engine",
            "--model_store",
            str(store),
            "--ts_config",
            str(config),
            "--grpc_port",
            str(port),
        ]
        done = subprocess.run(
            command,
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(ROOT), TEMP=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr[-2000:]  # refused before any worker starts (listeners.check_free)
    [line] = [line for line in done.stderr.splitlines() if line.startswith("tsctl engine:")]
    assert f"127.0.0.1:{port} (--grpc_port {port} (KServe's v2 gRPC)) is in use by another process" in line, line
    assert line.endswith("give --grpc_port a free port") and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_tsctl_serve_still_moves_every_listener_to_free_ports(tmp_path, store):
    """``tsctl serve --engine tsctl`` on a typical config with load_models: nothing binds the config's
    addresses, everything is on 127.0.0.1 ports of its own. 7 to 9 s."""
    config = tmp_path / "config.properties"
    chosen = typical(config, store, "echo.mar", default_workers_per_model=1)
    srv = engines.named("tsctl").start(store, config, tmp_path / "home", 120)
    try:
        assert srv.models == ["echo"]
        assert server.request(f"{srv.inference}/ping", timeout=10)[0] == 200
        assert server.request(f"{srv.management}/models", timeout=10)[1]["models"][0]["modelName"] == "echo"
        assert server.request(f"{srv.metrics}/metrics", timeout=10)[0] == 200
        for port in chosen.values():
            with pytest.raises(OSError):
                server.request(f"http://127.0.0.1:{port}/ping", timeout=5)
    finally:
        engines.engine_of(srv).stop(srv)


def test_export_refuses_a_config_whose_addresses_take_the_runtimes_ports(tmp_path, store):
    """``tsctl export kserve --engine tsctl`` on a typical TorchServe config (management on 8081, KServe's
    v2 gRPC port in the runtime): one line, nothing written, rather than a runtime that crash-loops."""
    from archiver import properties

    config, mine = tmp_path / "config.properties", tmp_path / "model-store"
    mine.mkdir()
    shutil.copy(store / "echo.mar", mine / "echo.mar")
    store = mine
    properties.write_config(store, config)  # tsctl config's: one address for both, exported fine
    text = config.read_text().replace(
        "management_address=http://0.0.0.0:8085", "management_address=http://0.0.0.0:8081"
    )
    args = [
        "export",
        "kserve",
        "--config",
        str(config),
        "--model-store",
        str(store),
        "--name",
        "echo",
        "--storage-uri",
        "pvc://models/echo",
        "--engine",
        "tsctl",
        "--image",
        "r.example/e:1",
    ]
    fine = CliRunner().invoke(main, [*args[:2], str(tmp_path / "fine"), *args[2:]])
    assert fine.exit_code == 0, fine.output
    config.write_text(text)
    result = CliRunner().invoke(main, [*args[:2], str(tmp_path / "out"), *args[2:]])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert (
        "--grpc_port 8081 (KServe's v2 gRPC) and management_address=http://0.0.0.0:8081 both take port 8081"
        in (result.output)
        and "change the config" in result.output
    )
    assert not (tmp_path / "out").exists()


# ---- load_models, compared with TorchServe 0.12 --------------------------------------------------
FIELDS = (
    "modelName",
    "modelVersion",
    "modelUrl",
    "minWorkers",
    "maxWorkers",
    "batchSize",
    "maxBatchDelay",
    "responseTimeout",
    "loadedAtStartup",
)


def described(side: Direct, names) -> dict:
    found = {"models": side.get("management", "/models")[1]}
    for name in names:
        status, body = side.get("management", f"/models/{name}/all")
        found[name] = sorted(
            (
                [{key: m[key] for key in FIELDS} | {"workers": len(m["workers"])} for m in body]
                if status == 200
                else [status]
            ),
            key=str,
        )
    return found


@pytest.mark.matrix
@pytest.mark.parametrize(
    "load_models, names, extra",
    [
        ("all", ["echo"], {}),  # no default_workers_per_model: as many workers as TorchServe counts CPUs
        ("echo.mar,missing.mar,e2=echo2.mar", ["echo", "e2"], {"default_workers_per_model": "1"}),
    ],
)
def test_load_models_serves_what_torchserve_serves(tmp_path, root, load_models, names, extra):
    """TorchServe 0.12 and the engine on the same config (their own free ports written in): the same models
    listed and described (settings, urls, loadedAtStartup, worker counts). 8.5 to 9.5 s each."""
    store = tmp_path / "model-store"
    store.mkdir()
    for archive in ("echo.mar", "echo2.mar"):  # broken.mar left out: TorchServe retries it forever
        shutil.copy(root / "model-store" / archive, store / archive)
    (store / "notes.txt").write_text("not an archive")
    sides = {}
    try:
        for side in ("torchserve", "tsctl"):
            config = tmp_path / f"{side}.properties"
            sides[side] = Direct(side, store, config, typical(config, store, load_models, **extra))
        found = {side: described(running.wait(names), names) for side, running in sides.items()}
    finally:
        for running in sides.values():
            running.stop()
    assert found["tsctl"] == found["torchserve"]
    assert [m["modelName"] for m in found["tsctl"]["models"]["models"]] == sorted(names)
