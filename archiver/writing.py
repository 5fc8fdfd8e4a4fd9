"""Writing model archives: a .mar (zip), a .tar.gz or a directory, deterministic and atomic.

Builds are deterministic (sorted entries, fixed timestamps: ``SOURCE_DATE_EPOCH`` or the newest
input's mtime, in UTC) and atomic (an unnamed file in the export directory, linked into place only
when complete; without ``force`` the link is exclusive, so of two racing builds one gets a clear
error). Weights are stored uncompressed: they do not deflate, and storing them is what makes
packaging fast.

``write`` is the one way an archive is written (``tsctl package``, ``--golden``, export's rewrites):
with a signing key its files, MANIFEST.json included, are laid out as the archive will hold them
(hard links to the inputs where the file system allows, copies otherwise), signed
(``MAR-INF/model.sig``, archiver/signing.py) and written once from that tree.
"""

import contextlib
import errno
import gzip
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Dict, Optional, Union

from handlers.archives import MANIFEST, opened

from .errors import UserError

WEIGHT_SUFFIXES = (".pt", ".pth", ".pt2", ".bin", ".safetensors", ".onnx", ".ckpt", ".h5", ".msgpack")
COPY_BUFFER = 4 << 20
EARLIEST = 315532800  # 1980-01-01: zip dates start there
FORMATS = {"dir": "no-archive", "tar": "tgz", "zip": "default"}  # an archive's kind: the format it is written in

Source = Union[Path, bytes]  # a file on disk, or content tsctl writes (a generated requirements.txt)


def manifest_text(manifest: dict) -> bytes:
    """MANIFEST.json's bytes, as every build writes them."""
    return (json.dumps(manifest, indent=2) + "\n").encode("utf-8")


def write(
    target: Path,
    entries: Dict[str, Source],
    manifest: dict,
    archive_format: str,
    force: bool = True,
    sign_key: Optional[str] = None,
):
    """Write the archive (``write_archive``); with ``sign_key`` (a PEM EC private key) its tree is
    signed first and written with its signature, ``MAR-INF/model.sig``, in the one write."""
    if not sign_key:
        write_archive(target, entries, manifest, archive_format, force)
        return
    if archive_format == "no-archive":
        raise UserError("--sign-key signs .mar and .tar.gz archives: drop --archive-format no-archive")
    from . import signing

    with tempfile.TemporaryDirectory(prefix="tsctl-sign-", dir=target.parent) as tmp:
        tree = lay_out(Path(tmp), entries, manifest)
        linked = {name: _stamp(path) for name, path in tree.items()}
        tree[signing.SIGNATURE] = signing.sign(Path(tmp), sign_key)

        def unchanged():  # a hard link shares its input's bytes: one written to since would not match the signature
            for name, stamp in linked.items():
                if _stamp(tree[name]) != stamp:
                    raise UserError(
                        f"{entries[name]} changed while it was packaged and signed: package again once nothing "
                        "writes to it"
                    )

        write_archive(target, tree, manifest, archive_format, force, before_publish=unchanged)


def _stamp(path: Path) -> tuple:
    """What changes when a file is written to: its size, modification and change times."""
    found = path.stat()
    return found.st_size, found.st_mtime_ns, found.st_ctime_ns


def lay_out(root: Path, entries: Dict[str, Source], manifest: dict) -> Dict[str, Source]:
    """The archive's files under ``root`` as it will hold them (what is signed), MANIFEST.json included:
    each input hard-linked where the file system allows (no copy of the weights), else copied. The
    entries, now each a file of the tree (what is written is what was signed)."""
    tree: Dict[str, Source] = {}
    for name, source in entries.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, bytes):
            path.write_bytes(source)
        else:
            try:
                os.link(source, path)
            except OSError:  # another file system, or a file this user may not link (protected_hardlinks)
                shutil.copyfile(source, path)
        tree[name] = path
    (root / MANIFEST).parent.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).write_bytes(manifest_text(manifest))
    return tree


def rewrite_archive(source, target: Path, replace: Dict[str, Source], sign_key: Optional[str] = None):
    """Write ``target``: ``source`` (a .mar, .tar.gz or directory, or an open Archive) with the entries in
    ``replace`` added or replaced, in the same format, atomically; ``source`` is not touched. With
    ``sign_key`` the tree as written (MANIFEST.json included) is signed (``write``)."""
    with opened(source) as archive, tempfile.TemporaryDirectory(prefix="tsctl-rewrite-", dir=target.parent) as tmp:
        root = archive.path if archive.kind == "dir" else archive.unpack(tmp)
        entries: Dict[str, Source] = {
            path.relative_to(root).as_posix(): path
            for path in sorted(root.rglob("*"))
            if path.is_file() and path.relative_to(root).as_posix() != MANIFEST
        }
        entries.update(replace)
        write(target, entries, archive.manifest, FORMATS[archive.kind], True, sign_key)


