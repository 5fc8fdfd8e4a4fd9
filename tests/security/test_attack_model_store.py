"""An outsider's attack on the model store's boundary (#43 case 5): register urls and store entries that
lead out of the model store. TorchServe's rule (ModelArchive.downloadModel) is that archives come from
the store; the engine took a url's file name (``sub/echo2.mar``, ``/anywhere/echo2.mar``: the store's
echo2.mar, as TorchServe) and followed links in the store to archives anywhere (``evil.mar`` ->
outside/evil.mar, a directory too), at register and at startup alike. Now one function
(serving/model_store.store_entry) decides, and each of these is TorchServe's 404 for a url it cannot find.

One engine (model API on, echo 1.0 from load_models, which also names the link: left out at start), its
models and workers' pids checked after every refused call; startup's other paths (a snapshot's marName,
a store served without a config) read by ts_config in this process.

A second attack (#43) swapped links in the store while the engine read it: the entry was checked once,
then opened by its path twice more (to read the settings, then to unpack), and a directory archive was
served where it lies, its workers reading it again at every restart. 100 of 300 registers of a link
flipping between an archive inside and one outside read the outside one; a directory archive's handler,
swapped for a link out after its register, ran at the worker's restart; a link out in a directory archive
(a helper module) loaded. Now a register opens the archive once, within the store (the real path of what
was opened must lie inside it: ``handlers.confined``), and reads everything from that opening; a
directory archive of the store is copied into the engine's own folder, its links followed only inside
the store, and the workers run the copy."""

import os
import shutil
import signal
import subprocess
import sys
import urllib.parse
import zipfile
from pathlib import Path

import pytest

from archiver import server
from handlers.archives import Archive, ArchiveError
from helpers import waiting
from helpers.engine import BIN, Engine
from helpers.management import build_store
from serving import config_properties, ts_config
from serving.engine import management as engine_management

OUTSIDE_HANDLER = """\
def handle(data, context):
    return None if data is None else [{"echo": "OUTSIDE"} for _ in data]
"""
# a link flipped between two targets as fast as a process can, until it is killed
FLIPPER = """\
import os, sys
link, a, b = sys.argv[1:]
while True:
    for target in (a, b):
        os.symlink(target, link + ".flip")
        os.rename(link + ".flip", link)
"""


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
    build_archive(OUTSIDE_HANDLER, "echo", "6.6", outside / "race.mar", root)
    return root


def build_archive(handler: str, name: str, version: str, target: Path, root: Path) -> Path:
    """torch-model-archiver's archive of one handler (its source ``handler``), written to ``target``."""
    folder = root / f"src-{target.stem}-{version}"
    folder.mkdir()
    (folder / "h.py").write_text(handler)
    command = [
        str(BIN / "torch-model-archiver"),
        "--model-name",
        name,
        "--version",
        version,
        "--handler",
        str(folder / "h.py"),
        "--export-path",
        str(folder),
    ]
    subprocess.run(command, check=True, capture_output=True, env=dict(os.environ, TMPDIR=str(root)))
    (folder / f"{name}.mar").rename(target)
    return target


def unpacked(mar: Path, into: Path) -> Path:
    with zipfile.ZipFile(mar) as found:
        found.extractall(into)
    return into


@pytest.fixture(scope="module")
def engine(tree):
    config = tree / "config" / "config.properties"
    config.parent.mkdir()
    config.write_text(
        "disable_token_authorization=true\nenable_model_api=true\ndefault_workers_per_model=1\n"
        "load_models=echo.mar,evil.mar\n"
    )
    running = Engine(tree, "--enable_grpc", "false").wait_ready()
    yield running
    assert running.stop() == 0


def state(engine) -> dict:
    status, listed = engine.get("/models/echo/all")
    assert status == 200, listed
    return {
        "engine": engine.process.pid,
        "models": [(m["modelVersion"], m["modelUrl"]) for m in listed],
        "workers": [w["pid"] for m in listed for w in m["workers"]],
    }


def register(engine, url: str, workers: int = 0):
    query = urllib.parse.urlencode({"url": url, "initial_workers": workers})
    return server.request(f"{engine.url}/models?{query}", b"", "POST", timeout=60)


def unregister(engine, name: str, version: str):
    status, body = server.request(f"{engine.url}/models/{name}/{version}", None, "DELETE", timeout=60)
    assert status == 200, body


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
    with pytest.raises(config_properties.ConfigError, match="evil.mar is a link that leads outside the model store"):
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


