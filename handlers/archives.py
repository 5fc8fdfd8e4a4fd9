"""Reading model archives someone else may have built: a .mar (zip), a .tar.gz, or an unpacked directory.

``Archive(path)`` opens one once. Opening it runs the strictness checks on the open file
(``archive_checks``: a zip both TorchServe and tsctl read alike, a tar with no links or twice-given
names, declared sizes no zip bomb); everything after reads that same file: its member index, its
manifest, its model-config.yaml and, through ``cached``, what the format modules read from it
(identity.py's MAR-INF/tsctl.json, golden.py's golden cases, signing.py's signature), each parsed
the first time it is asked for and kept. A file changed on disk while it is open is refused rather
than read half old, half new.

Nothing here trusts the archive. Every name is checked before anything is read (no absolute paths,
no ``..``); MANIFEST.json is read only up to ``MAX_MANIFEST_BYTES`` and must have the shape
TorchServe needs; metadata is parsed within bounds (metadata.py); unpacking adds up the sizes the
archive declares and refuses, before writing a byte, more than ``unpack_limit`` or more than the disk
has free; and the files the manifest names must lie inside the archive. Every problem is an
``ArchiveError``: one sentence naming the archive and what is wrong with it.

The module functions (``read_manifest``, ``read_member``, ...) take a path or an open Archive: a
path is opened for the one call. Used by LocalModel, the engines and the KServe transformer (which
run archives) and by tsctl's commands.
"""

import contextlib
import errno
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

# MIN_UNPACK_LIMIT, check_tar, check_zip and printable: callers (and tests) import them from here too
from . import confined
from .archive_checks import MIN_UNPACK_LIMIT, check_tar, check_unpacked_size, check_zip, open_tar, open_zip  # noqa: F401
from .metadata import ArchiveError, bounded_json, bounded_yaml, printable  # noqa: F401

MANIFEST = "MAR-INF/MANIFEST.json"
MAX_MANIFEST_BYTES = 1 << 20
MAX_CONFIG_BYTES = 1 << 20  # a model-config.yaml, read whole
PATH_KEYS = ("serializedFile", "modelFile", "handler", "configFile", "requirementsFile", "extensions")
DAMAGED = (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, zlib.error)

PathLike = Union[str, Path]


class NotARegularFile(OSError):
    """A path that is a directory, a device or a pipe where a file's bytes were wanted."""


def open_regular(path: PathLike):
    """``path`` opened for reading, a regular file: opened without blocking and checked once open, so a
    pipe raises NotARegularFile instead of being waited on (as does a directory or a device), even one
    swapped in since the path was last looked at; OSError when it cannot be opened."""
    fd = os.open(path, confined.OPEN_FLAGS)  # nor becomes the controlling terminal of a tty swapped in
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory its own way
        os.close(fd)
        raise NotARegularFile(path)
    return os.fdopen(fd, "rb")


def read_regular(path: PathLike, size: int) -> bytes:
    """At most ``size`` bytes of ``path``, a regular file (``open_regular``). For files a user names on the
    command line (key files, package's inputs)."""
    with open_regular(path) as f:
        return f.read(size)


def check_name(archive: Path, name: str):
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":") or "\x00" in name:
        raise ArchiveError(f"{archive} holds an unsafe path {name!r} (absolute or with '..'): refusing to read it")


