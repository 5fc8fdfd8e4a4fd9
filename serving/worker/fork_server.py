"""A fork server for TorchServe workers: torch and TorchServe's worker modules imported once, each worker forked.

A worker started as TorchServe's frontend starts it (``python model_service_worker.py``) spends its
first 1.3-1.8 s importing torch, numpy and TorchServe's worker modules, before it reads the archive.
The fork server is one process that has imported those (``PRELOAD``) and nothing else: nothing a
spawned worker would not have imported before its handler (a handler putting its own Pillow first on
``sys.path`` gets it), no ``handlers``, no model, no torch operation run (so no thread pool started).
Each worker is a fork of it that then becomes what ``worker_process.spawn`` would have started:

- the environment, working directory, ``sys.path`` (the request's ``PYTHONPATH`` first, made absolute
  as a new interpreter makes it, then the interpreter's own), stdin ``/dev/null``, stdout and stderr
  on the pipe it was sent, a process group of its own (set by the child and by the server, so that a
  kill of the group never misses it);
- what a new interpreter reads from the environment at start: the server was started with the
  worker's environment, but for what the child reads again (``start_environment``: ``PYTHONPATH``,
  ``TMPDIR``), and its output streams are buffered as a new interpreter's on a pipe. So
  ``OMP_NUM_THREADS`` (which the engine sets per model, and numpy's BLAS reads as it loads),
  ``PYTHONHASHSEED``, ``PYTHONIOENCODING``, ``PYTHONDONTWRITEBYTECODE`` and the like are the worker's;
  a worker of another start environment gets a server of its own (``shared``: at most
  ``MAX_SERVERS``, then it is spawned);
- what a new interpreter draws anew: torch's random generator is seeded and multiprocessing's
  authentication key made again (``random`` and numpy's reseed themselves after a fork), so that no two
  workers share a sequence or a secret (the hash seed they do share, unless ``PYTHONHASHSEED`` is set);
- then ``worker_launch.py`` runs, as ``__main__``, with the arguments a spawned worker gets, and runs
  ``model_service_worker.py`` unchanged. Its imports of ``ts`` and ``torch`` are the preloaded ones;
  everything else, the archive's ``handlers`` included, is imported from the model's folder as usual;
- it ends as an interpreter ends: ``sys.exit("why")`` written out, the error through ``sys.excepthook``,
  its threads waited for, its atexit functions run, a KeyboardInterrupt's status a SIGINT's.

A worker whose ``PYTHONPATH`` (the archive's folder, the caller's own entries) holds a top-level module
or package of a name the server has imported (``shadows``: a ``torch.py``, a ``yaml/``, a vendored
``tqdm``) would import the server's instead of its own, and one holding a ``sitecustomize`` or
``usercustomize`` would not run it as a new interpreter does at start: such a worker is spawned as a
new process, as TorchServe would. The server itself checks (``shadowed``), just before it would fork,
against what it has imported then; what the extras brought is looked for in the whole model folder too
(``vendored``: a handler may put a subfolder of its own first on ``sys.path``). So is every worker
spawned when the fork server cannot start.

An engine's server (``shared(env, extras=True)``: the tsctl engine's and MLServer's, whose workers are
restarted and added while they run) also imports ``EXTRAS`` (Pillow, torchvision, transformers' models
and tokenizers: what handlers import first), the first once no request has come for ``SETTLE`` s, the
others one at a time ``IDLE`` s apart: the workers of a cold start, forked at once, import them
themselves; a worker restarted after it died, or started later, finds them imported. ``tsctl run``'s
and ``LocalModel``'s server does not (one start, and the imports would take the cores its worker is using).

**A worker's descendants.** Each worker makes itself a child subreaper (``worker_launch.py``), so that what
it forks stays below it even once it double-forks and leaves its session (``setsid``): ``end_tree`` ends
the worker with everything below it. The server is a subreaper too: what a worker leaves when it dies on
its own (killed by the OOM killer, ``os._exit``) is reparented to the server, which ends every child it
did not fork as each worker's exit is reported, and everything when its client closes it (``sweep``).

The server reaps its children and reports each exit status; a fork the kernel refuses (a pids limit
reached) fails that start alone, with the OSError a spawn would raise. ``ForkedProcess`` offers what
``worker_process`` uses of ``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``returncode``,
``stdout``). If the server itself ends, the workers it forked are killed (they would run unwatched)
and reported ended, by the client and by the kernel (``die_with``: also those whose pid never reached
the client, and those of a client killed with -9); the next worker starts a new server.

    python serving/worker/fork_server.py FD    # the server: requests and replies on the socket FD
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Dict, List, Optional

try:  # imported by the engine, from its package
    from .module_shadowing import python_path, shadowed
    from .process_tree import children, end_tree, subreaper
except ImportError:  # run by path as the server: these are beside it, on sys.path as main() starts
    from module_shadowing import python_path, shadowed
    from process_tree import children, end_tree, subreaper

PRELOAD = (  # imported once by the server; ts.torch_handler is not (it reads TS_IPEX_ENABLE when imported)
    "numpy",
    "torch",
    "ts.arg_parser",
    "ts.async_service",
    "ts.metrics.metric_cache_yaml_impl",
    "ts.model_loader",
    "ts.protocol.otf_message_handler",
    "ts.service",
)
# With ``extras``, imported once the server has settled (no request for ``SETTLE`` s), one at a time between
# requests: what the toolkit's and TorchServe's handlers import first (the image handlers, transformers'
# models and tokenizers), if installed. A worker forked before they are in imports them itself; one restarted
# after it died, or added later, finds them imported. A request that comes during one waits for it (at most
# about 1.5 s). They cost the server about 5 s of a core and 240 MB here: a server that lives less than
# SETTLE s after its last worker's start (a test's, a benchmark's, a CLI's) never pays for them, and a cold
# start's first requests do not share the cores with them.
EXTRAS = (
    "PIL.Image",
    "torchvision",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
)
SETTLE = 30.0  # s without a request before the server imports the first extra (a cold start's come at once)
IDLE = 1.0  # s without a request before it imports each next one
CLOSE_GRACE = 5.0  # s a closed server has to end what is left below it before it is killed
SWEEPS = 100  # readings of the children at most, until one finds no stray (``sweep``)
MESSAGE = 1 << 20  # bytes of one request or reply, at most
RE_READ = ("PYTHONPATH", "TMPDIR", "TEMP", "TMP")  # read by each forked child again
MAX_SERVERS = 3  # fork servers one process keeps, one per start environment
HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(HERE, "worker_launch.py")


# ---- The client: what worker_process uses -------------------------------------------------------
class ForkedProcess:
    """A worker forked by ``server``: the parts of ``subprocess.Popen`` that ``worker_process`` uses."""

    def __init__(self, pid: int, stdout, server: "ForkServer"):
        self.pid, self.stdout, self.server, self.returncode = pid, stdout, server, None
        self._ended = threading.Event()

    def _end(self, code: int):
        self.returncode = code
        self._ended.set()

    def poll(self) -> Optional[int]:
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self.returncode


class ForkServer:
    """The server process and its socket. ``spawn`` forks a worker; None when it cannot (the caller
    then spawns a new process). Thread-safe; one request at a time."""

    def __init__(self, env: Optional[dict] = None, extras: bool = False, settle: float = SETTLE):
        self.spawning = threading.Lock()  # held from a request to its reply
        self.lock = threading.Lock()  # the state below, shared with the reading thread
        self.replies: List[dict] = []
        self.replied = threading.Condition(self.lock)
        self.children: Dict[int, ForkedProcess] = {}
        self.ended: Dict[int, int] = {}  # exits reported before their ForkedProcess was made
        self.alive = True
        self.closing = False  # close() waits for the server to end what is left, then ends it
        self.env = start_environment(os.environ if env is None else env)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        importing = ["--extras", str(settle)] if extras else []
        try:
            self.process = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), str(theirs.fileno())] + importing,
                env=self.env,
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                process_group=0,  # its own: a kill of a worker's group or of a caller's never reaches it
            )
        finally:
            theirs.close()
        self.sock = mine
        self._read_hello()
        threading.Thread(target=self._read, name=f"fork-server-{self.process.pid}", daemon=True).start()

    def _read_hello(self):
        self.sock.settimeout(120)
        try:
            hello = json.loads(self.sock.recv(MESSAGE) or b"{}")
        finally:
            self.sock.settimeout(None)
        if not hello.get("ready"):
            self.close()
            raise RuntimeError(f"the fork server did not start: {hello.get('error', 'it exited')}")

    def spawn(self, args: List[str], cwd: str, env: dict, stdout: int, metrics: int) -> Optional[ForkedProcess]:
        """Fork a worker running ``worker_launch.py METRICS_FD *args`` (its stdout and stderr on the fd
        ``stdout``, its metrics on ``metrics``); None when the server has ended, was started for another
        environment (``start_environment``) or the worker's path ``shadows`` a module it has imported (the
        server says which, ``shadowed``); OSError when the fork fails."""
        if start_environment(env) != self.env:
            return None
        request = json.dumps({"args": args, "cwd": cwd, "env": env}).encode("utf-8")
        with self.spawning, self.lock:  # one request at a time: the next reply is this request's
            if not self.alive:
                return None
            try:
                socket.send_fds(self.sock, [request], [stdout, metrics])
            except OSError:
                return None
            while not self.replies and self.alive:
                self.replied.wait()
            if not self.replies:
                return None
            reply = self.replies.pop(0)
            if "shadowed" in reply:
                return None
            if "pid" not in reply:  # the fork failed: the error a spawn would have raised
                raise OSError(reply["errno"], reply["error"])
            child = ForkedProcess(reply["pid"], None, self)
            if reply["pid"] in self.ended:
                child._end(self.ended.pop(reply["pid"]))
            else:
                self.children[child.pid] = child
            return child

    def idle(self) -> bool:
        """Whether no worker of this server runs, nor is being started."""
        return not self.children and not self.spawning.locked()

    def _read(self):
        """The server's messages: replies to ``spawn``, and exits."""
        while True:
            try:
                raw = self.sock.recv(MESSAGE)
            except OSError:
                raw = b""
            with self.lock:
                if not raw:
                    self._lost()
                    return
                message = json.loads(raw)
                if "exited" in message:
                    child = self.children.pop(message["exited"], None)
                    if child is None:
                        self.ended[message["exited"]] = message["code"]
                    else:
                        child._end(message["code"])
                else:
                    self.replies.append(message)
                    self.replied.notify_all()

    def _lost(self):
        """The server ended: its workers are killed, as no one would learn of their end; it is reaped and
        its socket closed (no zombie, no descriptor left for each server lost)."""
        self.alive = False
        self.replied.notify_all()
        for child in self.children.values():
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except OSError:
                pass
            child._end(-signal.SIGKILL)
        self.children.clear()
        if not self.closing:  # a closed server's end of the socket closes as it exits: close() waits for that
            self._end_process()
        self.sock.close()

    def _end_process(self):
        if self.process.poll() is None:  # not reaped yet: its pid is still its own
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
        self.process.wait()

    def close(self):
        """End the server: told by the end of what it reads (its socket shut for writing; the reading thread
        still reads, and does not take the end of the server's reply for a server lost and kill it), it
        ends every child left (``sweep``) and exits; killed if it has not within CLOSE_GRACE s (its workers
        are not its group: each is ended by its owner, and dies with the server)."""
        self.closing = True
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        try:
            self.process.wait(CLOSE_GRACE)
        except subprocess.TimeoutExpired:
            pass
        self._end_process()
        self.sock.close()