def test_a_link_flipping_out_of_the_store_while_it_is_registered_never_registers_what_lies_outside(engine, tree):
    """x.mar flips, as fast as a process can, between echo2.mar (echo 2.0, inside) and a link to
    outside/race.mar (echo 6.6). 200 registers: each is refused (the link led out when looked at: 404; or
    when opened: 400) or registers echo 2.0. Before, a third of them registered echo 6.6 from outside."""
    store = tree / "model-store"
    link = store / "x.mar"
    link.symlink_to("echo2.mar")
    flip = [sys.executable, "-c", FLIPPER, str(link), "echo2.mar", str(tree / "outside" / "race.mar")]
    flipper = subprocess.Popen(flip, start_new_session=True)
    outcomes = {}
    try:
        for _ in range(200):
            status, body = register(engine, "x.mar")
            if status == 200:
                versions = [v for v, _ in state(engine)["models"] if v != "1.0"]
                outcome = f"200 {versions}"
                for version in versions:
                    unregister(engine, "echo", version)
            else:
                outcome = f"{status} {body['message'].split('(')[-1][:40]}"
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    finally:
        os.killpg(flipper.pid, signal.SIGKILL)
        flipper.wait()
        link.unlink()
        (store / "x.mar.flip").unlink(missing_ok=True)
    assert set(outcomes) <= {"200 ['2.0']"} | {o for o in outcomes if o.startswith(("404 ", "400 "))}, outcomes
    assert outcomes.get("200 ['2.0']"), f"no register landed inside: {outcomes}"
    assert [v for v, _ in state(engine)["models"]] == ["1.0"]


def test_the_register_reads_the_archive_it_opened_not_what_its_link_leads_to_after(tree):
    """The race's order made certain, with the engine's own functions: the url is looked at while the link
    leads inside (``archive_for``), then the link is swapped out before the archive is opened: the opening
    is refused (400, naming the store), where before the register read the outside archive. An archive
    opened first stays the one read, whatever the link leads to after."""
    store = tree / "model-store"
    link = store / "swapped.mar"
    link.symlink_to("echo2.mar")
    try:
        path = engine_management.archive_for("swapped.mar", [], store)
        link.unlink()
        link.symlink_to(tree / "outside" / "race.mar")
        with pytest.raises(engine_management.ApiError) as refused:
            engine_management.open_registered(path, store)
        assert refused.value.status == 400 and "leads outside" in str(refused.value.message), refused.value
        link.unlink()
        link.symlink_to("echo2.mar")
        with engine_management.open_registered(path, store) as opened:
            link.unlink()
            link.symlink_to(tree / "outside" / "race.mar")
            assert (opened.version, opened.config) == ("2.0", {})
    finally:
        link.unlink()


def test_a_directory_archive_runs_the_copy_its_register_made_after_its_handler_is_swapped(engine, tree):
    """A directory archive of the store whose handler is a link to a file inside it: registered with a
    worker, its handler then swapped for a link to a handler outside, its worker killed. The restarted
    worker answers as before: the workers run the engine's copy. Before, the restarted worker ran the
    outside handler (the directory was served where it lies)."""
    store = tree / "model-store"
    folder = unpacked(store / "echo2.mar", store / "linked_dir")
    (folder / "echo2_real.py").write_text((folder / "echo2.py").read_text())
    (folder / "echo2.py").unlink()
    (folder / "echo2.py").symlink_to("echo2_real.py")
    (tree / "outside" / "handler.py").write_text(OUTSIDE_HANDLER)
    status, body = register(engine, "linked_dir", workers=1)
    assert status == 200, body
    try:
        status, first = engine.post("/predictions/echo/2.0", b"hi")
        assert status == 200 and first["echo"] == "hi", first
        (folder / "echo2.py").unlink()
        (folder / "echo2.py").symlink_to(tree / "outside" / "handler.py")
        os.kill(first["pid"], signal.SIGKILL)
        waiting.until(
            lambda: engine.workers("echo/2.0"),
            lambda workers: (
                bool(workers) and all(w["status"] == "READY" and w["pid"] not in (0, first["pid"]) for w in workers)
            ),
            "echo 2.0's worker restarted",
            engine.out,
            engine.alive,
            60,
        )
        status, again = engine.post("/predictions/echo/2.0", b"hi")
        assert status == 200 and again["echo"] == "hi" and again["pid"] != first["pid"], again
    finally:
        unregister(engine, "echo", "2.0")
        shutil.rmtree(folder)


def test_a_directory_archives_link_out_of_the_store_is_refused_naming_it(engine, tree):
    """A directory archive whose helper module (a file its manifest does not name) is a link out of the store:
    400 naming the file, nothing registered. Before, it registered and its worker imported the outside file."""
    store = tree / "model-store"
    folder = unpacked(store / "echo2.mar", store / "helper_dir")
    (tree / "outside" / "helper.py").write_text("WHO = 'outside'\n")
    (folder / "helper.py").symlink_to(tree / "outside" / "helper.py")
    before = state(engine)
    try:
        status, body = register(engine, "helper_dir", workers=1)
    finally:
        shutil.rmtree(folder)
    assert status == 400 and body["type"] == "InvalidModelException", body
    assert "helper.py leads to" in body["message"] and "copy the file into the archive" in body["message"], body
    assert state(engine) == before


