"""Building and reading model archives (.mar) in the format TorchServe 0.12 loads.

A .mar is a zip: the serialized file, model file, handler, extra files, requirements and
model-config.yaml at its root, plus ``MAR-INF/MANIFEST.json``. A toolkit handler
(``--handler image_classifier``) bundles this project's ``handlers/`` package so a stock TorchServe
loads it with nothing else installed. Directories keep their name and structure inside the archive.

Builds are deterministic (sorted entries, fixed timestamps: ``SOURCE_DATE_EPOCH`` or the newest
input's mtime) and atomic (a temporary file in the export directory, renamed into place only when
complete). Weights are stored uncompressed: they do not deflate, and storing them is what makes
packaging fast.
"""

import ast
import contextlib
import gzip
import importlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import yaml

import handlers
from handlers import TOOLKIT_HANDLERS

from .errors import UserError
from .model_config import check_model_config

MANIFEST = "MAR-INF/MANIFEST.json"
ARCHIVER_VERSION = "0.12.0"  # the torch-model-archiver format these archives follow
FORMATS = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]*$")
WEIGHT_SUFFIXES = (".pt", ".pth", ".pt2", ".bin", ".safetensors", ".onnx", ".ckpt", ".h5", ".msgpack")
SKIP_DIRS = {"__pycache__", "__MACOSX"}
COPY_BUFFER = 4 << 20

Source = Union[Path, bytes]  # a file on disk, or content tsctl writes (a generated requirements.txt)


@dataclass
class PackageOptions:
    """torch-model-archiver's flags, by the same names."""

    model_name: str
    handler: str
    serialized_file: Optional[str] = None
    model_file: Optional[str] = None
    version: str = "1.0"
    extra_files: List[str] = field(default_factory=list)
    requirements_file: Optional[str] = None
    config_file: Optional[str] = None
    export_path: str = "model-store"
    archive_format: str = "default"
    force: bool = False


def archive_path(export_path, model_name: str, archive_format: str = "default") -> Path:
    return Path(export_path) / (model_name + FORMATS[archive_format])


def package(options: PackageOptions) -> Path:
    """Validate everything, then write the archive atomically. Returns its path."""
    entries, manifest = plan(options)
    target = archive_path(options.export_path, options.model_name, options.archive_format)
    if target.exists() and not options.force:
        raise UserError(f"{target} already exists: pass --force to overwrite it")
    Path(options.export_path).mkdir(parents=True, exist_ok=True)
    write_archive(target, entries, manifest, options.archive_format)
    return target


def plan(options: PackageOptions) -> Tuple[Dict[str, Source], dict]:
    """The archive's entries (name inside -> file on disk) and its manifest, after validation."""
    name = options.model_name
    if not MODEL_NAME.match(name or ""):
        raise UserError(
            f"invalid --model-name {name!r}: use letters, digits, '_', '-' and '.', starting with a letter or digit"
        )
    if options.archive_format not in FORMATS:
        raise UserError(f"unknown --archive-format {options.archive_format!r}: use one of {', '.join(FORMATS)}")
    entries: Dict[str, Source] = {}
    model = {"modelName": name}

    if options.serialized_file:
        serialized = _existing(options.serialized_file, "--serialized-file")
        _add(entries, serialized)
        model["serializedFile"] = serialized.name

    handler_entry, bundle = _resolve_handler(options.handler, entries)
    model["handler"] = handler_entry
    if handler_entry in TOOLKIT_HANDLERS.values() and not options.serialized_file:
        raise UserError(f"--handler {options.handler} needs the model's weights: pass --serialized-file")

    if options.model_file:
        model_file = _existing(options.model_file, "--model-file")
        if not model_file.is_file() or model_file.suffix != ".py":
            raise UserError(f"--model-file {options.model_file} must be a Python file defining the model class")
        _add(entries, model_file)
        model["modelFile"] = model_file.name

    model["modelVersion"] = options.version

    for extra in options.extra_files:
        _add(entries, _existing(extra, "--extra-files"))

    handler_class = _toolkit_class(handler_entry)
    requirements = _requirements(options.requirements_file, getattr(handler_class, "requirements", ()))
    if requirements is not None:
        name_in_mar, content = requirements
        entries[name_in_mar] = content
        model["requirementsFile"] = name_in_mar

    if options.config_file:
        config = _existing(options.config_file, "--config-file")
        check_model_config(config, handler_class.Settings if handler_class else None)
        _add(entries, config)
        model["configFile"] = config.name

    if bundle:
        package_dir = Path(handlers.__file__).parent
        for source in sorted(package_dir.glob("*.py")):
            _add(entries, source, f"handlers/{source.name}")

    manifest = {
        "createdOn": time.strftime("%d/%m/%Y %H:%M:%S", time.gmtime(_build_time(entries))),
        "runtime": "python",
        "model": model,
        "archiverVersion": ARCHIVER_VERSION,
    }
    return entries, manifest