def start_environment(env: dict) -> dict:
    """What of ``env`` a new interpreter and the modules the server preloads read as they start: all of it
    but what each child reads again (``RE_READ``) and TorchServe's and tsctl's own variables (``TS_``,
    ``TSCTL_``: read when used, by modules the server has not imported)."""
    return {k: v for k, v in env.items() if k not in RE_READ and not k.startswith(("TS_", "TSCTL_"))}


_servers: Dict[str, ForkServer] = {}  # by start environment
_servers_lock = threading.Lock()


def shared(env: Optional[dict] = None, extras: bool = False) -> Optional[ForkServer]:
    """This process's fork server for workers started with ``env`` (default: this process's environment):
    one per ``start_environment`` and ``extras`` (whether it imports ``EXTRAS`` once idle: for a server
    whose workers are restarted and added while it runs, the engines'), started on first use, at most
    ``MAX_SERVERS`` (one without workers makes room). None with ``TSCTL_FORK_SERVER=0`` in the
    environment, or when none can start: workers are then spawned. The servers end when this process does."""
    if os.environ.get("TSCTL_FORK_SERVER") == "0":
        return None
    wanted = start_environment(os.environ if env is None else env)
    key = json.dumps([wanted, extras], sort_keys=True)
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server.alive:
            return server
        for name, other in list(_servers.items()):  # the lost, and at the limit one without workers
            if not other.alive or (len(_servers) >= MAX_SERVERS and other.idle()):
                del _servers[name]
                other.close()
        if len(_servers) >= MAX_SERVERS:
            return None
        try:
            server = _servers[key] = ForkServer(wanted, extras)
        except (OSError, RuntimeError):
            return None
        import atexit

        atexit.register(server.close)
        return server