def write_error(exc: OSError, target: Path) -> UserError:
    """One sentence for a build that the file system stopped (full disk, permissions)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return UserError(f"no space left on the device of {target.parent}: free some, or pick another --export-path")
    return UserError(f"could not build {target}: {exc.filename or target}: {exc.strerror or exc}")


def build_time(entries: Dict[str, Source]) -> int:
    """Seconds since the epoch (UTC) stamped on every entry: SOURCE_DATE_EPOCH or the newest input."""
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return max(int(os.environ["SOURCE_DATE_EPOCH"]), EARLIEST)
    stamps = [int(p.stat().st_mtime) for p in entries.values() if isinstance(p, Path)]
    return max(stamps + [EARLIEST])


def _size(source: Source) -> int:
    return len(source) if isinstance(source, bytes) else source.stat().st_size


def _open(source: Source):
    return io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")


def write_archive(
    target: Path,
    entries: Dict[str, Source],
    manifest: dict,
    archive_format: str,
    force=True,
    before_publish: Optional[Callable[[], None]] = None,
):
    """Write the archive; with ``force`` it replaces ``target``, else FileExistsError if it exists.
    ``before_publish`` runs once the bytes are written, before the archive takes its name; what it
    raises leaves ``target`` as it was."""
    manifest_bytes = manifest_text(manifest)
    epoch = build_time(entries)
    if archive_format == "no-archive":
        _write_directory(target, entries, manifest_bytes, force)
        return
    writer = _write_tgz if archive_format == "tgz" else _write_zip
    with _unnamed_file(target.parent) as (out, publish):
        writer(out, entries, manifest_bytes, epoch, target.name, archive_format)
        out.flush()
        os.fsync(out.fileno())
        if before_publish is not None:
            before_publish()
        publish(target, force)


@contextlib.contextmanager
def _unnamed_file(directory: Path):
    """A file with no name until ``publish(target, replace)`` links it into place (Linux O_TMPFILE):
    a build that fails, or a process killed mid-write, leaves neither a partial archive nor a
    temporary file. Without ``replace`` the link is exclusive (FileExistsError if the target exists).
    Where O_TMPFILE is not supported, a hidden named temporary file is removed on failure instead."""
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o644)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:

        def publish(target: Path, replace: bool):
            name = f".{target.name}.{os.getpid()}.tmp" if replace else target.name
            directory_fd = os.open(target.parent, os.O_RDONLY)
            try:  # linkat(AT_SYMLINK_FOLLOW) gives the open file a name; plain link() cannot
                os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=directory_fd, follow_symlinks=True)
            finally:
                os.close(directory_fd)
            if replace:
                os.replace(target.parent / name, target)

        with os.fdopen(fd, "wb") as out:
            yield out, publish
        return
    fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=directory)

    def publish_named(target: Path, replace: bool):
        os.chmod(tmp, 0o644)
        if replace:
            os.replace(tmp, target)
        else:
            os.link(tmp, target)
            os.unlink(tmp)

    try:
        with os.fdopen(fd, "wb") as out:
            yield out, publish_named
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_zip(out, entries, manifest_bytes, epoch: int, _name, archive_format):
    date_time = tuple(time.gmtime(epoch)[:6])
    with zipfile.ZipFile(out, "w", allowZip64=True) as z:
        for arcname in sorted(entries):
            source = entries[arcname]
            info = zipfile.ZipInfo(arcname, date_time)
            info.create_system = 3
            info.external_attr = 0o644 << 16
            stored = archive_format == "zip-store" or arcname.lower().endswith(WEIGHT_SUFFIXES)
            info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            size = _size(source)
            with _open(source) as src, z.open(info, "w", force_zip64=size >= zipfile.ZIP64_LIMIT) as dst:
                shutil.copyfileobj(src, dst, COPY_BUFFER)
        info = zipfile.ZipInfo(MANIFEST, date_time)
        info.create_system = 3
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, manifest_bytes)


def _write_tgz(out, entries, manifest_bytes, epoch: int, name, _format):
    top = name[: -len(".tar.gz")]
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for arcname in sorted(entries) + [MANIFEST]:
            info = tarfile.TarInfo(f"{top}/{arcname}")
            info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = epoch, 0o644, 0, 0, "", ""
            if arcname == MANIFEST:
                info.size = len(manifest_bytes)
                tar.addfile(info, io.BytesIO(manifest_bytes))
            else:
                info.size = _size(entries[arcname])
                with _open(entries[arcname]) as src:
                    tar.addfile(info, src)


def _write_directory(target: Path, entries, manifest_bytes, force: bool):
    """Write into a hidden directory, then rename it into place. With ``force`` an existing target is
    moved aside first and removed after; without, the rename fails if the target appeared meanwhile."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        for arcname, source in entries.items():
            (tmp / arcname).parent.mkdir(parents=True, exist_ok=True)
            with _open(source) as src, open(tmp / arcname, "wb") as dst:
                shutil.copyfileobj(src, dst, COPY_BUFFER)
        (tmp / MANIFEST).parent.mkdir(parents=True, exist_ok=True)
        (tmp / MANIFEST).write_bytes(manifest_bytes)
        if force and (target.exists() or target.is_symlink()):
            old = target.with_name(f".{target.name}.old")
            os.replace(target, old)
            os.replace(tmp, target)
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
        else:
            try:
                os.rename(tmp, target)  # fails if another build made a non-empty target meanwhile
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                    raise FileExistsError(str(target)) from None
                raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
