"""Reading model archives someone else may have built: a .mar (zip), a .tar.gz, or an unpacked directory.

Nothing here trusts the archive. Every name is checked before anything is read (no absolute paths,
no ``..``); MANIFEST.json is read only up to ``MAX_MANIFEST_BYTES`` and must have the shape
TorchServe needs; unpacking adds up the sizes the archive declares and refuses, before writing a
byte, more than ``unpack_limit`` (a zip bomb) or more than the disk has free; and the files the
manifest names must lie inside the archive. Every problem is an ``ArchiveError``: one sentence
naming the archive and what is wrong with it.

A zip is read two ways: Python's ``zipfile`` (tsctl) reads its central directory, TorchServe's frontend
(Java's ``ZipInputStream``) its local entries in order. ``check_zip`` refuses any zip where the two
could differ (a hidden entry, duplicate names, sizes, gaps, prefix or trailing data), so what tsctl
checks and signs is what TorchServe unpacks; ``kind`` runs it on every zip before anything else reads it.

Metadata (MANIFEST.json, MAR-INF/tsctl.json, MAR-INF/golden.json, model-config.yaml) is read with
bounds on size, depth and values before it is parsed (``read_json_member``, ``bounded_yaml``): a
132 KB golden.json that unpacks to 60 MB of ``[[],[],...]`` took 1.6 GB to parse, a YAML alias bomb
3.9 GB. ``printable`` escapes control characters in anything of the archive's that gets printed.

Used by ``LocalModel`` and the KServe transformer (which run archives) and by tsctl's commands.
"""

import json
import os
import re
import shutil
import stat
import struct
import tarfile
import zipfile
import zlib
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

_CHECKED: set = set()  # (path, device, inode, size, mtime, ctime) of the archives check_zip or check_tar passed
LOCAL = struct.Struct("<4sHHHHHIIIHH")  # a local file header, 30 bytes
END = struct.Struct("<4sHHHHIIH")  # end of central directory, 22 bytes
CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # a central directory record, 46 bytes
END64_LOCATOR = struct.Struct("<4sIQI")  # 20 bytes
END64 = struct.Struct("<4sQHHIIQQQQ")  # 56 bytes
MAX32 = 0xFFFFFFFF
DEFLATED_WITH_DESCRIPTOR = 8  # flag bit 3: sizes and CRC in a data descriptor after the data
UTF8_NAME = 0x800  # flag bit 11
ENCRYPTED = 1
KNOWN_FLAGS = 0x6 | DEFLATED_WITH_DESCRIPTOR | UTF8_NAME  # bits 1-2: deflate's speed, which changes no byte


class NotARegularFile(OSError):
    """A path that is a directory, a device or a pipe where a file's bytes were wanted."""