# ---- The server --------------------------------------------------------------------------------
def serve(sock: socket.socket, extras: List[str], settle: float = SETTLE):
    """Fork a worker per request, report each exit, until the client closes its end; once nothing has
    come for ``settle`` s, import the first of ``extras``, then one each ``IDLE`` s without a request."""
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    server = os.getpid()
    forked: set = set()  # the workers it forked and has not reaped: any other child is an orphan (``sweep``)
    wait = settle  # then IDLE between the extras
    import select

    try:
        while True:
            ready, _, _ = select.select([sock, wakeup_read], [], [], wait if extras else None)
            if not ready:  # idle: the next of the modules workers often import
                preload(extras.pop(0))
                wait = IDLE
                continue
            if wakeup_read in ready:
                os.read(wakeup_read, 4096)
                if report_exits(sock, forked):
                    sweep(server, forked)
            if sock in ready:
                try:
                    raw, fds, _, _ = socket.recv_fds(sock, MESSAGE, 2)
                except ConnectionResetError:
                    return
                if not raw:
                    return
                request = json.loads(raw)
                found = shadowed(request["env"], request["cwd"], PRELOADED)
                if found:  # the worker's own would be shadowed by the server's: it is spawned instead
                    for fd in fds:
                        os.close(fd)
                    sock.send(json.dumps({"shadowed": found}).encode("utf-8"))
                    continue
                try:
                    pid = os.fork()
                except OSError as exc:  # no process to be had (a pids limit reached): this start fails as a spawn would
                    reply = {"errno": exc.errno, "error": exc.strerror}
                else:
                    if pid == 0:
                        for fd in (sock.fileno(), wakeup_read, wakeup_write):
                            os.close(fd)
                        die_with(server)
                        os._exit(become_worker(request, *fds))
                    try:
                        os.setpgid(pid, pid)  # as the child does: its group exists before its pid is known
                    except OSError:  # it has set it, or already ended
                        pass
                    forked.add(pid)
                    reply = {"pid": pid}
                for fd in fds:
                    os.close(fd)
                sock.send(json.dumps(reply).encode("utf-8"))
    finally:  # the client has gone (the engine stops): nothing the server forked, or a worker left, outlives it
        sweep(server, set())


