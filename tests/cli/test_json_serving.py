"""``--json`` of serve, stop, predict, run, verify and bench: one JSON document on stdout holding the
keys docs/json-output.md documents, nothing else there. One TorchServe for the module, started by
``tsctl serve --json`` in a pipe (as a script starts it), on a tensor model of a few weights with
golden answers; stopped by ``tsctl stop --json``."""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from archiver import properties, server
from archiver.cli import main
from helpers.hostile import build, scripted
from helpers.paths import short_tmp

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "json-output.md").read_text()


def documented(command: str) -> str:
    """The section of docs/json-output.md for ``tsctl COMMAND``."""
    return DOC.split(f"## tsctl {command}\n", 1)[1].split("\n## ", 1)[0]


def assert_documented(command: str, *keys: str):
    section = documented(command)
    for key in keys:
        assert f'"{key}"' in section and f"`{key}`" in section, (command, key)


def tsctl_json(*args):
    """``tsctl ARGS --json`` through click's runner: (exit code, the document on stdout, stderr)."""
    result = CliRunner().invoke(main, [*map(str, args), "--json"])
    return result.exit_code, json.loads(result.stdout), result.stderr


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("json")
    (root / "golden").mkdir()
    (root / "golden" / "row.json").write_text("[[1, 2, 3, 4]]")
    weights = scripted(root / "tensor.pt", torch.nn.Linear(4, 2))
    build(root, "tensor", "tensor", weights, "batchSize: 2\nmaxBatchDelay: 10\n", root / "golden")
    (root / "store").rename(root / "model-store")
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    (root / "row.json").write_text("[[1, 2, 3, 4]]")
    (root / "bad.json").write_text('{"nothing": "here"}')
    binary = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    binary["parameters"] = {"binary_data_output": True}
    (root / "binary.json").write_text(json.dumps(binary))
    return root