class Archive:
    """A model archive opened once and checked (module docstring): ``kind`` is 'dir', 'zip' or 'tar'.
    Close it (or open it in a ``with``) when done; what was read stays readable after."""

    def __init__(self, path: PathLike, within: Optional[PathLike] = None):
        self.path = Path(path)
        self.within = Path(within).resolve() if within is not None else None  # the folder it must lie in
        self._file = None  # the open .mar or .tar.gz
        self._dir: Optional[int] = None  # the open directory of an unpacked archive
        self._root: Optional[Path] = None  # its real path
        self._zip: Optional[zipfile.ZipFile] = None
        self._tar: Optional[tarfile.TarFile] = None
        self._cache: Dict[str, Any] = {}
        self.kind = self._open()

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *_):
        self.close()

    def __repr__(self) -> str:
        return f"Archive({str(self.path)!r})"

    def close(self):
        for opened in (self._zip, self._tar, self._file):
            if opened is not None:
                opened.close()
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None

    def _open(self) -> str:
        """Open the path once, without blocking (a pipe swapped in is refused, not waited on), and check what
        was opened: within ``within`` when given, a directory holding MANIFEST.json or a regular file."""
        path = self.path
        if not path.exists() and not path.is_symlink():
            raise ArchiveError(f"{path} does not exist: check the path")
        try:
            fd = confined.open_within(path, self.within) if self.within else os.open(path, confined.OPEN_FLAGS)
        except confined.Outside:
            raise ArchiveError(f"{path} leads outside {self.within}: copy the archive into {self.within}") from None
        except OSError as exc:
            raise ArchiveError(f"{path} cannot be read ({exc.strerror or exc}): check its permissions") from None
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            self._dir, self._root = fd, confined.real_path(fd)
            if self._read(MANIFEST, 0) is None:
                self.close()
                raise ArchiveError(f"{path} is a directory without {MANIFEST}: it is not an unpacked model archive")
            return "dir"
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise ArchiveError(f"{path} is not a regular file: give a .mar, .tar.gz or model directory")
        self._file = os.fdopen(fd, "rb")
        try:
            self._version = _version(self._file)
            if _pytorch_file(self._file):
                raise ArchiveError(
                    f"{path} is a PyTorch file (torch.save or torch.jit.save wrote it), not a model archive: package "
                    f"it first, e.g. 'tsctl package --model-name NAME --handler HANDLER --serialized-file {path}', "
                    "and give the .mar it writes"
                )
            if zipfile.is_zipfile(self._file):
                self._zip = open_zip(path, self._file)
                return "zip"
            if _is_tar(self._file):
                self._tar = open_tar(path, self._file)
                return "tar"
        except BaseException:
            self.close()
            raise
        self.close()
        raise ArchiveError(f"{path} is not a model archive (.mar zip, .tar.gz or directory), or it is truncated")

    def _unchanged(self):
        """Refuse to read on when the open file changed since it was checked (written over in place). A
        link made or removed (its ctime moves with its link count, its bytes stay) is not a change."""
        if self._file is None:
            return
        now = _version(self._file)
        if now != self._version and not (now[:3] == self._version[:3] and now[4] != self._version[4]):
            raise ArchiveError(f"{self.path} changed on disk while tsctl read it: refusing it (read it again)")
        self._version = now

    @cached_property
    def members(self) -> List[Tuple[str, int]]:
        """(name, size) of every file, names checked; sizes are what the archive declares."""
        try:
            found = self._members()
        except DAMAGED as exc:
            raise ArchiveError(f"{self.path} is damaged or truncated ({exc}): build it again") from None
        for name, _ in found:
            check_name(self.path, name)
        return found

    def _members(self) -> List[Tuple[str, int]]:
        if self.kind == "dir":  # listed through the directory opened, not its path (a link swapped since)
            if self._dir is None:
                raise ArchiveError(f"{self.path} is closed: open it again to list it")
            found = []
            for folder, _, names, fd in os.fwalk(".", dir_fd=self._dir):
                for name in names:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        found.append((os.path.normpath(os.path.join(folder, name)).replace(os.sep, "/"), info.st_size))
            return sorted(found)
        if self.kind == "zip":
            return [(i.filename, i.file_size) for i in self._zip.infolist() if not i.is_dir()]
        found = []
        for m in self._tar.getmembers():
            check_name(self.path, m.name)
            if m.isfile():
                found.append((_in_tar(m), m.size))
        return found

    def read(self, name: str, limit: int) -> Optional[bytes]:
        """One file's bytes (at most ``limit``, else an ArchiveError), or None when it is not there."""
        check_name(self.path, name)
        try:
            data = self._read(name, limit)
        except DAMAGED as exc:
            raise ArchiveError(f"{self.path}: {name} could not be read ({exc}): build the archive again") from None
        if data is not None and len(data) > limit:
            raise ArchiveError(f"{self.path}: {name} is larger than {limit:,} bytes: refusing to read it")
        return data

    def _read(self, name: str, limit: int) -> Optional[bytes]:
        """At most limit + 1 bytes of one file (enough to tell it is too big), or None."""
        self._unchanged()
        if self._root is not None:  # a link as its last part is not the archive's file; nor is a file outside it
            if self._dir is None:
                raise ArchiveError(f"{self.path} is closed: open it again to read {name}")
            try:
                fd = confined.open_within(name, self._root, dir_fd=self._dir, follow=False)
            except (FileNotFoundError, NotADirectoryError, confined.Outside):
                return None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    return None
                raise
            with os.fdopen(fd, "rb") as f:
                return f.read(limit + 1) if stat.S_ISREG(os.fstat(fd).st_mode) else None
        if self.kind == "zip":
            if name not in self._zip.NameToInfo:
                return None
            with self._zip.open(name) as f:
                return f.read(limit + 1)
        for m in self._tar.getmembers():  # check_tar refused a name given twice
            if m.isfile() and _in_tar(m) == name:
                return self._tar.extractfile(m).read(limit + 1)
        return None

    def read_json(self, name: str, limit: int) -> Any:
        """A JSON file of the archive, parsed once (at most ``limit`` bytes); None when the archive has
        none, an ArchiveError when it is not JSON."""

        def parse():
            data = self.read(name, limit)
            return None if data is None else bounded_json(data, f"{self.path}: {name}")

        return self.cached(name, parse)

    def cached(self, key: str, compute: Callable[[], Any]) -> Any:
        """What ``compute()`` gives, computed the first time ``key`` is asked for and kept: how
        identity.py, golden.py and signing.py read their file once per Archive."""
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @cached_property
    def manifest(self) -> dict:
        """MANIFEST.json, checked: a mapping with a ``model`` mapping naming ``modelName`` and ``handler``,
        every path it names inside the archive."""
        self.members  # refuses unsafe names first
        data = self.read(MANIFEST, MAX_MANIFEST_BYTES)
        if data is None:
            raise ArchiveError(f"{self.path} has no {MANIFEST}: it is not a model archive")
        manifest = bounded_json(data, f"{self.path}: {MANIFEST}")
        check_manifest(self.path, manifest)
        return manifest

    @property
    def model(self) -> dict:
        """The manifest's ``model``: modelName, handler, serializedFile, configFile, ..."""
        return self.manifest["model"]

    @property
    def model_name(self) -> str:
        return self.model["modelName"]

    @property
    def version(self) -> str:
        """The model's version, "1.0" when the manifest gives none (as TorchServe and tsctl config take it)."""
        return str(self.model.get("modelVersion") or "1.0")

    @cached_property
    def config(self) -> dict:
        """The archive's model-config.yaml as a mapping ({} without one): the one reader of it, for
        tsctl config, the engines, export and the transformer. A config that is not a mapping is refused."""
        name = self.model.get("configFile")
        data = self.read(name, MAX_CONFIG_BYTES) if name else None
        if not data:
            return {}
        where = f"{self.path}: {name}"
        config = bounded_yaml(data, where, "fix it and package again")
        if config is None:
            return {}
        if not isinstance(config, dict):
            raise ArchiveError(f"{where} must be a YAML mapping of keys (minWorkers, batchSize, handler, ...)")
        return config

    def unpack(self, into: PathLike) -> Path:
        """Extract the .mar or .tar.gz into ``into``; return the model directory (the one holding
        MAR-INF). The declared sizes are added up and refused before anything is written."""
        into = Path(into)
        if self.kind == "dir":
            raise ArchiveError(f"{self.path} is a directory: it is already unpacked")
        self.manifest
        total = sum(size for _, size in self.members)
        check_unpacked_size(self.path, total)
        into.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(into).free
        if total > free:
            raise ArchiveError(
                f"{self.path} needs {total:,} bytes to unpack but {into} has {free:,} free: free some space"
            )
        self._unchanged()
        try:
            if self.kind == "zip":  # zipfile never writes more than a member's declared size (or fails its CRC)
                self._zip.extractall(into)
            else:
                _untar(self._tar, into)
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as exc:
            raise ArchiveError(f"{self.path} is damaged or truncated ({exc}): build it again") from None
        except OSError as exc:
            raise ArchiveError(f"{self.path} could not be unpacked into {into}: {exc.strerror or exc}") from None
        if self.kind == "zip":
            return into
        tops = list(into.iterdir())
        return tops[0] if len(tops) == 1 and tops[0].is_dir() else into

    def file_digest(self) -> str:
        """The sha256 (hex) of the open .mar or .tar.gz, as it was checked when opened."""
        import hashlib

        self._unchanged()
        digest, position = hashlib.sha256(), self._file.tell()
        self._file.seek(0)
        for block in iter(lambda: self._file.read(1 << 20), b""):
            digest.update(block)
        self._file.seek(position)
        return digest.hexdigest()

    def model_dir(self, into: PathLike) -> Path:
        """The directory to run the archive from, resolved: a .mar or .tar.gz unpacked into ``into``; an
        unpacked directory itself, or, opened ``within`` a folder (a model store), copied into ``into``
        through what was opened, its links followed only inside that folder (``confined.copy_within``), so
        that nothing swapped in the folder afterwards runs; the files its manifest names checked to lie
        inside it."""
        if self.kind != "dir":
            model_dir = self.unpack(into).resolve()
        elif self.within is None:
            model_dir = self._root
        else:
            model_dir = self._copy(Path(into))
        check_inside(model_dir, self.manifest)
        return model_dir

    def _copy(self, into: Path) -> Path:
        self.manifest
        try:
            confined.copy_within(self._dir, into, self.within)
        except confined.Outside as exc:
            raise ArchiveError(f"{self.path}: {exc}: copy the file into the archive") from None
        except OSError as exc:
            raise ArchiveError(f"{self.path} could not be copied into {into}: {exc.strerror or exc}") from None
        return into.resolve()


