"""Reading model archives someone else may have built: a .mar (zip), a .tar.gz, or an unpacked directory.

Nothing here trusts the archive. Every name is checked before anything is read (no absolute paths,
no ``..``); MANIFEST.json is read only up to ``MAX_MANIFEST_BYTES`` and must have the shape
TorchServe needs; unpacking adds up the sizes the archive declares and refuses, before writing a
byte, more than ``unpack_limit`` (a zip bomb) or more than the disk has free; and the files the
manifest names must lie inside the archive. Every problem is an ``ArchiveError``: one sentence
naming the archive and what is wrong with it.

Metadata (MANIFEST.json, MAR-INF/tsctl.json, MAR-INF/golden.json, model-config.yaml) is read with
bounds on size, depth and values before it is parsed (``read_json_member``, ``bounded_yaml``): a
132 KB golden.json that unpacks to 60 MB of ``[[],[],...]`` took 1.6 GB to parse, a YAML alias bomb
3.9 GB. ``printable`` escapes control characters in anything of the archive's that gets printed.

Used by ``LocalModel`` and the KServe transformer (which run archives) and by tsctl's commands.
"""

import json
import re
import shutil
import tarfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any, List, Optional, Tuple, Union

MANIFEST = "MAR-INF/MANIFEST.json"
MAX_MANIFEST_BYTES = 1 << 20
UNPACK_RATIO = 100  # an archive may unpack to this many times its own size (or MIN_UNPACK_LIMIT)
MIN_UNPACK_LIMIT = 1 << 30
PATH_KEYS = ("serializedFile", "modelFile", "handler", "configFile", "requirementsFile", "extensions")

MAX_METADATA_VALUES = 1_000_000  # JSON values or YAML nodes (aliases expanded) in one metadata file
MAX_METADATA_DEPTH = 64
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")  # incl. bidi overrides

PathLike = Union[str, Path]


class ArchiveError(ValueError):
    """A model archive that cannot or must not be read; the message names it and the problem."""

    exit_code = 2


def kind(archive: Path) -> str:
    """'dir', 'zip' or 'tar'; an ArchiveError for anything else."""
    if not archive.exists() and not archive.is_symlink():
        raise ArchiveError(f"{archive} does not exist: check the path")
    if archive.is_dir():
        if not (archive / MANIFEST).is_file():
            raise ArchiveError(f"{archive} is a directory without {MANIFEST}: it is not an unpacked model archive")
        return "dir"
    if not archive.is_file():
        raise ArchiveError(f"{archive} is not a regular file: give a .mar, .tar.gz or model directory")
    if zipfile.is_zipfile(archive):
        return "zip"
    try:
        if tarfile.is_tarfile(archive):
            return "tar"
    except (OSError, EOFError):
        pass
    raise ArchiveError(f"{archive} is not a model archive (.mar zip, .tar.gz or directory), or it is truncated")


def check_name(archive: Path, name: str):
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if name.startswith(("/", "\\")) or ".." in parts or (len(name) > 1 and name[1] == ":") or "\x00" in name:
        raise ArchiveError(f"{archive} holds an unsafe path {name!r} (absolute or with '..'): refusing to read it")


def members(archive: PathLike) -> List[Tuple[str, int]]:
    """(name, size) of every file, names checked; sizes are what the archive declares."""
    archive = Path(archive)
    try:
        found = _members(archive, kind(archive))
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"{archive} is damaged or truncated ({exc}): build it again") from None
    for name, _ in found:
        check_name(archive, name)
    return found


def _members(archive: Path, what: str) -> List[Tuple[str, int]]:
    if what == "dir":
        return [
            (p.relative_to(archive).as_posix(), p.stat().st_size)
            for p in sorted(archive.rglob("*"))
            if p.is_file() and not p.is_symlink()
        ]
    if what == "zip":
        with zipfile.ZipFile(archive) as z:
            return [(i.filename, i.file_size) for i in z.infolist() if not i.is_dir()]
    with tarfile.open(archive) as t:
        found = []
        for m in t:
            check_name(archive, m.name)
            if m.isfile():
                found.append((m.name.split("/", 1)[-1], m.size))
        return found


def read_member(archive: PathLike, name: str, limit: int) -> Optional[bytes]:
    """One file's bytes (at most ``limit``, else an ArchiveError), or None when it is not there."""
    archive = Path(archive)
    check_name(archive, name)
    what = kind(archive)
    try:
        data = _read(archive, what, name, limit)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"{archive}: {name} could not be read ({exc}): build the archive again") from None
    if data is not None and len(data) > limit:
        raise ArchiveError(f"{archive}: {name} is larger than {limit:,} bytes: refusing to read it")
    return data


def _read(archive: Path, what: str, name: str, limit: int) -> Optional[bytes]:
    """At most limit + 1 bytes of one file (enough to tell it is too big), or None."""
    if what == "dir":
        path = archive / name
        if not path.is_file() or path.is_symlink():
            return None
        with open(path, "rb") as f:
            return f.read(limit + 1)
    if what == "zip":
        with zipfile.ZipFile(archive) as z:
            if name not in z.NameToInfo:
                return None
            with z.open(name) as f:
                return f.read(limit + 1)
    with tarfile.open(archive) as t:
        for m in t:
            if m.isfile() and m.name.split("/", 1)[-1] == name:
                return t.extractfile(m).read(limit + 1)
    return None


def read_json_member(archive: PathLike, name: str, limit: int):
    """A JSON file of the archive, parsed (at most ``limit`` bytes); None when the archive has none,
    an ArchiveError when it is not JSON."""
    data = read_member(archive, name, limit)
    if data is None:
        return None
    return bounded_json(data, f"{archive}: {name}")


