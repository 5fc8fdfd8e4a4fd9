"""``tsctl serve --last-snapshot`` (issue #47): the models a user registered and scaled through the management
API outlive a restart, as `torchserve --start` without --ts-config restores them from its last config
snapshot. TorchServe 0.12 writes its own snapshots (HOME/logs/config), the tsctl engine writes the same
files (serving/engine/snapshots.py): each runtime resumes from the other's, so each reads what the other wrote as
TorchServe itself does. The user's mistakes are one line each, exit 2, nothing started.

Each server runs as a user starts it (``tsctl serve`` as its own process) in its own home, stopped by the test
by its process group (server.json)."""

import contextlib
import json

import pytest
import torch

from archiver import properties, server
from archiver.engines.base import snapshot_dir
from archiver.http_client import request
from helpers.hostile import build, scripted
from helpers.paths import short_tmp
from helpers.processes import tsctl
from serving.engine import snapshots


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """model-store/ with two tensor models; config/config.properties (tsctl config) naming the first only:
    the second is in the store for a user to register."""
    root = tmp_path_factory.mktemp("resume")
    weights = scripted(root / "tensor.pt", torch.nn.Linear(4, 2))
    build(root, "tensor", "tensor", weights, "batchSize: 1\n")
    (root / "store").rename(root / "model-store")
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    build(root, "later", "tensor", weights, "batchSize: 1\n")
    (root / "store" / "later.mar").rename(root / "model-store" / "later.mar")
    return root


@contextlib.contextmanager
def served(root, home, *args):
    """``tsctl serve --json ARGS`` in ``root`` with ``home``: its Server, stopped after (by its process group)."""
    code, out, err = tsctl("serve", "--home", home, "--json", *args, cwd=root)
    srv = server.read_state(home)
    try:
        assert code == 0, out + err
        yield srv
    finally:
        if srv is not None:
            server.stop(srv)


def manage(srv, method: str, path: str) -> dict:
    status, body = request(
        f"{srv.management}{path}", b"" if method != "GET" else None, method, srv.headers("management"), timeout=120
    )
    assert status == 200, (method, path, status, body)
    return body


def workers(srv) -> dict:
    """Each model the server serves, with its number of workers (describe)."""
    names = [m["modelName"] for m in manage(srv, "GET", "/models")["models"]]
    return {name: len(manage(srv, "GET", f"/models/{name}")[0]["workers"]) for name in names}


RESUMES = [
    ("tsctl", "torchserve"),  # the engine's snapshot, as TorchServe 0.12 reads it
    pytest.param("torchserve", "tsctl", marks=pytest.mark.matrix),  # TorchServe's, as the engine reads it
]


@pytest.mark.parametrize("first, then", RESUMES)
def test_registered_and_scaled_models_come_back_with_last_snapshot(root, first, then):
    home = short_tmp("resume-")
    with served(root, home, "--engine", first, "--enable-model-api") as srv:
        assert workers(srv) == {"tensor": 1}
        manage(srv, "POST", "/models?url=later.mar&initial_workers=1&synchronous=true")
        manage(srv, "PUT", "/models/tensor?min_worker=2&max_worker=2&synchronous=true")
        assert workers(srv) == {"tensor": 2, "later": 1}
    with served(root, home, "--engine", then, "--last-snapshot") as srv:
        assert workers(srv) == {"tensor": 2, "later": 1}, snapshots.latest(snapshot_dir(home)).read_text()
        status, body = request(
            f"{srv.inference}/predictions/later",
            json.dumps([[1.0, 2.0, 3.0, 4.0]]).encode(),
            "POST",
            {"Content-Type": "application/json", **srv.headers()},
            timeout=60,
        )
        assert status == 200, body


def test_last_snapshot_mistakes_are_one_line(root, tmp_path):
    home = tmp_path / "home"
    for args, words in (
        ((), ["holds no config snapshot", "serve with --config first"]),
        (("--config", "config/config.properties"), ["--config config/config.properties and --last-snapshot"]),
        (("--engine", "mlserver"), ["MLServer", "keeps no config snapshot"]),
    ):
        code, out, err = tsctl("serve", "--home", home, "--last-snapshot", *args, cwd=root, timeout=60)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and all(w in lines[0] for w in words), (args, out, err)
    assert not (home / "server.json").exists()


def test_the_newest_snapshot_is_the_one_its_name_dates(tmp_path):
    """TorchServe's getLastSnapshot: the time in the name, not the file's; other files are not snapshots."""
    for name in (
        "20261128131635420-startup.cfg",
        "20261128131646517-shutdown.cfg",
        "20261128131641714-snapshot.cfg",
        "notes.cfg",
        "20261128131699999-snapshot.cfg.bak",
    ):
        (tmp_path / name).write_text("")
    assert snapshots.latest(tmp_path).name == "20261128131646517-shutdown.cfg"
    assert snapshots.latest(tmp_path / "none") is None
    assert snapshots.file_name("snapshot").endswith("-snapshot.cfg") and len(snapshots.file_name("x")) == 23