def _version(f) -> Tuple[int, int, int, int, int]:
    """What tells the open file was written to: inode, size, modification time; its change time (which
    a write resetting the modification time still moves) and link count (which moves it too)."""
    found = os.fstat(f.fileno())
    return found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_nlink


def _pytorch_file(f) -> bool:
    """Whether the open file is what torch.save or torch.jit.save writes rather than an archive: a zip of
    one folder holding ``data.pkl`` (``constants.pkl`` too for TorchScript) and no MAR-INF/MANIFEST.json, or
    (torch.save's format before 1.6) a pickle, which starts with the PROTO opcode. Read from the central
    directory alone (any zip Python cannot read so is left to ``open_zip``); the file is left at 0."""
    try:
        f.seek(0)
        if f.read(1) == b"\x80":
            return True
        with zipfile.ZipFile(f) as z:
            names = z.namelist()
    except Exception:  # noqa: BLE001 - not a zip, or one open_zip then refuses in its own words
        return False
    finally:
        f.seek(0)
    tops = {name.partition("/")[0] for name in names}
    return (
        MANIFEST not in names and len(tops) == 1 and any(n.count("/") == 1 and n.endswith("/data.pkl") for n in names)
    )


def _is_tar(f) -> bool:
    f.seek(0)
    try:
        return tarfile.is_tarfile(f)
    except (OSError, EOFError, zlib.error):
        return False