def bounded_json(data: bytes, where: str) -> Any:
    """JSON metadata, its values counted on the raw text before it is parsed and its depth checked
    (``protocol``'s counting, as for requests); an ArchiveError naming ``where`` otherwise."""
    from . import protocol  # not at the top: protocol is the wire, this module reads files

    limits = protocol.Limits(max_json_depth=MAX_METADATA_DEPTH, max_json_values=MAX_METADATA_VALUES)
    try:
        text = data.decode("utf-8")
        values = protocol.json_values(text, limits)
        if values > MAX_METADATA_VALUES:
            raise ArchiveError(f"{where} holds {values:,} values, above {MAX_METADATA_VALUES:,}: package it again")
        value = json.loads(text)
        protocol.check_json(value, limits)
        return value
    except (RecursionError, protocol.ClientError):
        raise ArchiveError(f"{where} nests deeper than {MAX_METADATA_DEPTH} levels: package it again") from None
    except ValueError as exc:
        raise ArchiveError(f"{where} is not valid JSON ({printable(str(exc))}): package it again") from None


def bounded_yaml(data: bytes, where: str) -> Any:
    """YAML metadata (model-config.yaml) read safely: at most ``MAX_METADATA_VALUES`` nodes once its
    aliases are expanded (a billion-laughs bomb is refused from its node graph, before anything is
    built from it) and ``MAX_METADATA_DEPTH`` levels; an ArchiveError naming ``where`` otherwise,
    carrying the YAML error's line when it is not YAML."""
    import yaml

    try:
        root = yaml.compose(data, Loader=yaml.SafeLoader)
        if root is None:
            return None
        nodes = _expanded_nodes(root)
        if nodes > MAX_METADATA_VALUES:
            raise ArchiveError(
                f"{where} expands to {nodes:,} values through its YAML aliases, above {MAX_METADATA_VALUES:,}: "
                "write it without anchors and aliases"
            )
        return yaml.safe_load(data)
    except RecursionError:
        raise ArchiveError(f"{where} nests deeper than Python can read: fix the syntax") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark else ""
        raise ArchiveError(f"{where} is not valid YAML{line}: fix the syntax") from None


def _expanded_nodes(root) -> int:
    """How many nodes a YAML node graph holds with every alias expanded: each distinct node's count
    is computed once (aliases share node objects), so this costs the graph, not the expansion."""
    import yaml

    counts, stack = {}, [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if depth > MAX_METADATA_DEPTH:
            raise RecursionError
        if id(node) in counts:
            continue
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        if done:
            counts[id(node)] = 1 + sum(counts[id(child)] for child in children)
            continue
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in children if id(child) not in counts)
    return counts[id(root)]


def printable(text: Any) -> str:
    """``text`` with control characters (terminal escapes, carriage returns, bidi overrides) shown
    as ``\\xNN`` / ``\\uNNNN``: names and values of an archive's are printed through this."""
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def read_manifest(archive: PathLike) -> dict:
    """MANIFEST.json, checked: a mapping with a ``model`` mapping naming ``modelName`` and ``handler``,
    every path it names inside the archive."""
    archive = Path(archive)
    members(archive)  # refuses unsafe names first
    data = read_member(archive, MANIFEST, MAX_MANIFEST_BYTES)
    if data is None:
        raise ArchiveError(f"{archive} has no {MANIFEST}: it is not a model archive")
    manifest = bounded_json(data, f"{archive}: {MANIFEST}")
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
    return manifest


def unpack_limit(archive: Path) -> int:
    return max(MIN_UNPACK_LIMIT, UNPACK_RATIO * archive.stat().st_size)


def unpack(archive: PathLike, into: PathLike) -> Path:
    """Extract a .mar or .tar.gz into ``into``; return the model directory (the one holding MAR-INF).
    The declared sizes are added up and refused before anything is written."""
    archive, into = Path(archive), Path(into)
    what = kind(archive)
    if what == "dir":
        raise ArchiveError(f"{archive} is a directory: it is already unpacked")
    read_manifest(archive)
    total = sum(size for _, size in members(archive))
    limit = unpack_limit(archive)
    if total > limit:
        raise ArchiveError(
            f"{archive} would unpack to {total:,} bytes, more than {UNPACK_RATIO}x its size "
            f"(limit {limit:,}): refusing a likely zip bomb"
        )
    into.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(into).free
    if total > free:
        raise ArchiveError(f"{archive} needs {total:,} bytes to unpack but {into} has {free:,} free: free some space")
    try:
        if what == "zip":
            _unzip(archive, into)
        else:
            _untar(archive, into)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as exc:
        raise ArchiveError(f"{archive} is damaged or truncated ({exc}): build it again") from None
    except OSError as exc:
        raise ArchiveError(f"{archive} could not be unpacked into {into}: {exc.strerror or exc}") from None
    if what == "zip":
        return into
    tops = list(into.iterdir())
    return tops[0] if len(tops) == 1 and tops[0].is_dir() else into


def _unzip(archive: Path, into: Path):
    # zipfile never writes more than a member's declared size (a member that lies fails its CRC).
    with zipfile.ZipFile(archive) as z:
        z.extractall(into)


def _untar(archive: Path, into: Path):
    with tarfile.open(archive) as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(into, filter="data")
        else:  # Python before 3.9.17: members were checked by members(); links are refused here
            for m in t:
                if not (m.isfile() or m.isdir()):
                    raise ArchiveError(f"{archive} holds {m.name}, which is neither a file nor a directory")
            t.extractall(into)


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