def test_a_directory_copied_out_of_a_store_follows_links_only_inside_it(tree, tmp_path):
    """What ``Archive.model_dir`` copies of a store's directory archive: a link to a file elsewhere in the
    store is copied as that file; a pipe, a dangling link and a link to a folder it is in are left out
    (the pipe never waited on); a link to a file outside the store refuses the copy, naming it; an unpacked
    directory opened with no store is served where it is, as before."""
    from handlers import confined

    store = tmp_path / "store"
    folder = unpacked(tree / "model-store" / "echo2.mar", store / "d")
    (store / "weights.bin").write_bytes(b"w" * 10)
    (folder / "weights.bin").symlink_to("../weights.bin")
    os.mkfifo(folder / "pipe")
    (folder / "dangling").symlink_to("nowhere")
    (folder / "sub").mkdir()
    (folder / "sub" / "up").symlink_to("..")
    with Archive(folder, within=store) as opened:
        copy = opened.model_dir(tmp_path / "m0")
    assert copy == (tmp_path / "m0").resolve()
    found = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*"))
    assert found == ["MAR-INF", "MAR-INF/MANIFEST.json", "echo2.py", "sub", "weights.bin"], found
    assert not any(p.is_symlink() for p in copy.rglob("*")) and (copy / "weights.bin").read_bytes() == b"w" * 10
    with Archive(folder) as opened:
        assert opened.model_dir(tmp_path / "unused") == folder.resolve()
    (folder / "out.py").symlink_to(tree / "outside" / "evil.mar")
    with Archive(folder, within=store) as opened, pytest.raises(ArchiveError, match="out.py leads to .* copy the file"):
        opened.model_dir(tmp_path / "m1")
    deep = folder / "/".join(["x"] * (confined.MAX_DEPTH + 1))
    (folder / "out.py").unlink()
    deep.mkdir(parents=True)
    with Archive(folder, within=store) as opened, pytest.raises(ArchiveError, match="folders deep"):
        opened.model_dir(tmp_path / "m2")


def test_an_archive_lists_the_directory_it_opened_not_what_its_link_leads_to_after(tree, tmp_path):
    """An outsider's attack (#43): a directory archive's files were listed by its path, so a link swapped after
    the opening listed a folder outside the store, and the refusal named a file there. Now the listing walks the
    directory opened."""
    store = tmp_path / "store"
    unpacked(tree / "model-store" / "echo2.mar", store / "inside")
    outside = unpacked(tree / "model-store" / "echo2.mar", tmp_path / "outside")
    (outside / "..\\secret-name").write_text("x")
    (store / "d").symlink_to("inside")
    with Archive(store / "d", within=store) as opened:
        (store / "d").unlink()
        (store / "d").symlink_to(outside)
        assert [name for name, _ in opened.members] == ["MAR-INF/MANIFEST.json", "echo2.py"]


def test_opening_a_terminal_swapped_in_does_not_make_it_the_engines_controlling_terminal(tmp_path):
    """An outsider's attack (#43): a store entry swapped for a terminal device. Opening it made the terminal
    the engine's controlling terminal (the engine runs in a session of its own, with none), and a ^C typed on
    it then stopped the engine. Opened with O_NOCTTY now: the process still has no controlling terminal."""
    import pty

    leader, follower = pty.openpty()
    try:
        terminal = os.ttyname(follower)
        probe = (
            "import os, sys; from handlers.archives import Archive, ArchiveError\n"
            "try:\n    Archive(sys.argv[1])\nexcept ArchiveError:\n    pass\n"
            "print(open('/proc/self/stat').read().rpartition(')')[2].split()[4])"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe, terminal],
            capture_output=True,
            text=True,
            timeout=60,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],
        )
    finally:
        os.close(leader)
        os.close(follower)
    assert done.returncode == 0 and done.stdout.strip() == "0", (done.stdout, done.stderr)


def test_a_directory_of_too_many_files_is_refused_not_copied_for_minutes(tree, tmp_path, monkeypatch):
    """An outsider's attack (#43): a directory archive of 100,000 tiny files held the engine's management lock
    while it was copied (its unregister then timed out after 120 s). Past MAX_ENTRIES files and folders the
    copy stops, refused in one line (here MAX_ENTRIES 50, and 60 files)."""
    from handlers import confined

    store = tmp_path / "store"
    folder = unpacked(tree / "model-store" / "echo2.mar", store / "d")
    for index in range(60):
        (folder / f"f{index}").write_text("x")
    monkeypatch.setattr(confined, "MAX_ENTRIES", 50)
    with Archive(folder, within=store) as opened, pytest.raises(ArchiveError, match="more than 50 files and folders"):
        opened.model_dir(tmp_path / "m0")
