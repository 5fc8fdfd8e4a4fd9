"""Attacks on the fork server (serving/worker/fork_server.py): a forked worker must be the worker a new process
would be, and nothing one worker does, or that happens to the server, may cost the others or outlive
its owner. Each test here failed before its fix; the caller is often a process of its own, so that it
can be put in a cgroup or killed with -9."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers.engine_limits import archive_handler
from serving.local_model import LoadError, LocalModel
from serving.worker import fork_server

RUNS = '''\
import json


def handle(data, context):
    """Runs the Python it is sent; answers its ``result``."""
    if data is None:
        return None
    answers = []
    for row in data:
        body = row.get("body") if row.get("body") is not None else row.get("data")
        scope = {}
        exec(bytes(body).decode() if isinstance(body, (bytes, bytearray)) else str(body), scope)
        answers.append(json.dumps(scope.get("result")))
    return answers
'''

EXITS = '''\
import atexit, os, sys, threading, time


def mark(name):
    with open(os.path.join(os.environ["TSCTL_TEST_MARKS"], name), "w") as out:
        out.write(name)


def handle(data, context):
    """Leaves at load, as an interpreter ends: a thread still to finish, an atexit function, a message."""
    threading.Thread(target=lambda: (time.sleep(0.3), mark("thread"))).start()
    atexit.register(mark, "atexit")
    sys.exit("ConfigError: the handler gave up")
'''


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("attack-forked")
    (root / "runs.py").write_text(RUNS)
    (root / "exits.py").write_text(EXITS)
    archive_handler(root / "runs.py", ["runs"], root)
    archive_handler(root / "exits.py", ["exits"], root)
    return root


def ask(model: LocalModel, code: str):
    [answer] = model.predict([code])
    assert answer.status == 200, answer.body
    return answer.json()


def run_caller(code: str, timeout: float = 120, prefix=(), **kwargs) -> subprocess.CompletedProcess:
    """``code`` in a Python process of its own (the repository importable; run by ``prefix``), its output."""
    tests = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tests.parent), str(tests)]))
    return subprocess.run(
        [*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env, **kwargs
    )


def gone(pid: int, within: float = 10) -> bool:
    """Whether ``pid`` ends (or is a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def archive_folder(folder: Path, store: Path) -> Path:
    """``folder``'s files, with ``RUNS`` as the handler, archived by torch-model-archiver into ``store``."""
    (folder / "runs.py").write_text(RUNS)
    command = [
        str(Path(sys.executable).parent / "torch-model-archiver"),
        "--model-name",
        folder.name,
        "--version",
        "1",
        "--handler",
        str(folder / "runs.py"),
        "--extra-files",
        str(folder),
        "--export-path",
        str(store),
    ]
    subprocess.run(command, check=True, capture_output=True)
    return store / f"{folder.name}.mar"


def pids_cgroup() -> Path:
    """A pids cgroup of its own (v1 or v2), or a skip where none can be made."""
    roots = [Path("/sys/fs/cgroup/pids")]
    v2 = Path("/sys/fs/cgroup/cgroup.subtree_control")
    if v2.exists() and "pids" in v2.read_text():
        roots.append(v2.parent)
    for root in roots:
        group = root / f"tsctl-test-{uuid.uuid4().hex[:8]}"
        try:
            group.mkdir()
        except OSError:
            continue
        if (group / "pids.max").exists():
            return group
        group.rmdir()
    pytest.skip("no pids cgroup can be made here")


FORK_FAILS = """\
import json, sys
from pathlib import Path
from serving.local_model import LocalModel
group, mar = Path(sys.argv[1]), sys.argv[2]
with LocalModel(mar) as first:
    server = first.worker.process.server
    (group / "pids.max").write_text((group / "pids.current").read_text())  # not one more process or thread
    try:
        LocalModel(mar)
        failed = None
    except Exception as exc:
        failed = type(exc).__name__
    finally:
        (group / "pids.max").write_text("max")
    [answer] = first.predict(["import os; result = os.getpid()"])
    print(json.dumps({"failed": failed, "forked": type(first.worker.process).__name__, "server": server.alive,
                      "same": server is first.worker.process.server, "answer": answer.json(), "pid": first.worker.pid}))
"""


def test_a_fork_the_kernel_refuses_costs_the_server_and_its_other_workers_nothing(store):
    """No more processes allowed (a pids cgroup at its limit, as a fork bomb in one worker leaves it):
    the next start fails as a spawn would, and the fork server and the worker it already runs go on."""
    group = pids_cgroup()
    try:
        code = f"import sys; sys.argv[1:] = {[str(group), str(store / 'runs.mar')]!r}\n" + FORK_FAILS
        done = run_caller(code, preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.splitlines()[-1])
        assert seen["failed"] == "BlockingIOError" and seen["forked"] == "ForkedProcess", seen  # as Popen raises
        assert seen["server"] and seen["same"] and seen["answer"] == seen["pid"], seen  # the same worker answered
    finally:
        deadline = time.monotonic() + 10
        while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        group.rmdir()


def test_a_lost_server_leaves_no_descriptor_and_no_zombie():
    fds = len(os.listdir("/proc/self/fd"))
    server = fork_server.ForkServer()
    pid = server.process.pid
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.alive
    deadline = time.monotonic() + 5
    while (os.path.exists(f"/proc/{pid}") or len(os.listdir("/proc/self/fd")) != fds) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}"), "the lost server is left a zombie"
    assert len(os.listdir("/proc/self/fd")) == fds, "the lost server's socket is still open"


