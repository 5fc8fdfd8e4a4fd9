"""Attacks on issue #33's surfaces: the capacity result file (``capacity.load``, ``export kserve --from-bench``),
the numbers ``export kserve --autoscale`` derives from it and from its flags, the model names that go into
KEDA's PromQL, and ``tsctl shadow`` against hostile stand-in servers. Each attack is a one-line refusal (exit
2) naming the file or flag, or for shadow a gate that does not pass what it did not compare. No model is
served and nothing is packaged by torch: each test is well under a second."""

import http.server
import json
import math
import zipfile

import pytest
from click.testing import CliRunner

from archiver import capacity
from archiver.cli import main
from archiver.errors import UserError
from archiver.export import autoscale, crds, kserve, targets
from archiver.export.options import ExportOptions
from helpers.servers import stand_in_http

STEPS = [(1, 20.0, 60.0), (2, 38.0, 70.0), (4, 70.0, 120.0), (8, 110.0, 620.0), (16, 111.0, 900.0)]


def result(**changes) -> dict:
    steps = [
        {"concurrency": c, "requests": 200, "seconds": 3.0, "throughput_rps": rps, "p50_ms": p99 / 2,
         "p90_ms": p99, "p99_ms": p99, "errors": 0, "queue_depth": None}
        for c, rps, p99 in STEPS
    ]  # fmt: skip
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
    return autoscale.check(ExportOptions(**base), SNAPSHOT, targets.named("tsctl"), [])


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
    assert str(path) in refused(lambda: capacity.load(path))


def test_a_result_file_that_never_ends_is_refused_unread(tmp_path):
    """A symlink to /dev/zero: refused by its size, not read until memory runs out."""
    path = tmp_path / "zero.json"
    path.symlink_to("/dev/zero")
    text = refused(lambda: capacity.load(path))
    assert str(path) in text