def _existing(path: str, flag: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise UserError(f"{flag} {path} does not exist: check the path")
    return p


def _add(entries: Dict[str, Source], source: Path, arcname: Optional[str] = None):
    """Add a file, or a directory with its structure, under ``arcname`` (default: its own name)."""
    arcname = arcname or source.name
    if source.is_dir():
        for root, dirs, files in os.walk(source):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
            for f in sorted(files):
                if f.endswith(".pyc") or f == ".DS_Store":
                    continue
                full = Path(root) / f
                _add(entries, full, f"{arcname}/{full.relative_to(source).as_posix()}")
        return
    if arcname in entries and (isinstance(entries[arcname], bytes) or entries[arcname].resolve() != source.resolve()):
        raise UserError(f"two inputs would both be stored as {arcname} ({entries[arcname]} and {source}): rename one")
    entries[arcname] = source


def _resolve_handler(handler: str, entries: Dict[str, Source]) -> Tuple[str, bool]:
    """The manifest's handler string and whether to bundle the toolkit's ``handlers/`` package."""
    if handler in TOOLKIT_HANDLERS:
        return TOOLKIT_HANDLERS[handler], True
    path, _, function = handler.partition(":")
    source = Path(path)
    if source.suffix == ".py" and source.is_file():
        _add(entries, source)
        entry = source.name + (f":{function}" if function else "")
        return entry, _imports_toolkit(source)
    known = ", ".join(TOOLKIT_HANDLERS)
    raise UserError(
        f"unknown --handler {handler!r}: use a toolkit handler ({known}) or the path of your handler .py file"
    )


def _imports_toolkit(source: Path) -> bool:
    """True when a user's handler file imports this toolkit's ``handlers`` package."""
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    except SyntaxError as exc:
        raise UserError(f"--handler {source} is not valid Python (line {exc.lineno}): {exc.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "handlers" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "handlers":
            return True
    return False


def _toolkit_class(handler_entry: str):
    """The handler class behind a toolkit entry point, or None for a user's own handler."""
    if handler_entry not in TOOLKIT_HANDLERS.values():
        return None
    module_name, _, function = handler_entry.partition(":")
    return getattr(importlib.import_module(module_name), function).handler_class


def _requirements(path: Optional[str], needed) -> Optional[Tuple[str, bytes]]:
    """The archive's requirements file: the user's, plus a pin of each package the handler needs
    (at the version installed here) that the user's file does not already name."""
    lines = []
    name = "requirements.txt"
    if path:
        source = _existing(path, "--requirements-file")
        name = source.name
        lines = source.read_text(encoding="utf-8").splitlines()
    named = {re.split(r"[<>=!~\[; ]", line.strip(), maxsplit=1)[0].lower() for line in lines if line.strip()}
    for package in needed:
        if package.lower() not in named:
            lines.append(f"{package}=={importlib.metadata.version(package)}")
    if not lines:
        return None
    return name, ("\n".join(lines) + "\n").encode("utf-8")


def _build_time(entries: Dict[str, Source]) -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    stamps = [int(p.stat().st_mtime) for p in entries.values() if isinstance(p, Path)]
    return max(stamps, default=315532800)


def _size(source: Source) -> int:
    return len(source) if isinstance(source, bytes) else source.stat().st_size


def _open(source: Source):
    return io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")


# ---- writing ------------------------------------------------------------------------------------
def write_archive(target: Path, entries: Dict[str, Source], manifest: dict, archive_format: str):
    manifest_bytes = (json.dumps(manifest, indent=2) + "\n").encode("utf-8")
    stamp = time.gmtime(max(_build_time(entries), 315532800))  # zip dates start in 1980
    if archive_format == "no-archive":
        _write_directory(target, entries, manifest_bytes)
        return
    writer = _write_tgz if archive_format == "tgz" else _write_zip
    with _unnamed_file(target.parent) as (out, publish):
        writer(out, entries, manifest_bytes, stamp, target.name, archive_format)
        out.flush()
        os.fsync(out.fileno())
        publish(target)


@contextlib.contextmanager
def _unnamed_file(directory: Path):
    """A file with no name until ``publish(target)`` links it into place (Linux O_TMPFILE): a build
    that fails, or a process killed mid-write, leaves neither a partial archive nor a temporary file.
    Where O_TMPFILE is not supported, a hidden named temporary file is removed on failure instead."""
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o644)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:

        def publish(target: Path):
            staging = f".{target.name}.{os.getpid()}.tmp"
            directory_fd = os.open(target.parent, os.O_RDONLY)
            try:  # linkat(AT_SYMLINK_FOLLOW) gives the open file a name; plain link() cannot
                os.link(f"/proc/self/fd/{fd}", staging, dst_dir_fd=directory_fd, follow_symlinks=True)
            finally:
                os.close(directory_fd)
            os.replace(target.parent / staging, target)

        with os.fdopen(fd, "wb") as out:
            yield out, publish
        return
    fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out, lambda target: (os.chmod(tmp, 0o644), os.replace(tmp, target))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_zip(out, entries, manifest_bytes, stamp, _name, archive_format):
    date_time = tuple(stamp[:6])
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


def _write_tgz(out, entries, manifest_bytes, stamp, name, _format):
    top = name[: -len(".tar.gz")]
    mtime = int(time.mktime(stamp)) if stamp else 0
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for arcname in sorted(entries) + [MANIFEST]:
            info = tarfile.TarInfo(f"{top}/{arcname}")
            info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = mtime, 0o644, 0, 0, "", ""
            if arcname == MANIFEST:
                info.size = len(manifest_bytes)
                tar.addfile(info, io.BytesIO(manifest_bytes))
            else:
                info.size = _size(entries[arcname])
                with _open(entries[arcname]) as src:
                    tar.addfile(info, src)


def _write_directory(target: Path, entries, manifest_bytes):
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        for arcname, source in entries.items():
            (tmp / arcname).parent.mkdir(parents=True, exist_ok=True)
            with _open(source) as src, open(tmp / arcname, "wb") as dst:
                shutil.copyfileobj(src, dst, COPY_BUFFER)
        (tmp / MANIFEST).parent.mkdir(parents=True, exist_ok=True)
        (tmp / MANIFEST).write_bytes(manifest_bytes)
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---- reading ------------------------------------------------------------------------------------
def list_entries(archive) -> List[Tuple[str, int]]:
    """(name, size) of every file in a .mar, .tar.gz or model directory; refuses unsafe names."""
    archive = Path(archive)
    if archive.is_dir():
        found = [
            (p.relative_to(archive).as_posix(), p.stat().st_size) for p in sorted(archive.rglob("*")) if p.is_file()
        ]
    elif zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            found = [(i.filename, i.file_size) for i in z.infolist() if not i.is_dir()]
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as t:
            found = [(m.name.split("/", 1)[-1], m.size) for m in t.getmembers() if m.isfile()]
            for m in t.getmembers():
                _check_name(archive, m.name)
    else:
        raise UserError(f"{archive} is not a model archive (.mar zip, .tar.gz or directory)")
    for name, _ in found:
        _check_name(archive, name)
    return found


def _check_name(archive: Path, name: str):
    if name.startswith("/") or ".." in Path(name).parts or re.match(r"^[A-Za-z]:", name):
        raise UserError(f"{archive} holds an unsafe path {name!r} (absolute or with '..'): refusing to read it")


def read_manifest(archive) -> dict:
    archive = Path(archive)
    list_entries(archive)  # refuses unsafe archives first
    try:
        if archive.is_dir():
            return json.loads((archive / MANIFEST).read_text(encoding="utf-8"))
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                return json.loads(z.read(MANIFEST))
        with tarfile.open(archive) as t:
            member = next(m for m in t.getmembers() if m.name.endswith(MANIFEST))
            return json.loads(t.extractfile(member).read())
    except (KeyError, StopIteration, FileNotFoundError):
        raise UserError(f"{archive} has no {MANIFEST}: it is not a model archive") from None


def read_member(archive, name: str) -> Optional[bytes]:
    """One file's bytes from an archive, or None when it is not there."""
    archive = Path(archive)
    if archive.is_dir():
        p = archive / name
        return p.read_bytes() if p.is_file() else None
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            return z.read(name) if name in z.namelist() else None
    with tarfile.open(archive) as t:
        for m in t.getmembers():
            if m.isfile() and m.name.split("/", 1)[-1] == name:
                return t.extractfile(m).read()
    return None


def model_config(archive) -> dict:
    """The archive's model-config.yaml as a mapping ({} when it has none)."""
    config_name = read_manifest(archive).get("model", {}).get("configFile")
    if not config_name:
        return {}
    data = read_member(archive, config_name)
    return (yaml.safe_load(data) or {}) if data else {}