BUSY_THEN_KILLED = """\
import os, sys, threading, time
from serving.local_model import LocalModel
model = LocalModel(sys.argv[1])
print(model.worker.pid, type(model.worker.process).__name__, flush=True)
threading.Thread(target=model.predict, args=(["import time; time.sleep(60)"],), daemon=True).start()
time.sleep(1)
os.kill(os.getpid(), 9)
"""


def test_a_busy_forked_worker_ends_with_its_caller_killed_with_minus_9(store):
    """The caller (an engine, a ``tsctl run``) killed with -9 while a worker is busy in its handler: the fork
    server ends, and the worker with it (it would otherwise run its handler on, for nobody)."""
    done = run_caller(f"import sys; sys.argv[1:] = [{str(store / 'runs.mar')!r}]\n" + BUSY_THEN_KILLED)
    pid, kind = done.stdout.split()[:2]
    try:
        assert kind == "ForkedProcess"
        assert gone(int(pid)), "the busy worker outlived its caller and its fork server"
    finally:
        try:
            os.killpg(int(pid), signal.SIGKILL)
        except OSError:
            pass


def test_an_orphan_of_a_server_killed_mid_start_does_not_run_on(tmp_path):
    """The server killed between a fork and its reply: the client never learns the pid, so the child must
    end by itself (it would otherwise load a model nobody asked for, on a socket path it shares)."""
    script = tmp_path / "sleeper.py"
    script.write_text("import time\ntime.sleep(60)\n")
    server = fork_server.ForkServer()
    try:
        out_read, out_write = os.pipe()
        metrics_read, metrics_write = os.pipe()
        with server.spawning, server.lock:  # the request sent as spawn sends it, the reply left unread
            request = json.dumps({"args": [str(script)], "cwd": str(tmp_path), "env": dict(os.environ)})
            socket.send_fds(server.sock, [request.encode()], [out_write, metrics_write])
            while not server.replies:
                server.replied.wait(10)
            pid = server.replies.pop(0)["pid"]
            os.killpg(server.process.pid, signal.SIGKILL)
        for fd in (out_read, out_write, metrics_read, metrics_write):
            os.close(fd)
        try:
            assert gone(pid), "a worker of a lost server runs on"
        finally:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    finally:
        server.close()


