"""tsctl bench against the real TorchServe: bounded load, honest counts, and the batch-size sweep."""

import json

import pytest
from click.testing import CliRunner

from archiver import bench, server
from archiver.cli import main
from archiver.errors import UserError
from conftest import RunningServer, package_resnet


@pytest.fixture(scope="module")
def srv(image_sample, tmp_path_factory):
    store = tmp_path_factory.mktemp("bench") / "model-store"
    package_resnet(image_sample, store, config_text="batchSize: 2\nmaxBatchDelay: 20\n")
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
    result = bench.run_load(f"{srv.inference}/predictions/resnet18", inputs[:1], concurrency=2, duration=1.0)
    assert result.requests >= 1 and result.errors == 0
    assert result.seconds < 1.0 + 5  # stops once the requests in flight return


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
    with pytest.raises(UserError, match="exactly one of --requests and --duration"):
        bench.run_load("http://127.0.0.1:9/x", [(b"", "a/b")], 1)
