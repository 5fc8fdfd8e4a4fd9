"""Starting, waiting for and stopping a local server, and talking to it over HTTP.

What every engine shares lives here: ``Server`` (server.json: pid, the engine's name, its addresses),
starting a command detached (``spawn``), one state directory per server, ``stop``, free ports and
HTTP (``request``: archiver/http_client.py). The runtimes themselves (TorchServe's launch and readiness:
archiver/engines/torchserve.py), and how ``tsctl`` picks one, are ``archiver/engines/``.
A server runs detached in its own process group (``setsid``, stdin from /dev/null, output to a
file) with its own state directory: ``TEMP`` (TorchServe's one-instance pid lock), ``LOG_LOCATION``
and ``server.json`` (pid and addresses) all live there, so several servers can run side by side and
``stop`` ends exactly the one it started. Addresses are moved to free ports on 127.0.0.1 through
TorchServe's ``TS_*`` environment variables; the config file itself is not changed.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from serving import config_properties, ts_config
from serving.worker import sockets

from .errors import ServerFailure, UserError, make_directory
from .http_client import request
from .properties import check_keys, snapshot_of

STATE_FILE = "server.json"


@dataclass
class Server:
    """A running server, as server.json records it. Every address is a base URL (``http://HOST:PORT``);
    the gRPC ones are ``HOST:PORT``, each named for its API: ``kserve_v2_grpc`` KServe's v2 (Open Inference
    Protocol) gRPC (the tsctl engine, MLServer), ``ts_grpc_inference``/``ts_grpc_management`` TorchServe's own
    (``inference.proto``, ``management.proto``: TorchServe, the tsctl engine); None where not served.
    ``grpc`` is the former key, kept for scripts that read it: TorchServe's gRPC inference API on TorchServe,
    KServe's v2 gRPC on the tsctl engine and MLServer."""

    pid: int
    home: str
    inference: str
    management: str
    metrics: str
    models: List[str]
    engine: str = "torchserve"  # a key of archiver.engines.ENGINES (or an alias of one)
    grpc: Optional[str] = None
    log_writer: Optional[int] = None  # the pid of the process writing its output (spawn's bounded_log)
    # TorchServe's own gRPC APIs (inference.proto, management.proto), HOST:PORT each; None where not served
    ts_grpc_inference: Optional[str] = None
    ts_grpc_management: Optional[str] = None
    kserve_v2_grpc: Optional[str] = None

    @property
    def logs(self) -> Path:
        return logs_of(self.home)

    @property
    def metrics_url(self) -> str:
        """The Prometheus endpoint."""
        return f"{self.metrics}/metrics"

    def headers(self, api: str = "inference") -> Dict[str, str]:
        """Authorization for token-auth servers (keys from the server's key_file.json)."""
        keys = read_keys(Path(self.home))
        key = keys.get(api)
        return {"Authorization": f"Bearer {key}"} if key else {}


def pick_ports(count: int, port: Optional[int] = None) -> List[int]:
    """``count`` different ports: ``port`` first when given (the inference API's), the rest free ones."""
    if port is None:
        return free_ports(count)
    return [port, *[free for free in free_ports(count) if free != port][: count - 1]]


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> List[int]:
    """``count`` different ports free on 127.0.0.1 now: each held open until all are picked, so that no
    two are the same (a port picked and closed at once could be handed out again by the next pick)."""
    held = []
    try:
        for _ in range(count):
            held.append(socket.socket())
            held[-1].bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()


def unlisted_archives(config, model_store) -> List[str]:
    """A note for each archive in ``model_store`` that ``config``'s model_snapshot does not name (packaged
    after 'tsctl config' ran): TorchServe and the engines serve the snapshot alone, so it would not be
    served, without a word. None when the config or the store cannot be read: starting says why."""
    from .properties import archives_in

    try:
        snapshot = ts_config.snapshot_of(config_properties.read_properties(config), config)
        found = archives_in(model_store)
    except (config_properties.ConfigError, UserError, OSError):
        return []
    named = ts_config.snapshot_archives(snapshot)
    return [
        f"{Path(model_store) / archive.name} is not in the model_snapshot of {config}, so it is not served: "
        "run 'tsctl config' to add it"
        for archive in found
        if archive.name not in named
    ]


def snapshot_models(properties: Dict[str, str], config: Path, model_store: Path) -> List[str]:
    """The models a config's model_snapshot serves from ``model_store``: its keys are known TorchServe
    keys, the store exists and holds every archive the snapshot names (else one UserError naming it)."""
    check_keys(properties, config)
    snapshot = snapshot_of(properties, config)
    try:
        ts_config.check_store(model_store)
        for name, versions in snapshot["models"].items():
            for entry in versions.values() if isinstance(versions, dict) else [None]:
                ts_config.snapshot_archive(config, model_store, name, entry)
    except config_properties.ConfigError as exc:
        raise UserError(str(exc)) from None
    return list(snapshot["models"])