def _untar(t: tarfile.TarFile, into: Path):
    if hasattr(tarfile, "data_filter"):
        t.extractall(into, filter="data")
    else:  # Python before 3.9.17: open_tar refused links, devices and pipes already
        t.extractall(into)


def _in_tar(member: tarfile.TarInfo) -> str:
    """A tar member's name inside the archive: below the top directory the tar is made of."""
    return member.name.split("/", 1)[-1]


def check_manifest(archive: Path, manifest: Any):
    """A parsed MANIFEST.json has the shape TorchServe needs and names only paths inside the archive."""
    model = manifest.get("model") if isinstance(manifest, dict) else None
    if not isinstance(model, dict):
        raise ArchiveError(f"{archive}: {MANIFEST} has no 'model' object: it is not a TorchServe model archive")
    for key in ("modelName", "handler"):
        if not isinstance(model.get(key), str) or not model[key]:
            raise ArchiveError(f"{archive}: {MANIFEST} names no model.{key}: build the archive again")
    for key in PATH_KEYS:
        value = model.get(key)
        if value is not None and not isinstance(value, str):
            raise ArchiveError(f"{archive}: {MANIFEST} model.{key} must be a string, got {type(value).__name__}")
        if value:
            check_name(archive, value.split(":", 1)[0] if key == "handler" else value)


def check_inside(model_dir: Path, manifest: dict):
    """Refuse a manifest whose files resolve outside ``model_dir`` (through a link, say)."""
    root = Path(model_dir).resolve()
    model = manifest.get("model", {})
    for key in PATH_KEYS:
        value = model.get(key)
        if not value or (key == "handler" and not value.split(":", 1)[0].endswith(".py")):
            continue
        path = (root / value.split(":", 1)[0]).resolve()
        if path != root and root not in path.parents:
            raise ArchiveError(f"{model_dir}: MANIFEST.json model.{key} {value!r} points outside the archive")


ArchiveLike = Union[str, Path, Archive]


@contextlib.contextmanager
def opened(archive: ArchiveLike, within: Optional[PathLike] = None) -> Iterator[Archive]:
    """``archive`` itself when it is an Archive, else the path opened for the block (``within`` that
    folder, when given) and closed after: for the functions that take either."""
    if isinstance(archive, Archive):
        yield archive
        return
    with Archive(archive, within) as found:
        yield found
