"""An outsider's attack on the model store's boundary (#43 case 5): register urls and store entries that
lead out of the model store. TorchServe's rule (ModelArchive.downloadModel) is that archives come from
the store; the engine took a url's file name (``sub/echo2.mar``, ``/anywhere/echo2.mar``: the store's
echo2.mar, as TorchServe) and followed links in the store to archives anywhere (``evil.mar`` ->
outside/evil.mar, a directory too), at register and at startup alike. Now one function
(serving/model_store.store_entry) decides, and each of these is TorchServe's 404 for a url it cannot find.

One engine (model API on, echo 1.0 from load_models, which also names the link: left out at start), its
models and workers' pids checked after every refused call; startup's other paths (a snapshot's marName,
a store served without a config) read by ts_config in this process."""

import shutil
import urllib.parse
import zipfile

import pytest

from archiver import server
from helpers.engine import Engine
from helpers.management import build_store
from serving import ts_config


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """model-store/: echo.mar, echo2.mar, broken.mar; evil.mar and evil_dir, links to an archive and an
    unpacked one outside; inside.mar, a link to echo2.mar within the store; sub/inner.mar."""
    root = tmp_path_factory.mktemp("model-store-boundary")
    store = build_store(root)
    outside = root / "outside"
    outside.mkdir()
    shutil.copy(store / "echo2.mar", outside / "evil.mar")
    with zipfile.ZipFile(store / "echo2.mar") as archive:
        archive.extractall(outside / "evil_dir")
    (store / "evil.mar").symlink_to(outside / "evil.mar")
    (store / "evil_dir").symlink_to(outside / "evil_dir")
    (store / "inside.mar").symlink_to("echo2.mar")
    (store / "sub").mkdir()
    shutil.copy(store / "echo2.mar", store / "sub" / "inner.mar")
    return root


@pytest.fixture(scope="module")
def engine(tree):
    config = tree / "config" / "config.properties"
    config.parent.mkdir()
    config.write_text("disable_token_authorization=true\nenable_model_api=true\ndefault_workers_per_model=1\n"
                      "load_models=echo.mar,evil.mar\n")  # fmt: skip
    running = Engine(tree, "--enable_grpc", "false").wait_ready()
    yield running
    assert running.stop() == 0


def state(engine) -> dict:
    status, listed = engine.get("/models/echo/all")
    assert status == 200, listed
    return {"engine": engine.process.pid, "models": [(m["modelVersion"], m["modelUrl"]) for m in listed],
            "workers": [w["pid"] for m in listed for w in m["workers"]]}  # fmt: skip


def register(engine, url: str):
    query = urllib.parse.urlencode({"url": url, "initial_workers": 0})
    return server.request(f"{engine.url}/models?{query}", b"", "POST", timeout=60)


def test_startup_left_out_the_link_leading_out_of_the_store(engine):
    """load_models=echo.mar,evil.mar: echo 1.0 served, evil.mar (echo 2.0 from outside) left out with a line
    naming it (before: both served)."""
    assert state(engine)["models"] == [("1.0", "echo.mar")]
    assert "evil.mar is a link that leads outside the model store" in engine.output()


@pytest.mark.parametrize(
    "url, why",
    [
        ("evil.mar", "evil.mar is a link that leads outside the model store"),
        ("evil_dir", "evil_dir is a link that leads outside the model store"),
        ("sub/echo2.mar", "named by its file name alone"),
        ("{outside}/evil.mar", "named by its file name alone"),
        ("sub/inner.mar", "named by its file name alone"),
        ("../outside/evil.mar", None),
    ],
)
def test_a_register_outside_the_store_is_torchserves_404_and_changes_nothing(engine, tree, url, why):
    """Each url leading out of the store (or into a sub-directory, which TorchServe reads as the store's file
    of that name): 404 ModelNotFoundException, TorchServe's words and why; no model, no worker, no pid
    changed. Before the fix the first four registered echo 2.0 (200)."""
    url = url.format(outside=tree / "outside")
    before = state(engine)
    status, body = register(engine, url)
    assert status == 404 and body["type"] == "ModelNotFoundException", (status, body)
    if why is None:
        assert body["message"] == f"Relative path is not allowed in url: {url}", body
    else:
        assert body["message"].startswith(f"Model not found at: {url} (") and why in body["message"], body
    assert state(engine) == before


def test_a_link_within_the_store_still_registers(engine):
    status, body = register(engine, "inside.mar")
    assert status == 200, body
    status, body = server.request(f"{engine.url}/models/echo/2.0", None, "DELETE", timeout=60)
    assert status == 200, body


def test_startup_from_a_snapshot_or_the_store_alone_refuses_the_link(tree, tmp_path):
    """The other startup paths, as the engine and 'tsctl serve' read them (ts_config.models): a snapshot
    naming evil.mar is a ConfigError naming why; a store served without a config leaves evil.mar and
    evil_dir out with a note each, and serves the rest (before: both served, as echo 2.0)."""
    store = tmp_path / "model-store"
    store.mkdir()
    shutil.copy(tree / "model-store" / "echo.mar", store)
    for name in ("evil.mar", "evil_dir"):
        (store / name).symlink_to(tree / "outside" / name)
    config = tmp_path / "config.properties"
    entry = '{"1.0": {"defaultVersion": true, "marName": "evil.mar", "minWorkers": 1, "maxWorkers": 1}}'
    config.write_text(f'model_snapshot={{"name": "startup.cfg", "modelCount": 1, "models": {{"echo": {entry}}}}}\n')
    with pytest.raises(ts_config.ConfigError, match="evil.mar is a link that leads outside the model store"):
        ts_config.models(config, store)
    specs, frontend = ts_config.models(None, store, skip_unreadable=True)
    assert [spec.archive.name for spec in specs] == ["echo.mar"]
    notes = " ".join(frontend.notes)
    assert "evil.mar is a link" in notes and "evil_dir is a link" in notes, notes



def test_an_entry_swapped_for_a_pipe_is_refused_not_waited_on(tmp_path, monkeypatch):
    """An outsider's attack (#43): a store entry swapped, again and again, between an empty file and a FIFO.
    The archive was checked as a regular file, then opened by its path: one open in 20 met the FIFO and
    blocked for ever, holding the engine's management lock (every later register and scale timed out;
    SIGTERM waited behind it). The swap landing between the check and the open is made certain here: the
    check is told the FIFO is a file. Now the open does not block, and what was opened must be a regular
    file: refused at once."""
    import os
    import threading
    from pathlib import Path as FsPath

    from handlers.archives import Archive, ArchiveError

    pipe = tmp_path / "y.mar"
    os.mkfifo(pipe)
    really = FsPath.is_file
    monkeypatch.setattr(FsPath, "is_file", lambda path: path == pipe or really(path))  # it was a file when checked
    outcome = []

    def open_it():
        try:
            Archive(pipe).close()
            outcome.append("opened")
        except ArchiveError as exc:
            outcome.append(str(exc))

    opener = threading.Thread(target=open_it, daemon=True)
    opener.start()
    opener.join(20)
    hung = opener.is_alive()
    if hung:  # a writer unblocks the open, so that the thread ends
        os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
        opener.join(10)
    assert not hung, "the open waited on the pipe"
    assert outcome == [f"{pipe} is not a regular file: give a .mar, .tar.gz or model directory"], outcome