def check_home(home: Path, socket_below: str = sockets.socket_below()) -> Path:
    """Refuse a state directory whose server still runs; make its logs/ and its tmp/, the server's TEMP,
    which this returns (``temp_dir``: ``socket_below`` is where the server puts a worker's socket
    below it, TorchServe's by default)."""
    existing = read_state(home)
    if existing and group_alive(existing.pid):
        raise UserError(f"a server started from {home} is still running (pid {existing.pid}): run 'tsctl stop' first")
    make_directory(home, "--home")  # a file in the way, or no permission: one line
    try:
        logs_of(home).mkdir(exist_ok=True)
        return temp_dir(home, socket_below)
    except OSError as exc:
        raise UserError(f"--home {home}: cannot write there ({exc.strerror}): give a directory you can write") from None


def logs_of(home) -> Path:
    """Where a server started in ``home`` writes its logs (TorchServe's LOG_LOCATION), and its snapshots below."""
    return Path(home) / "logs"


def temp_dir(home: Path, socket_below: str = sockets.socket_below()) -> Path:
    """The server's TEMP (its pid lock, the workers' sockets, unpacked archives): ``home/tmp``, or when
    a worker's socket there (TEMP + ``socket_below``, serving/worker/sockets.py) would be too long a path for a
    Unix socket, a private directory under the system's temporary directory that ``home/tmp`` links to
    (a project deep in the file system failed with "AF_UNIX path too long"); a UserError naming the
    socket's path and the fix when that one is too long too. Whatever the last server left is removed."""
    remove_temp(home)
    link = home / "tmp"
    if sockets.fits(f"{link}{socket_below}"):
        link.mkdir()
        return link
    short = Path(tempfile.mkdtemp(prefix="tsctl-"))
    try:
        sockets.check(f"{short}{socket_below}", "set TMPDIR to a short directory (e.g. TMPDIR=/tmp)")
    except sockets.SocketPathError as exc:
        short.rmdir()
        raise UserError(str(exc)) from None
    link.symlink_to(short, target_is_directory=True)
    return short


def remove_temp(home: Path) -> None:
    """Remove ``home/tmp`` and, when it links to a directory ``temp_dir`` made, that directory."""
    link = Path(home) / "tmp"
    if link.is_symlink():
        target = Path(os.readlink(link))
        if target.name.startswith("tsctl-") and target.parent == Path(tempfile.gettempdir()):
            shutil.rmtree(target, ignore_errors=True)
        link.unlink()
    elif link.exists():
        shutil.rmtree(link, ignore_errors=True)


def with_port_retry(launch) -> "Server":
    """Launch; once more if a free port was taken by another process before the server bound it."""
    for attempt in (1, 2):
        try:
            return launch()
        except ServerFailure as exc:
            taken = any(text in str(exc).lower() for text in ("address already in use", "failed to bind"))
            if attempt == 2 or not taken:
                raise


def recorded(server: Server, wait) -> Server:
    """Write the started ``server``'s server.json, then ``wait()`` for it; if that fails (or is
    interrupted), stop it and clear the state before raising."""
    write_state(server)
    try:
        wait()
    except BaseException:
        stop(server)
        raise
    return server