@pytest.fixture(scope="module")
def served(root):
    """``tsctl serve --json`` in ``root``, stdout a pipe: (its document, its stderr, the home)."""
    home = short_tmp("json-")
    done = subprocess.run(
        [sys.executable, "-m", "archiver.cli", "serve", "--home", str(home), "--json"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        yield json.loads(done.stdout), done.stderr, home
    finally:
        srv = server.read_state(home)
        if srv is not None:
            server.stop(srv)
        shutil.rmtree(home, ignore_errors=True)


def test_serve(served):
    document, stderr, home = served
    assert stderr == ""
    assert set(document) == {"engine", "pid", "home", "models", "addresses", "key_file", "notes"}
    assert_documented("serve", *document)
    assert document["notes"] == []  # every archive of the store is in the config's snapshot
    assert document["key_file"] is None  # tsctl config's file turns token authorization off
    recorded = server.read_state(home)
    assert (document["engine"], document["pid"], document["home"]) == ("torchserve", recorded.pid, str(home))
    assert document["models"] == ["tensor"]
    assert document["addresses"] == {
        "inference": recorded.inference,
        "management": recorded.management,
        "metrics": recorded.metrics_url,
        "ts_grpc_inference": recorded.ts_grpc_inference,  # TorchServe's inference.proto
        "ts_grpc_management": recorded.ts_grpc_management,  # its management.proto
        "grpc": recorded.ts_grpc_inference,  # the former key, as before
        "logs": str(recorded.logs),
    }
    assert recorded.ts_grpc_inference != recorded.ts_grpc_management and recorded.kserve_v2_grpc is None
    assert_documented("serve", *document["addresses"])


def test_predict(root, served):
    _, _, home = served
    inputs = (root / "row.json", root / "bad.json", root / "binary.json")
    code, document, _ = tsctl_json("predict", "tensor", *inputs, "--home", home)
    assert code == 1  # bad.json is refused
    assert set(document) == {"model", "url", "results"}
    assert_documented("predict", *document)
    assert document["model"] == "tensor" and document["url"].endswith("/predictions/tensor")
    row, bad, binary = document["results"]
    assert set(row) == {"path", "status", "body", "base64"}
    assert_documented("predict", *row)
    assert (row["path"], row["status"], len(row["body"][0]), row["base64"]) == (str(root / "row.json"), 200, 2, False)
    assert bad["status"] == 400 and bad["body"]["type"] == "ClientError"
    # a binary answer (v2's binary tensor extension): its bytes, in base64, not text with U+FFFD in it
    raw = base64.b64decode(binary["body"]) if binary["base64"] else b""
    header, end = json.JSONDecoder().raw_decode(raw.decode("latin-1"))
    assert header["outputs"][0]["shape"] == [1, 2] and len(raw) - end == 2 * 4, binary
    text = CliRunner().invoke(main, ["predict", "tensor", str(root / "binary.json"), "--home", str(home)]).output
    assert re.fullmatch(rf"{re.escape(str(root / 'binary.json'))}: 200 <\d+ bytes>\n", text), text


def test_run(root, served):
    archive = root / "model-store" / "tensor.mar"
    code, document, stderr = tsctl_json("run", archive, root / "row.json", root / "binary.json")
    assert code == 0 and stderr == "", stderr
    assert set(document) == {"archive", "results"} and document["archive"] == str(archive)
    assert_documented("run", *document)
    row, binary = document["results"]
    assert set(row) == set(binary) == {"path", "status", "content_type", "answer", "base64"}
    assert_documented("run", *row)
    assert (row["status"], row["content_type"], row["base64"], len(row["answer"][0])) == (
        200,
        "application/json",
        False,
        2,
    )
    # the same request to the server: the same answer
    _, predicted, _ = tsctl_json("predict", "tensor", root / "row.json", "--home", served[2])
    assert predicted["results"][0]["body"][0] == pytest.approx(row["answer"][0])
    # a binary answer (KServe v2's binary tensor extension): base64 of the bytes
    assert (binary["status"], binary["content_type"], binary["base64"]) == (200, "application/octet-stream", True)
    raw = base64.b64decode(binary["answer"])
    header, end = json.JSONDecoder().raw_decode(raw.decode("latin-1"))  # the JSON header, then the tensor
    assert header["outputs"][0]["shape"] == [1, 2] and len(raw) - end == 2 * 4  # two FP32


def test_verify(root, served):
    _, _, home = served
    code, document, stderr = tsctl_json("verify", root / "model-store" / "tensor.mar", "--served", "--home", home)
    assert code == 0 and stderr == "", stderr
    assert set(document) == {"where", "checked", "problems", "versions", "signature"}
    assert_documented("verify", *document)
    srv = server.read_state(home)
    assert document == {
        "where": f"{srv.inference} (ts)",
        "checked": 1,
        "problems": [],
        "versions": [],
        "signature": None,
    }


def test_bench(root, served):
    _, _, home = served
    code, document, _ = tsctl_json(
        "bench", "tensor", "--input", root / "row.json", "--requests", "6", "--concurrency", "2", "--home", home
    )
    assert code == 0
    assert set(document) == {"requests", "errors", "seconds", "throughput_rps", "latency_ms", "statuses"}
    assert_documented("bench", *document)
    assert (document["requests"], document["errors"], document["statuses"]) == (6, 0, {"200": 6})
    assert set(document["latency_ms"]) == {"p50", "p90", "p99", "mean"}
    code, document, _ = tsctl_json(
        "bench", "tensor", "--input", root / "bad.json", "--requests", "2", "--concurrency", "1", "--home", home
    )
    assert code == 1 and document["errors"] == 2  # no answer was 200: no latency, null (JSON has no NaN)
    assert document["latency_ms"] == {"p50": None, "p90": None, "p99": None, "mean": None}


def test_stop(served):
    document_served, _, home = served
    code, document, _ = tsctl_json("stop", "--home", home)
    assert code == 0
    assert document == {"stopped": True, "engine": "torchserve", "pid": document_served["pid"], "home": str(home)}
    assert_documented("stop", *document)
    assert not server.group_alive(document_served["pid"])
    code, document, _ = tsctl_json("stop", "--home", home)
    assert (code, document) == (0, {"stopped": False, "engine": None, "pid": None, "home": str(home)})


def test_every_documented_section_of_these_commands_is_written():
    for command in ("serve", "stop", "predict", "run", "verify", "bench"):
        assert "(to be written)" not in documented(command) and re.search(r"```json\n", documented(command))
