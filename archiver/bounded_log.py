"""A served engine's output file, bounded and rotated as TorchServe's log4j2.xml rotates its own logs.

    python -m archiver.bounded_log FILE MAX_BYTES BACKUPS    (its standard input: the server's output)

``tsctl serve`` starts every engine detached, its stdout and stderr to a file of its home
(``torchserve.out``, ``engine.out``, ``mlserver.out``: the engine's log, the workers' lines it forwards,
a handler's prints, a traceback). A file the server writes to directly grows without end (a handler
printing 60 KiB lines grew ``engine.out`` by 1.1 GiB in 3 s). ``server.spawn`` sends that output
through this process instead, which writes it with Python's ``RotatingFileHandler``: at ``MAX_BYTES``
the file becomes ``FILE.1`` (``FILE.1`` becomes ``FILE.2``...) and at most ``BACKUPS`` of them are
kept, TorchServe's own 100 MB x 5 by default (``TSCTL_LOG_MAX_BYTES``, ``TSCTL_LOG_BACKUPS``). A
line longer than ``MAX_LINE`` is written in pieces of that size. It ends when the server's output
closes (the server and every process sharing its output have exited).
"""

import glob
import logging
import logging.handlers
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

MAX_BYTES = 100 << 20  # TorchServe's log4j2.xml: SizeBasedTriggeringPolicy size="100 MB"
BACKUPS = 5  # and DefaultRolloverStrategy max="5"
MAX_LINE = 64 << 10  # bytes of one line written at once
MAX_BYTES_VARIABLE, BACKUPS_VARIABLE = "TSCTL_LOG_MAX_BYTES", "TSCTL_LOG_BACKUPS"


def limits() -> Tuple[int, int]:
    """(bytes of one file, files kept besides it): ``TSCTL_LOG_MAX_BYTES``/``TSCTL_LOG_BACKUPS``, else
    TorchServe's; a value that is not a whole number above 0 is a UserError naming the variable."""
    from .errors import UserError

    values = []
    for variable, default, least in ((MAX_BYTES_VARIABLE, MAX_BYTES, 4096), (BACKUPS_VARIABLE, BACKUPS, 1)):
        text = os.environ.get(variable, "").strip()
        if not text:
            values.append(default)
            continue
        if not text.isdigit() or int(text) < least:
            raise UserError(f"{variable}={text!r} must be a whole number of at least {least}: set it so, or unset it")
        values.append(int(text))
    return values[0], values[1]


def start(path: Path) -> subprocess.Popen:
    """This writer on ``path`` (whatever an earlier server left there, rotated files too, removed), in a
    session of its own; its ``stdin`` is the pipe to give the server as stdout and stderr."""
    max_bytes, backups = limits()
    for old in [path, *path.parent.glob(f"{glob.escape(path.name)}.*")]:
        if old == path or old.suffix[1:].isdigit():
            old.unlink(missing_ok=True)
    path.touch()
    command = [sys.executable, "-m", "archiver.bounded_log", str(path), str(max_bytes), str(backups)]
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=path.parent,
        env=writer_env(),
    )


def writer_env() -> dict:
    """This process's environment, with the folder ``archiver`` is imported from first on PYTHONPATH."""
    source = str(Path(__file__).resolve().parent.parent)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p))


def write(stream, path: str, max_bytes: int, backups: int):
    """Each line of ``stream`` (binary) into ``path``, rotated; until it closes."""
    output = logging.handlers.RotatingFileHandler(
        path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", errors="replace"
    )
    output.setFormatter(logging.Formatter("%(message)s"))
    while True:
        raw = stream.readline(MAX_LINE)
        if not raw:
            break
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        output.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))
    output.close()


def main(argv: List[str]):
    path, max_bytes, backups = argv[0], int(argv[1]), int(argv[2])
    write(sys.stdin.buffer, path, max_bytes, backups)


if __name__ == "__main__":
    main(sys.argv[1:])