def preload(name: str):
    """Import ``name`` from the interpreter's own path, if it is there; whatever fails stays unimported
    (a worker then imports it as a new process would)."""
    import importlib
    import importlib.util

    try:
        if importlib.util.find_spec(name.partition(".")[0]) is not None:
            importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - an extra only saves time: a worker that needs it imports it
        pass


def report_exits(sock: socket.socket, forked: set) -> bool:
    """Reap every child that has ended and report the workers' exits (an orphan's is not: the client never
    knew it); whether a worker's was among them."""
    reported = False
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reported
        if pid == 0:
            return reported
        if pid in forked:
            forked.discard(pid)
            reported = True
            sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode("utf-8"))


def sweep(server: int, forked: set):
    """End every child of the server that it did not fork, and what is below it: what a worker that has
    ended left (reparented to the server, its subreaper, before the worker's exit is reported), or what a
    handler made a sibling of its worker (clone with CLONE_PARENT). The children are read again until a
    reading finds none: one that clones a new sibling and exits as it is read leaves another each time (an
    outsider's attack, #43: such a process outlived its worker 1 time in 3, and its model's unregister)."""
    for _ in range(SWEEPS):
        strays = [pid for pid in children(server) if pid not in forked]
        if not strays:
            return
        for pid in strays:  # stopped as soon as read: a stopped process clones no new sibling
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass
        for pid in strays:
            end_tree(pid)
            try:  # reaped here when it has ended already (else by report_exits, or by init once the server exits)
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def die_with(server: int):
    """In the forked child: be killed when the server ends (Linux's PR_SET_PDEATHSIG). The client kills the
    workers it knows of then; this one's pid may not have reached it, or the client itself may be gone
    (killed with -9 while this worker ran a request)."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (AttributeError, OSError):  # no prctl: not Linux
        return
    if os.getppid() != server:  # the server ended before the call
        os.kill(os.getpid(), signal.SIGKILL)


def become_worker(request: dict, stdout: int, metrics: int) -> int:
    """In the forked child: become the worker ``spawn`` would have started, run it, end as it would
    (``finish``); its exit status."""
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdout, 1)
        os.dup2(stdout, 2)
        os.close(devnull)
        os.close(stdout)
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        sys.path[:] = list(dict.fromkeys(python_path(env, os.getcwd()) + BASE_PATH))
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))  # stdout and stderr are pipes now, not the server's
        sys.stdout.reconfigure(line_buffering=False, write_through=unbuffered)
        sys.stderr.reconfigure(line_buffering=not unbuffered, write_through=unbuffered)
        fresh_interpreter_state()
        sys.argv = [LAUNCHER, str(metrics), *request["args"]]
        import runpy

        runpy.run_path(LAUNCHER, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exit_code(exc.code)
    except BaseException as exc:  # as an interpreter reports what ended it, with sys.excepthook
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
    return finish(code)


def exit_code(value) -> int:
    """The status ``sys.exit(value)`` ends an interpreter with: None 0, an int itself, anything else
    written to stderr (``sys.exit("why")``) and 1."""
    if value is None or isinstance(value, int):
        return value or 0
    print(value, file=sys.stderr)
    return 1


def finish(code: int) -> int:
    """What an interpreter does as it ends: wait for its threads that are not daemons, run its atexit
    functions, flush its output; one ended by KeyboardInterrupt then ends by SIGINT. The exit status."""
    import atexit

    try:
        threading._shutdown()  # what multiprocessing's forked children call too
    except BaseException:  # noqa: BLE001 - interrupted while waiting: end now, as an interpreter would
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - the pipe may be gone; the exit code still is what it is
            pass
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def fresh_interpreter_state():
    """What a new interpreter would have drawn anew and the fork copied: the temporary folder (``TMPDIR``
    is read again), torch's random generator's seed, multiprocessing's authentication key (``random``
    and numpy's reseed themselves)."""
    import multiprocessing.process
    import tempfile

    import torch

    tempfile.tempdir = None
    torch.seed()
    multiprocessing.process.current_process().authkey = os.urandom(32)


