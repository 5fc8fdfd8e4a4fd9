"""Where a worker's Unix socket lives, and whether its path fits one.

A Unix socket's path holds at most ``MAX_PATH`` bytes on Linux (``sun_path`` is 108 bytes with its
closing NUL); a longer one fails the worker with "AF_UNIX path too long". Each server puts its workers'
sockets under its temporary directory (TEMP), one level of its own deeper for the tsctl engine and
MLServer's runtime:

- TorchServe: ``TEMP/.ts.sock.PORT`` (its frontend's ``java.io.tmpdir``, which ``torchserve`` sets
  from TEMP), PORT from ``TS_INITIAL_WORKER_PORT`` up, five digits at most;
- the tsctl engine: ``TEMP/tsctl-engine-XXXXXXXX/.ts.sock.PORT``, PORT ``FIRST_PORT`` +
  ``PORTS_PER_MODEL`` x the model's number + the worker's index;
- MLServer's runtime: ``TEMP/tsctl-mlserver-XXXXXXXX/.ts.sock.PORT``, one such directory per model;
- ``LocalModel``: ``/tmp/tsctl-XXXXXXXX/.ts.sock.9000``.

``socket_below`` gives each one's longest path below TEMP, so that whoever picks TEMP (``tsctl
serve``'s ``--home``, archiver/server.py) can pick one short enough; ``check`` refuses a path that
is too long in one line naming it and the fix, before a worker starts.
"""

import os
import tempfile
from typing import Optional

MAX_PATH = 107  # bytes of a Unix socket's path on Linux: sun_path holds 108 with the closing NUL
RANDOM = "X" * 8  # what tempfile.mkdtemp adds to its prefix, as long
ENGINE, MLSERVER = "tsctl-engine-", "tsctl-mlserver-"  # the run directories' prefixes
FIRST_PORT, PORTS_PER_MODEL = 9000, 100  # the tsctl engine's worker ids (its sockets' suffixes)
TORCHSERVE_PORT = 65535  # TorchServe's workers: TS_INITIAL_WORKER_PORT up, five digits at most
FIX = "run the server with TEMP set to a shorter directory (e.g. TEMP=/tmp; without TEMP, TMPDIR)"


class SocketPathError(RuntimeError):
    """A worker's socket path too long for a Unix socket (one line: the path, its length, the fix)."""


def socket_path(run_dir: str, port: int) -> str:
    """A worker's socket in ``run_dir``, named as TorchServe names it (its worker reads a port from the name)."""
    return os.path.join(run_dir, f".ts.sock.{port}")


def socket_below(prefix: Optional[str] = None, port: int = TORCHSERVE_PORT) -> str:
    """The path of a worker's socket below TEMP: ``/.ts.sock.PORT`` (TorchServe), or
    ``/PREFIXXXXXXXXX/.ts.sock.PORT`` for a server whose run directory ``run_dir(PREFIX)`` makes."""
    level = f"/{prefix}{RANDOM}" if prefix else ""
    return f"{level}/.ts.sock.{port}"


def engine_port(models: int) -> int:
    """The largest worker id the tsctl engine gives to the workers of ``models`` model versions."""
    return FIRST_PORT + PORTS_PER_MODEL * max(models, 1) - 1


def fits(path: str) -> bool:
    return len(os.fsencode(path)) <= MAX_PATH


def check(path: str, fix: str = FIX) -> None:
    """A SocketPathError naming ``path`` and ``fix`` unless a Unix socket can have that path."""
    if not fits(path):
        raise SocketPathError(
            f"a worker's socket would be {path} ({len(os.fsencode(path))} bytes), past the {MAX_PATH} bytes "
            f"a Unix socket's path may have: {fix}"
        )


def run_dir(prefix: str) -> str:
    """A new private directory for a server's workers (their sockets, the archives it unpacks): under
    TEMP when it is set, where TorchServe keeps its sockets and unpacked models (and where ``tsctl
    serve`` points it), else under the system's temporary directory."""
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TEMP") or None)