def read_regular(path: PathLike, size: int) -> bytes:
    """At most ``size`` bytes of ``path``, a regular file: opened without blocking, so a pipe raises
    NotARegularFile instead of being waited on (as does a directory or a device); OSError when it
    cannot be opened. For files a user names on the command line (key files, package's inputs)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory its own way
        os.close(fd)
        raise NotARegularFile(path)
    with os.fdopen(fd, "rb") as f:
        return f.read(size)


class ArchiveError(ValueError):
    """A model archive that cannot or must not be read; the message names it and the problem."""

    exit_code = 2


def kind(archive: Path) -> str:
    """'dir', 'zip' (check_zip passed) or 'tar' (check_tar passed); an ArchiveError for anything else."""
    if not archive.exists() and not archive.is_symlink():
        raise ArchiveError(f"{archive} does not exist: check the path")
    if archive.is_dir():
        if not (archive / MANIFEST).is_file():
            raise ArchiveError(f"{archive} is a directory without {MANIFEST}: it is not an unpacked model archive")
        return "dir"
    if not archive.is_file():
        raise ArchiveError(f"{archive} is not a regular file: give a .mar, .tar.gz or model directory")
    if zipfile.is_zipfile(archive):
        what = "zip"
    else:
        try:
            what = "tar" if tarfile.is_tarfile(archive) else None
        except (OSError, EOFError):
            what = None
    if what is None:
        raise ArchiveError(f"{archive} is not a model archive (.mar zip, .tar.gz or directory), or it is truncated")
    stat = archive.stat()  # a command reads an archive several times: each version of a file is checked once
    version = (str(archive.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if version not in _CHECKED:
        if what == "zip":
            check_zip(archive)
        else:
            check_tar(archive)
        if len(_CHECKED) >= 1024:
            _CHECKED.clear()
        _CHECKED.add(version)
    return what


def check_zip(archive: Path):
    """Refuse a zip whose local entries, read in order from offset 0 as Java's ``ZipInputStream``
    (TorchServe) reads them, are not exactly the entries of its central directory, which Python's
    ``zipfile`` (tsctl) reads: same names, offsets, methods, CRCs and sizes, in the same order, one
    after another with nothing between them, the central directory right after the last one and its
    end record (no comment) the end of the file.

    Where each entry ends: a stored entry, by its size (both readers). A deflated entry without a data
    descriptor, by its local header's compressed size (a ZIP64 extra field's when the header says
    0xFFFFFFFF): ZipInputStream inflates to the end of the stream and fails the entry unless the bytes
    it consumed are exactly that size, so once that size equals the central record's, where the stream
    really ends needs no inflating. That size must be the only one Java could read: an extra block
    (local or central) whose fields overrun it, leave bytes over, or give a field twice is refused
    (ZipInputStream keeps the last ZIP64 field, this check would read one of them). A deflated entry
    with a data descriptor (``zip -``, jar tools, streaming writers; never tsctl or
    torch-model-archiver) ends where its stream ends, which only inflating tells: its stream is
    inflated (output discarded) and refused as soon as it gives more than its declared size. Before
    anything is inflated the declared sizes are held to ``unpack_limit`` (a zip bomb is refused from
    its headers), so a check inflates at most that much; any other zip is checked from its headers."""
    try:
        with open(archive, "rb") as f:
            try:
                z = zipfile.ZipFile(f)
            except UnicodeDecodeError as exc:  # a name flagged UTF-8 that is not
                name = printable(exc.object.decode("utf-8", "replace"))
                raise ArchiveError(
                    f"{archive}: entry {name} is marked UTF-8 but its name is not: build it again"
                ) from None
            except NotImplementedError as exc:  # "zip file version 7.0": a central record's version needed
                name = printable(_entry_needing_a_newer_zip(f))
                raise ArchiveError(
                    f"{archive}: entry {name} needs a newer zip reader ({exc}): build it again"
                ) from None
            with z:
                _check_zip(archive, f, z)
    except (zipfile.BadZipFile, struct.error, EOFError, OSError, zlib.error) as exc:
        raise ArchiveError(f"{archive} is damaged or truncated ({exc}): build it again") from None


def _entry_needing_a_newer_zip(f) -> str:
    """The name of the first central record whose "version needed to extract" is above what zipfile reads
    (zipfile's NotImplementedError names none); "?" when the central directory cannot be walked here."""
    size = f.seek(0, 2)
    f.seek(max(0, size - END.size))
    record = f.read(END.size)
    if len(record) < END.size or record[:4] != b"PK\x05\x06":
        return "?"
    _, _, _, _, count, _, at, _ = END.unpack(record)
    for _ in range(count):
        f.seek(at)
        head = f.read(CENTRAL.size)
        if len(head) < CENTRAL.size or head[:4] != b"PK\x01\x02":
            return "?"
        _, _, needed, *_, name_length, extra_length, comment_length, _, _, _, _ = CENTRAL.unpack(head)
        if needed > zipfile.MAX_EXTRACT_VERSION:
            return f.read(name_length).decode("utf-8", "replace")
        at += CENTRAL.size + name_length + extra_length + comment_length
    return "?"


def check_tar(archive: Path):
    """Refuse a .tar.gz that extraction could read otherwise than tsctl: a member name given twice (tar -x,
    Python's extractall and TorchServe's TarArchiveInputStream loop keep the last copy, tsctl's readers
    the first) or a member other than a regular file or directory (a link, device or pipe)."""
    seen = set()
    try:
        with tarfile.open(archive) as t:
            for m in t:
                if not (m.isfile() or m.isdir()):
                    raise ArchiveError(
                        f"{archive} holds {printable(m.name)}, which is neither a regular file nor a directory "
                        "(a link, device or pipe): build it again without it"
                    )
                normal = "/".join(part for part in m.name.split("/") if part not in ("", "."))
                if normal in seen:
                    raise ArchiveError(
                        f"{archive} holds {printable(m.name)} twice: TorchServe would unpack the last copy, tsctl "
                        "reads the first; refusing it (build it again)"
                    )
                seen.add(normal)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ArchiveError(f"{archive} is damaged or truncated ({exc}): build it again") from None


def _disagree(archive: Path, what: str) -> ArchiveError:
    return ArchiveError(
        f"{archive}: {printable(what)}: its entries and its central directory disagree, so TorchServe would "
        "unpack other files than tsctl checks; refusing it (build it again)"
    )


def _check_zip(archive: Path, f, z: zipfile.ZipFile):
    check_unpacked_size(archive, sum(info.file_size for info in z.infolist()))  # before inflating anything
    seen = set()
    pos = 0
    for info in z.infolist():  # zipfile's offsets count any data before the first entry
        name = info.orig_filename
        if pos != info.header_offset:
            raise _disagree(archive, _between(f, pos, info.header_offset, f"entry {name}"))
        if not name:
            raise ArchiveError(f"{archive}: entry number {len(seen) + 1} has an empty name: build it again")
        normal = "/".join(part for part in name.split("/") if part not in ("", "."))  # as a file system would
        if normal in seen or "\x00" in name:
            raise _disagree(archive, f"entry {name} is listed twice" if normal in seen else f"entry {name!r} has a NUL")
        seen.add(normal)
        pos = _check_entry(archive, f, info, pos)
    if pos != z.start_dir:
        raise _disagree(archive, _between(f, pos, z.start_dir, "the central directory"))
    _check_end(archive, f, z.start_dir, len(z.infolist()))


def _between(f, pos: int, expected: int, what: str) -> str:
    """What lies at ``pos`` where ``what`` was expected to start at ``expected``."""
    if pos > expected:
        return f"{what} starts at byte {expected:,}, inside the entry before it (which ends at byte {pos:,})"
    f.seek(pos)
    head = f.read(LOCAL.size)
    if len(head) == LOCAL.size and head[:4] == b"PK\x03\x04":
        hidden = f.read(LOCAL.unpack(head)[9]).decode("utf-8", "replace")
        return f"it holds a hidden entry {hidden} that its central directory does not list (before {what})"
    return f"{expected - pos:,} bytes of unlisted data lie before {what}"


def _check_entry(archive: Path, f, info: zipfile.ZipInfo, pos: int) -> int:
    """Check one local entry against its central record; where the next entry must start."""
    name = info.orig_filename
    f.seek(pos)
    head = f.read(LOCAL.size)
    if len(head) < LOCAL.size or head[:4] != b"PK\x03\x04":
        raise _disagree(archive, f"entry {name} has no local header at byte {pos:,}")
    _, _, flags, method, _, _, crc, csize, usize, name_length, extra_length = LOCAL.unpack(head)
    raw_name = f.read(name_length)
    extra = f.read(extra_length)
    if raw_name != name.encode("utf-8" if flags & UTF8_NAME else "cp437") or (flags ^ info.flag_bits) & UTF8_NAME:
        local_name = raw_name.decode("utf-8" if flags & UTF8_NAME else "cp437", "replace")
        raise _disagree(archive, f"entry {name} is named {local_name} in its local header")
    if not flags & UTF8_NAME and not raw_name.isascii():  # Java reads such a name as UTF-8, zipfile as cp437
        raise _disagree(archive, f"entry {name}'s name is neither ASCII nor marked UTF-8")
    if flags & ENCRYPTED or info.flag_bits & ENCRYPTED:
        raise _disagree(archive, f"entry {name} is encrypted")
    if method != info.compress_type or flags != info.flag_bits:
        raise _disagree(archive, f"entry {name}'s local header has another method or flags than its central record")
    if flags & ~KNOWN_FLAGS:  # patched data, strong encryption...: zipfile refuses what Java reads, or both misread
        raise _disagree(archive, f"entry {name} has flags {flags:#06x}, which tsctl does not read")
    if method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise _disagree(archive, f"entry {name} is compressed with method {method}, which TorchServe cannot read")
    if method == zipfile.ZIP_STORED and info.compress_size != info.file_size:
        raise _disagree(archive, f"entry {name} is stored (not compressed) but its two sizes differ")
    start = pos + LOCAL.size + name_length + extra_length
    end = start + info.compress_size
    local_fields = _extra_fields(archive, name, extra, "local header")
    _extra_fields(archive, name, info.extra, "central record")
    if not flags & DEFLATED_WITH_DESCRIPTOR:
        if MAX32 in (csize, usize):  # as ZipInputStream reads them: the ZIP64 field's, both sizes
            if len(local_fields.get(1, b"")) < 16:
                raise _disagree(archive, f"entry {name}'s local header has no ZIP64 sizes")
            usize, csize = struct.unpack_from("<QQ", local_fields[1])
        if (crc, csize, usize) != (info.CRC, info.compress_size, info.file_size):
            raise _disagree(archive, f"entry {name}'s local header gives other sizes or CRC than its central record")
        return end
    if method != zipfile.ZIP_DEFLATED:
        raise _disagree(archive, f"entry {name} is stored with a data descriptor, which TorchServe cannot read")
    if not _deflate_ends_at(f, start, info.compress_size, info.file_size):
        raise _disagree(archive, f"entry {name}'s compressed data does not end where its central record says")
    f.seek(end)
    wide = info.compress_size > MAX32 or info.file_size > MAX32  # ZipInputStream's rule for 8-byte sizes
    descriptor = f.read(4 + 4 + (16 if wide else 8))
    signed = descriptor[:4] == b"PK\x07\x08"
    if not signed:
        descriptor = descriptor[:-4]
    crc, csize, usize = struct.unpack("<IQQ" if wide else "<III", descriptor[4:] if signed else descriptor)
    if (crc, csize, usize) != (info.CRC, info.compress_size, info.file_size):
        raise _disagree(archive, f"entry {name}'s data descriptor gives other sizes or CRC than its central record")
    return end + len(descriptor)


def _extra_fields(archive: Path, name: str, extra: bytes, where: str) -> dict:
    """An extra block's fields, {tag: data}; refused when a field overruns the block, bytes are left
    over after the last field or a tag comes twice (Java and zipfile would each read the block their way)."""
    fields, at = {}, 0
    while at < len(extra):
        if at + 4 > len(extra):
            raise _disagree(archive, f"entry {name}'s {where} has {len(extra) - at} stray bytes in its extra fields")
        tag, length = struct.unpack_from("<HH", extra, at)
        if at + 4 + length > len(extra):
            raise _disagree(archive, f"entry {name}'s {where} has an extra field 0x{tag:04x} longer than its block")
        if tag in fields:
            raise _disagree(archive, f"entry {name}'s {where} has two extra fields 0x{tag:04x}")
        fields[tag] = extra[at + 4 : at + 4 + length]
        at += 4 + length
    return fields


def _deflate_ends_at(f, start: int, size: int, usize: int) -> bool:
    """Whether the deflate stream at ``start`` ends exactly ``size`` bytes later (ZipInputStream reads a
    data descriptor where the stream ends, zipfile where the central directory says), inflating no more
    than ``usize`` + 1 bytes: a stream that gives more than its declared size is refused there."""
    f.seek(start)
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    left, written = size, 0
    while left and not inflater.eof:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            return False
        left -= len(chunk)
        while chunk and not inflater.eof:
            written += len(inflater.decompress(chunk, min(1 << 20, usize - written + 1)))  # output discarded
            if written > usize:
                return False
            chunk = inflater.unconsumed_tail
    return inflater.eof and not inflater.unused_data and left == 0


def _check_end(archive: Path, f, cd_offset: int, entries: int):
    """The end record (or ZIP64's) must say the central directory starts at ``cd_offset`` and holds
    ``entries`` entries, end right where it starts, and be the end of the file (no comment)."""
    size = f.seek(0, 2)
    f.seek(max(0, size - END.size))
    record = f.read(END.size)
    if len(record) < END.size or record[:4] != b"PK\x05\x06" or END.unpack(record)[7]:
        raise _disagree(archive, "its end record is not the end of the file (a comment or trailing data follows)")
    _, disk, cd_disk, here, count, cd_size, offset, _ = END.unpack(record)
    end = size - END.size
    zip64 = _zip64_start(f)
    if zip64 is not None:
        f.seek(zip64)
        _, _, _, _, disk, cd_disk, here, count, cd_size, offset = END64.unpack(f.read(END64.size))
        end = zip64
    if disk or cd_disk or here != count:
        raise ArchiveError(f"{archive} spans several disks: build it again as one file")
    if (offset, count) != (cd_offset, entries) or offset + cd_size != end:
        raise _disagree(archive, "its end record does not frame its central directory exactly")


def _zip64_start(f) -> Optional[int]:
    """Where the ZIP64 end record starts, when the archive has one (right before its locator)."""
    size = f.seek(0, 2)
    if size < END.size + END64_LOCATOR.size + END64.size:
        return None
    f.seek(size - END.size - END64_LOCATOR.size)
    signature, _, offset, _ = END64_LOCATOR.unpack(f.read(END64_LOCATOR.size))
    if signature != b"PK\x06\x07":
        return None
    if offset != size - END.size - END64_LOCATOR.size - END64.size:
        raise ArchiveError(f"{f.name}: its ZIP64 end record is not where its locator says: build it again")
    f.seek(offset)
    if f.read(4) != b"PK\x06\x06":
        raise ArchiveError(f"{f.name}: its ZIP64 end record is damaged: build it again")
    return offset


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


def check_unpacked_size(archive: Path, total: int):
    """Refuse an archive whose declared sizes add up to more than ``unpack_limit`` (a zip bomb): from its
    headers, before anything is inflated (``check_zip``) or written (``unpack``)."""
    limit = unpack_limit(archive)
    if total > limit:
        raise ArchiveError(
            f"{archive} would unpack to {total:,} bytes, more than {UNPACK_RATIO}x its size "
            f"(limit {limit:,}): refusing a likely zip bomb"
        )


def unpack(archive: PathLike, into: PathLike) -> Path:
    """Extract a .mar or .tar.gz into ``into``; return the model directory (the one holding MAR-INF).
    The declared sizes are added up and refused before anything is written."""
    archive, into = Path(archive), Path(into)
    what = kind(archive)
    if what == "dir":
        raise ArchiveError(f"{archive} is a directory: it is already unpacked")
    read_manifest(archive)
    total = sum(size for _, size in members(archive))
    check_unpacked_size(archive, total)
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
