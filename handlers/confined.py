"""Files read inside a folder they must not leave: each opened once, then its real path checked on the open
descriptor, so a link swapped in between a check and a read cannot lead the read elsewhere.

A model store is such a folder (serving/model_store.py): an archive registered from it is opened here
(``open_within``), and an unpacked directory archive is copied out of it (``copy_within``) into the
engine's own folder, its links followed only while they lead to files inside the store. The workers
then run the copy, so what was checked (and its signature, when the engine has ``--public_key``) is what
runs, whatever is swapped in the store after.
"""

import os
import shutil
import stat
from pathlib import Path

# never waits on a pipe swapped in, nor makes a terminal swapped in the opener's controlling terminal (where ^C
# would then stop the engine: an outsider's attack, #43)
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
MAX_DEPTH = 64  # folders within folders a copied directory may hold
# files and folders a copied directory may hold: a model's holds dozens; 100,000 tiny files held the engine's
# management lock for minutes (an outsider's attack, #43), copied, then removed at unregister
MAX_ENTRIES = 10_000


class Outside(OSError):
    """What was opened lies outside the folder it had to lie in (``str()`` names both)."""


def real_path(fd: int) -> Path:
    """The real path of what ``fd`` has open, every link resolved, as the kernel knows it now (Linux's
    /proc/self/fd; F_GETPATH on macOS)."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        import fcntl

        if not hasattr(fcntl, "F_GETPATH"):
            raise
        return Path(os.fsdecode(fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024)).rstrip(b"\x00")))


def lies_within(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def open_within(name, top: Path, dir_fd=None, follow: bool = True) -> int:
    """``name`` (relative to ``dir_fd`` when given) opened for reading, without blocking, when what was
    opened lies within ``top`` (a real path); else ``Outside``. ``follow=False``: a link as the last part
    of the name is refused (OSError) rather than followed."""
    fd = os.open(name, OPEN_FLAGS | (0 if follow else os.O_NOFOLLOW), dir_fd=dir_fd)
    try:
        where = real_path(fd)
    except OSError:
        os.close(fd)
        raise
    if not lies_within(where, top):
        os.close(fd)
        raise Outside(f"{name} leads to {where}, outside {top}")
    return fd


def copy_within(dir_fd: int, into: Path, top: Path) -> int:
    """Copy the folder ``dir_fd`` has open into ``into`` (made; it must not exist yet), following links only
    to files and folders whose real path lies within ``top`` (``Outside`` for the first that does not).
    Pipes, devices and sockets are left out, as is a link back to a folder it is in. Past ``MAX_DEPTH``
    folders deep, ``MAX_ENTRIES`` files and folders, or the free space of ``into``'s disk, an OSError. Returns
    the bytes copied."""
    into.mkdir(parents=True)
    free = shutil.disk_usage(into).free
    copied, entries = 0, 0

    def walk(fd: int, dest: Path, above: tuple):
        nonlocal copied, entries
        if len(above) > MAX_DEPTH:
            raise OSError(f"{dest} is more than {MAX_DEPTH} folders deep")
        names = sorted(os.listdir(fd))
        entries += len(names)
        if entries > MAX_ENTRIES:
            raise OSError(f"it holds more than {MAX_ENTRIES:,} files and folders: pack the model as a .mar")
        for name in names:
            try:
                kind = os.stat(name, dir_fd=fd).st_mode  # a pipe or a device is never opened
            except FileNotFoundError:  # a dangling link, or gone since the listing
                continue
            if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
                continue
            child = open_within(name, top, dir_fd=fd)
            try:
                found = os.fstat(child)
                if stat.S_ISDIR(found.st_mode):
                    if (found.st_dev, found.st_ino) in above:  # a link to a folder it is in: a loop
                        continue
                    (dest / name).mkdir()
                    walk(child, dest / name, above + ((found.st_dev, found.st_ino),))
                elif stat.S_ISREG(found.st_mode):
                    copied += found.st_size
                    if copied > free:
                        raise OSError(f"{into} has {free:,} bytes free, too few for a copy of the directory")
                    copy_file(child, dest / name, found.st_mode)
            finally:
                os.close(child)

    top_stat = os.fstat(dir_fd)
    walk(dir_fd, into, ((top_stat.st_dev, top_stat.st_ino),))
    return copied


def copy_file(fd: int, dest: Path, mode: int):
    """The bytes of open ``fd`` into a new file ``dest``, with its permission bits."""
    with open(dest, "xb") as out, os.fdopen(os.dup(fd), "rb") as source:
        shutil.copyfileobj(source, out, 1 << 20)
    os.chmod(dest, stat.S_IMODE(mode))
