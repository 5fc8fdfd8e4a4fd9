"""Workers forked from the fork server (serving/worker/fork_server.py) are the workers a new process would be:
the same view of their environment, their own process group and random sequence, the right pid under
concurrent starts, and nothing left running when the server goes."""

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from helpers.engine_limits import archive_handler
from helpers.forks import forked_probe
from serving.local_model import LocalModel
from serving.worker import fork_server

VIEW = """\
import os, random, sys, tempfile

import numpy as np
import torch


def handle(data, context):
    if data is None:
        return None
    import PIL
    return [{
        "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "cwd": os.getcwd(),
        "path": sys.path, "marker": os.environ.get("TSCTL_TEST_MARKER"), "tmp": tempfile.gettempdir(),
        "tmpdir": os.environ.get("TMPDIR"), "threads": torch.get_num_threads(),
        "no_bytecode": sys.dont_write_bytecode, "PIL": PIL.__file__,
        "draws": [random.random(), float(np.random.rand()), float(torch.rand(1))],
        "stdin": os.readlink("/proc/self/fd/0"),
    } for _ in data]
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("forked")
    (root / "view.py").write_text(VIEW)
    archive_handler(root / "view.py", ["view"], root)
    shadowing = root / "shadow"  # an archive bringing its own PIL
    shadowing.mkdir()
    (shadowing / "view.py").write_text(VIEW)
    (shadowing / "PIL.py").write_text("OURS = True\n")
    archiver = str(Path(os.sys.executable).parent / "torch-model-archiver")
    command = [
        archiver,
        "--model-name",
        "shadow",
        "--version",
        "1.0",
        "--handler",
        str(shadowing / "view.py"),
        "--extra-files",
        str(shadowing / "PIL.py"),
        "--export-path",
        str(root),
    ]
    subprocess.run(command, check=True, capture_output=True)
    return root


def view(model: LocalModel) -> dict:
    [answer] = model.predict(["look"])
    assert answer.status == 200, answer.body
    return answer.json()


def test_a_forked_worker_sees_what_a_new_process_sees(store, monkeypatch):
    monkeypatch.setenv("TSCTL_TEST_MARKER", "given")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    views = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("TSCTL_FORK_SERVER", mode)
        with LocalModel(store / "view.mar") as model:
            views[mode] = view(model), model, model._tmp
            assert views[mode][0]["pid"] == model.worker.pid
            server = getattr(model.worker.process, "server", None)  # the fork server that forked it
    (spawned, spawned_model, spawned_tmp), (forked, forked_model, forked_tmp) = views["0"], views["1"]
    assert spawned["ppid"] == os.getpid() and forked["ppid"] == server.process.pid  # each made as it says
    for one, model, tmp in ((spawned, spawned_model, spawned_tmp), (forked, forked_model, forked_tmp)):
        assert one["pgid"] == one["pid"]  # a process group of its own
        assert one["cwd"] == str(model.model_dir) and one["path"][0] == str(model.model_dir)
        assert one["marker"] == "given" and one["tmp"] == one["tmpdir"] and one["tmp"].startswith(tmp)
        assert one["threads"] == 1 and one["no_bytecode"] is True and one["stdin"] == "/dev/null"
        assert one["PIL"].startswith(str(Path(os.sys.executable).parent.parent))  # the interpreter's PIL
    assert spawned["path"][1:] == forked["path"][1:]  # the same path after the model's folder


def test_concurrent_starts_each_know_their_own_pid_and_draw_their_own_numbers(store):
    models, errors = [], []

    def start():
        try:
            models.append(LocalModel(store / "view.mar"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    try:
        assert not errors and len(models) == 5, errors
        views = [view(model) for model in models]
        assert [v["pid"] for v in views] == [m.worker.pid for m in models]
        for generator in range(3):  # random, numpy's, torch's: no two workers share a sequence
            assert len({v["draws"][generator] for v in views}) == 5, generator
    finally:
        for model in models:
            model.close()


def test_an_archive_bringing_a_module_of_a_name_the_worker_may_import_imports_its_own(store):
    with LocalModel(store / "shadow.mar") as model:  # PIL is not preloaded (a handler's own Pillow comes first)
        assert view(model)["PIL"] == str(model.model_dir / "PIL.py")


def test_a_killed_worker_reports_its_signal_and_a_lost_server_takes_its_workers(store):
    with LocalModel(store / "view.mar") as model:
        process = model.worker.process
        assert isinstance(process, fork_server.ForkedProcess)
        os.killpg(process.pid, signal.SIGKILL)
        assert process.wait(10) == -signal.SIGKILL
    with LocalModel(store / "view.mar") as model:
        server, pid = model.worker.process.server, model.worker.pid
        os.killpg(server.process.pid, signal.SIGKILL)
        assert model.worker.process.wait(10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            assert time.monotonic() < deadline, "the lost server's worker still runs"
            time.sleep(0.05)
    with LocalModel(store / "view.mar") as model:  # the next start has a new server
        assert view(model)["ppid"] == model.worker.process.server.process.pid != server.process.pid


def test_the_server_ends_with_the_process_that_started_it():
    """A caller killed with -9 runs no atexit: its fork server must still end (it reads the caller's end close)."""
    code = "import os; from serving.worker import fork_server; print(fork_server.shared().process.pid, flush=True); "
    code += "os.kill(os.getpid(), 9)"
    done = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    server = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{server}") and "Z" not in Path(f"/proc/{server}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "the fork server outlived the process that started it"
        time.sleep(0.05)


PROBE = """\
import json, os, sys
import torch
seen = sorted(m for m in ("PIL", "torchvision", "transformers") if m in sys.modules)  # before any import here
import transformers
a = torch.rand(512, 512)
for _ in range(20):
    a = (a @ a).clamp(-1, 1)  # torch's threads, in a fork of a server that imported transformers
print(json.dumps({"seen": seen, "threads": torch.get_num_threads(), "transformers": transformers.__file__}))
"""


def test_an_engines_server_imports_the_extras_once_settled_and_its_workers_find_them(tmp_path):
    """``extras``: what handlers import first is imported once the server has settled (no request for
    ``settle`` s), so that a worker restarted or added later does not import it again; before, the server
    has not paid for them; a worker whose path brings its own transformers is spawned instead; torch's
    threads run in a fork made after those imports."""
    env = dict(os.environ, OMP_NUM_THREADS="2")
    plain, bringing = tmp_path / "plain", tmp_path / "bringing"
    for folder in (plain, bringing):
        folder.mkdir()
        (folder / "probe.py").write_text(PROBE)
    (bringing / "transformers.py").write_text("OURS = True\n")
    with_extras = fork_server.ForkServer(fork_server.start_environment(env), extras=True, settle=10.0)
    without = None
    try:
        first = forked_probe(with_extras, plain, env)  # at once: before the server was idle
        assert first["seen"] == [] and first["threads"] == 2, first
        time.sleep(fork_server.IDLE + 4)  # idle, not settled: nothing imported yet
        assert forked_probe(with_extras, plain, env)["seen"] == []
        without = fork_server.ForkServer(fork_server.start_environment(env))
        deadline, later = time.monotonic() + 90, first
        while later["seen"] != ["PIL", "torchvision", "transformers"] and time.monotonic() < deadline:
            time.sleep(10.0 + fork_server.IDLE + 4)  # each probe unsettles the server: room for an import or two
            later = forked_probe(with_extras, plain, env)
        assert later["seen"] == ["PIL", "torchvision", "transformers"] and later["threads"] == 2, later
        assert forked_probe(with_extras, bringing, env) is None  # shadowed: the caller spawns it
        assert forked_probe(without, plain, env)["seen"] == []  # without extras: nothing but PRELOAD
    finally:
        for server in (with_extras, without):
            if server is not None:
                server.close()


HOPPER = """\
import ctypes, os, sys, time
marker = sys.argv[1]
if ctypes.PyDLL(None).syscall(56, 0x8000 | 17, 0, 0, 0, 0) == 0:  # SYS_clone, CLONE_PARENT: the server's child
    os.setsid()
    with open(marker + ".tmp", "w") as session:  # its session: every hop's
        session.write(str(os.getpid()))
    os.rename(marker + ".tmp", marker)
    while True:  # a new pid every 5 ms: clone a sibling (the server's child again), then exit
        time.sleep(0.005)
        if ctypes.PyDLL(None).syscall(56, 0x8000 | 17, 0, 0, 0, 0) > 0:
            os._exit(0)
while not os.path.exists(marker):
    time.sleep(0.01)
print("hopping", flush=True)
time.sleep(600)
"""


def test_a_closed_server_ends_what_is_below_it_and_exits_on_its_own(tmp_path):
    """``close()`` with a worker still running and a process it made a sibling of itself (the server's child,
    in a session of its own, changing its pid every 5 ms): the server ends both and exits on its own (code
    0), and nothing of the hopper is left. Before, the client's reading thread took the end of the socket
    that close() made for a server lost and SIGKILLed it at once (-9), before it could end its children: the
    hopper outlived the engine's stop in 2 of 4 runs of tests/security/test_attack_worker_lifetimes.py."""
    marker = tmp_path / "hopping"
    (tmp_path / "probe.py").write_text(HOPPER)
    server = fork_server.ForkServer(fork_server.start_environment(dict(os.environ)))
    out_read, out_write = os.pipe()
    metrics_read, metrics_write = os.pipe()
    try:
        child = server.spawn(
            [str(tmp_path / "probe.py"), str(marker)], str(tmp_path), dict(os.environ), out_write, metrics_write
        )
        assert child is not None
        os.close(out_write)
        with os.fdopen(out_read, "rb") as out:
            assert out.readline() == b"hopping\n"
    finally:
        server.close()
        os.close(metrics_read)
    assert server.process.returncode == 0, f"the server was killed ({server.process.returncode}) rather than exit"
    session, left = marker.read_text(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state, _, _, sid = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[:4]
        except OSError:
            continue
        if sid == session and state != "Z":
            left.append(pid)
    for pid in left:
        os.kill(int(pid), signal.SIGKILL)
    assert not left, f"the hopper outlived its server: {left}"
