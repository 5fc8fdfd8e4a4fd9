"""tsctl bench against the real TorchServe: bounded load, honest counts, and the batch-size sweep; what
server.json records for TorchServe, and the CLI's serve / stop through its engine object."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver import engines, properties, server
from archiver.capacity import bench
from archiver.cli import main
from archiver.errors import UserError
from helpers.models import package_resnet
from helpers.paths import short_tmp
from helpers.servers import RunningServer


@pytest.fixture(scope="module")
def store(image_sample, tmp_path_factory):
    store = tmp_path_factory.mktemp("bench") / "model-store"
    package_resnet(image_sample, store, config_text="batchSize: 2\nmaxBatchDelay: 20\n")
    return store


@pytest.fixture(scope="module")
def srv(store):
    with RunningServer(store, env={"TS_ENABLE_MODEL_API": "true"}) as running:
        yield running


@pytest.fixture(scope="module")
def inputs(jpegs):
    return [(j, "image/jpeg") for j in jpegs[:3]] + [(b"corrupt", "image/jpeg")]


def test_load_is_bounded_by_count_and_counts_errors(srv, inputs):
    result = bench.run_load(f"{srv.inference}/predictions/resnet18", inputs, concurrency=4, requests=12)
    assert result.requests == 12
    assert result.statuses == {200: 9, 400: 3}  # every fourth input is corrupt
    assert result.errors == 3 and len(result.latencies_ms) == 9
    summary = result.summary()
    assert 0 < summary["latency_ms"]["p50"] <= summary["latency_ms"]["p90"] <= summary["latency_ms"]["p99"]
    assert summary["throughput_rps"] == pytest.approx(12 / result.seconds, rel=0.01)


def test_load_is_bounded_by_time(srv, inputs):
    """--duration ends the run: what answered by then is counted, what is still in flight is cut and said
    (on a busy machine one resnet18 answer can take longer than the run: both clients' first requests cut)."""
    result = bench.run_load(f"{srv.inference}/predictions/resnet18", inputs[:1], concurrency=2, duration=1.0)
    assert result.errors == 0 and result.requests + sum(result.cut.values()) >= 2, result
    assert all("had not answered when --duration 1 s ended" in why for why in result.cut), result.cut
    assert result.seconds < 1.0 + 2  # the requests in flight are cut at the end, not waited for


def test_cli_prints_json_and_exits_nonzero_on_errors(srv, jpegs, tmp_path):
    good = tmp_path / "a.jpg"
    good.write_bytes(jpegs[0])
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "resnet18",
            "--input",
            str(good),
            "--concurrency",
            "2",
            "--requests",
            "4",
            "--json",
            "--home",
            srv.home,
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["requests"] == 4 and summary["errors"] == 0 and summary["statuses"] == {"200": 4}
    bad = tmp_path / "b.jpg"
    bad.write_bytes(b"nope")
    result = CliRunner().invoke(main, ["bench", "resnet18", "--input", str(bad), "--requests", "2", "--home", srv.home])
    assert result.exit_code == 1 and "2 errors" in result.output
    result = CliRunner().invoke(main, ["bench", "resnet18", "--input", str(good), "--home", srv.home])
    assert result.exit_code == 2 and "must be bounded" in result.output


@pytest.mark.matrix  # re-registers the model per setting: about 40 s
def test_sweep_reregisters_and_recommends(srv, inputs):
    rows = bench.sweep(srv.inference, srv.management, "resnet18", inputs[:2], 4, [1, 4], [10], requests=8)
    assert [(r["batchSize"], r["maxBatchDelay"]) for r in rows] == [(1, 10), (4, 10)]
    assert all(r["requests"] == 8 and r["errors"] == 0 for r in rows)
    [best] = [r for r in rows if r["recommended"]]
    assert best["throughput_rps"] == max(r["throughput_rps"] for r in rows)
    status, described = server.request(f"{srv.management}/models/resnet18", timeout=10)
    assert described[0]["batchSize"] == best["batchSize"]
    assert [w["status"] for w in described[0]["workers"]] == ["READY"]


def test_bounds_are_required():
    with pytest.raises(UserError, match="give --requests, --duration or both"):
        bench.run_load("http://127.0.0.1:9/x", [(b"", "a/b")], 1)


def test_server_json_records_the_engine_and_base_addresses(srv):
    recorded = json.loads((Path(srv.home) / "server.json").read_text())
    assert recorded["engine"] == "torchserve" and recorded["models"] == ["resnet18"]
    for api in ("inference", "management", "metrics"):
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", recorded[api]), (api, recorded[api])
    assert re.fullmatch(r"127\.0\.0\.1:\d+", recorded["grpc"])
    assert recorded["grpc"] == recorded["ts_grpc_inference"] and recorded["kserve_v2_grpc"] is None  # TorchServe's
    status, metrics = server.request(srv.metrics_url, timeout=10)
    assert srv.metrics_url == recorded["metrics"] + "/metrics" and status == 200 and "ts_inference" in metrics
    assert engines.engine_of(srv).predict_url(srv, "resnet18") == f"{srv.inference}/predictions/resnet18"


def test_the_cli_serves_and_stops_torchserve_through_its_engine(store, tmp_path):
    config = properties.write_config(store, tmp_path / "config.properties")
    home = short_tmp("bs-")
    runner = CliRunner()
    started = runner.invoke(main, ["serve", "--config", str(config), "--model-store", str(store), "--home", str(home)])
    try:
        assert started.exit_code == 0, started.output
        assert started.output.startswith("TorchServe ready (pid ")
        running = server.read_state(home)
        for label, address in engines.ENGINES["torchserve"].addresses(running):
            assert f"  {label:<18} {address}\n" in started.output
        again = [
            "serve",
            "--engine",
            "kserve",
            "--config",
            str(config),
            "--model-store",
            str(store),
            "--home",
            str(home),
        ]
        refused = runner.invoke(main, again)
        assert refused.exit_code == 2 and "is still running" in refused.output  # one server per home, any engine
    finally:
        stopped = runner.invoke(main, ["stop", "--home", str(home)])
    assert stopped.exit_code == 0 and stopped.output == "TorchServe stopped\n"
    assert not server.group_alive(running.pid)
    again = runner.invoke(main, ["stop", "--home", str(home)]).output
    assert again == f"no server is running from {home}: nothing to stop (or pass --home to where it was started)\n"