def spawn(command: List[str], home: Path, env: Dict[str, str], out_name: str) -> subprocess.Popen:
    """Start ``command`` detached: its own session and process group, stdin from /dev/null, output
    to ``home/out_name`` through ``bounded_log`` (rotated, at most its limits); the writer is the
    process's ``log_writer`` (``output_written``)."""
    from . import bounded_log

    writer = bounded_log.start(home / out_name)
    try:
        process = subprocess.Popen(
            command,
            cwd=home,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=writer.stdin,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except BaseException:
        writer.kill()
        raise
    finally:
        writer.stdin.close()  # the server's copy is the only one: the writer ends when the server's output does
    process.log_writer = writer
    return process


def output_written(process: Optional[subprocess.Popen], timeout: float = 5):
    """Wait until everything the exited ``process`` (from ``spawn``) wrote is in its output file."""
    writer = getattr(process, "log_writer", None)
    if writer is not None:
        try:
            writer.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


READY = "READY"


def model_state(server: Server, name: str, registering: str = "extracting") -> Optional[str]:
    """What a model is going through, as the management API describes it (TorchServe's, and the tsctl
    engine's): ``registering`` while it is not registered yet (the archive being unpacked), ``loading``
    while no worker is READY (workers starting, the handler's initialize), ``READY``; None while the
    API does not answer (the server starting)."""
    try:
        status, body = request(f"{server.management}/models/{name}", headers=server.headers("management"), timeout=5)
    except OSError:
        return None
    if status == 404:
        return registering
    workers = body[0].get("workers", []) if status == 200 and isinstance(body, list) and body else []
    return READY if any(w.get("status") == READY for w in workers) else "loading"


class States:
    """``report(name, state)``: tells ``progress`` "NAME: STATE" when NAME's state changed."""

    def __init__(self, progress: Callable[[str], None]):
        self.progress, self.seen = progress, {}

    def __call__(self, name: str, state: str):
        if self.seen.get(name) != state:
            self.seen[name] = state
            self.progress(f"{name}: {state}")


def stop(server: Optional[Server] = None, home=".tsctl", grace: float = 20) -> bool:
    """Stop the server's whole process group (frontend and workers). False if none was running."""
    server = server or read_state(Path(home).resolve())
    if server is None:
        return False
    stopped = False
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        stopped = True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and group_alive(server.pid):
            reap(server.pid)
            time.sleep(0.1)
        if not group_alive(server.pid):
            break
    reap(server.pid)
    end_log_writer(server.log_writer)
    if (Path(server.home) / "tmp").is_symlink():
        remove_temp(Path(server.home))  # a directory of the system's temporary directory
    state = Path(server.home) / STATE_FILE
    if state.exists():
        state.unlink()
    return stopped


def end_log_writer(pid: Optional[int], grace: float = 5):
    """The server's output writer (``spawn``'s bounded_log) ends by itself once the server's output has
    closed: wait for that, at most ``grace`` seconds, then kill it."""
    deadline = time.monotonic() + grace
    while pid and log_writer_running(pid):
        reap(pid)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)


def log_writer_running(pid: int) -> bool:
    """``pid`` is a bounded_log writer that has not ended (a zombie has)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return b"archiver.bounded_log" in command and state != "Z"


def reap(pid: int):
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_members(pgid))  # a zombie leader still counts for killpg; a live member must remain


def group_members(pgid: int) -> List[int]:
    """Pids of the live (not zombie) processes in process group ``pgid``."""
    import psutil  # here: only stopping a server asks (tsctl's other commands do not load it)

    found = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except (OSError, psutil.Error):  # gone meanwhile, or not ours to look at
            continue
    return found


def where(home) -> str:
    """A state directory as messages name it: as given, and where it is when given relative."""
    path = Path(home)
    return str(home) if path.is_absolute() else f"{home} (in {path.resolve().parent})"


def elsewhere(home) -> str:
    """How to point at the server: ``--home HOME/.tsctl`` when that directory records one (``--home`` was
    given the project instead of its state directory), else to pass --home to where it was started."""
    inside = Path(home) / ".tsctl"
    if (inside / STATE_FILE).is_file():
        return f"{inside} records one: pass --home {inside}"
    return "pass --home to where it was started"


def recorded_in(home) -> Optional[Server]:
    """The server ``home``'s server.json records (None without one); a file that is not tsctl's is one
    UserError naming it."""
    state = Path(home).resolve()
    try:
        return read_state(state)
    except (ValueError, TypeError, UnicodeDecodeError):
        raise UserError(
            f"{state / STATE_FILE} is not a server record tsctl wrote: remove it, or pass --home to where the "
            "server was started"
        ) from None


def running(home) -> Server:
    """The live server 'tsctl serve' started from ``home``, else one UserError saying where it looked
    and how to point at another state directory (``--home``)."""
    srv = recorded_in(home)
    if srv is None:
        raise UserError(f"no server is running from {where(home)}: start one with 'tsctl serve', or {elsewhere(home)}")
    if not group_alive(srv.pid):
        raise UserError(
            f"the server started from {where(home)} (pid {srv.pid}) is no longer running: start it again with "
            "'tsctl serve'"
        )
    return srv


def write_state(server: Server):
    (Path(server.home) / STATE_FILE).write_text(json.dumps(asdict(server), indent=2))


def read_state(home: Path) -> Optional[Server]:
    state = Path(home) / STATE_FILE
    if not state.exists():
        return None
    recorded = json.loads(state.read_text())
    known = {name: recorded[name] for name in Server.__dataclass_fields__ if name in recorded}
    return Server(**known)


def read_keys(home: Path) -> Dict[str, str]:
    """TorchServe's token-auth keys (key_file.json in the server's working directory), if any. A file
    TorchServe is still writing (empty, or cut short) has none yet: the next poll reads it whole."""
    key_file = Path(home) / "key_file.json"
    try:
        data = json.loads(key_file.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {api: (data.get(api) or {}).get("key") for api in ("management", "inference")}