BASE_PATH: List[str] = []
PRELOADED: Optional[set] = None  # the top-level names imported once PRELOAD was (in the server)


def main():
    global BASE_PATH, PRELOADED
    sock = socket.socket(fileno=int(sys.argv[1]))
    subreaper()  # what a worker leaves as it dies comes to the server (``sweep``)
    extras = list(EXTRAS) if "--extras" in sys.argv[2:] else []
    settle = float(sys.argv[sys.argv.index("--extras") + 1]) if extras else SETTLE
    BASE_PATH = [p for p in sys.path if os.path.realpath(p or os.curdir) != HERE]  # its environment has no PYTHONPATH
    sys.path[:] = BASE_PATH  # the preloaded modules come from the interpreter's own path, not a model's
    try:
        import importlib

        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 - said to the client, which then spawns workers itself
        hello(sock, {"error": f"{type(exc).__name__}: {exc}"})
        return
    PRELOADED = {name.partition(".")[0] for name in sys.modules}
    if hello(sock, {"ready": True}):  # the server checks shadowing itself (``shadowed``)
        serve(sock, extras, settle)


def hello(sock: socket.socket, message: dict) -> bool:
    """Say ``message`` to the client; False, silently, when it has gone meanwhile (interrupted while the
    server imported: its end is closed, and the server has nothing to serve)."""
    try:
        sock.send(json.dumps(message).encode("utf-8"))
        return True
    except OSError:  # BrokenPipeError, ConnectionResetError
        return False


if __name__ == "__main__":
    main()