def test_a_module_on_the_callers_pythonpath_is_the_one_a_worker_imports(store, tmp_path, monkeypatch):
    """A spawned worker imports what PYTHONPATH puts first (a vendored ``tqdm``, an archive's
    ``sitecustomize.py`` at start); a forked one must too, so such a worker is spawned."""
    vendored = tmp_path / "vendored"
    vendored.mkdir()
    (vendored / "tqdm.py").write_text("OURS = True\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(vendored), os.environ.get("PYTHONPATH", "")]))
    with LocalModel(store / "runs.mar") as model:
        assert ask(model, "import tqdm; result = tqdm.__file__") == str(vendored / "tqdm.py")
    monkeypatch.undo()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['TSCTL_TEST_SITE'] = 'the archive'\n")
    with LocalModel(archive_folder(site, tmp_path)) as model:
        assert ask(model, "import os; result = os.environ.get('TSCTL_TEST_SITE')") == "the archive"


def test_a_package_an_archive_vendors_in_a_subfolder_is_the_one_its_handler_imports(tmp_path):
    """A handler putting its archive's ``vendor/`` first on ``sys.path`` imports the Pillow there in a
    spawned worker (TorchServe's worker has not imported PIL before the handler); so must a forked one."""
    (tmp_path / "vendors" / "vendor" / "PIL").mkdir(parents=True)
    (tmp_path / "vendors" / "vendor" / "PIL" / "__init__.py").write_text("OURS = True\n")
    with LocalModel(archive_folder(tmp_path / "vendors", tmp_path)) as model:
        assert isinstance(model.worker.process, fork_server.ForkedProcess)
        code = "import os, sys; sys.path.insert(0, os.path.abspath('vendor')); import PIL; result = PIL.__file__"
        assert ask(model, code) == str(model.model_dir / "vendor" / "PIL" / "__init__.py")


UNREADABLE_ON_PATH = """\
import os, sys
from serving.local_model import LocalModel
os.environ["PYTHONPATH"] = os.pathsep.join([sys.argv[1], os.environ["PYTHONPATH"]])
with LocalModel(sys.argv[2]) as model:
    [answer] = model.predict(["result = 'answered'"])
    print(type(model.worker.process).__name__, answer.json())
"""


def test_a_folder_on_pythonpath_the_caller_cannot_list_is_passed_over_as_an_interpreter_passes_it(store, tmp_path):
    """A new interpreter imports nothing from a folder it cannot list; the fork server's look for
    modules shadowing its own must not fail the start (PermissionError) either."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    hidden.chmod(0o311)
    prefix = []
    if os.geteuid() == 0:  # root lists any folder: the caller is given no more power than a user has
        if not shutil.which("setpriv"):
            pytest.skip("root, and no setpriv to run the caller without CAP_DAC_READ_SEARCH")
        drop = "-dac_override,-dac_read_search"
        prefix = [shutil.which("setpriv"), f"--bounding-set={drop}", f"--inh-caps={drop}"]
    code = f"import sys; sys.argv[1:] = {[str(hidden), str(store / 'runs.mar')]!r}\n" + UNREADABLE_ON_PATH
    done = run_caller(code, prefix=prefix)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ForkedProcess", "answered"], done.stdout


def test_relative_and_empty_pythonpath_entries_are_made_absolute_as_a_new_interpreter_makes_them(store, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["", "lib", os.environ.get("PYTHONPATH", "")]))
    with LocalModel(store / "runs.mar") as model:
        path = ask(model, "import sys; result = sys.path")
        assert isinstance(model.worker.process, fork_server.ForkedProcess)
        assert path[:2] == [str(model.model_dir), str(model.model_dir / "lib")], path
        assert len(path) == len(set(path)), path


@pytest.mark.parametrize("mode", ["0", "1"])
def test_a_worker_that_exits_ends_as_an_interpreter_ends(store, tmp_path, monkeypatch, mode):
    """``sys.exit("message")`` says its message, a thread still running is waited for, atexit functions
    run: as in a new process (``mode`` 0: spawned, 1: forked)."""
    monkeypatch.setenv("TSCTL_FORK_SERVER", mode)
    monkeypatch.setenv("TSCTL_TEST_MARKS", str(tmp_path))
    with pytest.raises(LoadError) as raised:
        LocalModel(store / "exits.mar")
    assert str(raised.value) == "the handler gave up" and raised.value.error_type == "builtins.ConfigError"
    deadline = time.monotonic() + 5
    while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atexit", "thread"]


VIEW = (
    "import os, sys, multiprocessing\n"
    "try:\n    from threadpoolctl import threadpool_info\n    blas = [p['num_threads'] for p in threadpool_info()"
    " if p['user_api'] == 'blas']\nexcept ImportError:\n    blas = None\n"
    "result = [blas, hash('tsctl'), sys.flags.hash_randomization, multiprocessing.current_process().authkey.hex()]"
)


def test_what_an_interpreter_reads_at_start_is_the_workers_environment(store, monkeypatch):
    """Variables read when an interpreter and its libraries start (numpy's BLAS threads from
    ``OMP_NUM_THREADS``, as the engine sets it per model; ``PYTHONHASHSEED``) set after the fork server
    started: a forked worker must see them as a spawned one does. And two workers never share a secret."""
    with LocalModel(store / "runs.mar"):  # the fork server runs, started with the environment as it was
        pass
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    views = {}
    for mode in ("0", "1", "1"):
        monkeypatch.setenv("TSCTL_FORK_SERVER", mode)
        with LocalModel(store / "runs.mar") as model:
            views.setdefault(mode, []).append((ask(model, VIEW), type(model.worker.process).__name__))
    (spawned, _), [(forked, kind), (again, _)] = views["0"][0], views["1"]
    assert kind == "ForkedProcess"
    assert forked[:3] == spawned[:3] and spawned[2] == 0, (spawned, forked)
    assert len({spawned[3], forked[3], again[3]}) == 3  # multiprocessing's authkey: each process its own
