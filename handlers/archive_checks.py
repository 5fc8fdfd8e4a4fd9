"""The strictness checks every archive passes before anything reads it (``archives.Archive`` runs them once).

A zip is read two ways: Python's ``zipfile`` (tsctl) reads its central directory, TorchServe's frontend
(Java's ``ZipInputStream``) its local entries in order. ``check_zip`` refuses any zip where the two
could differ (a hidden entry, duplicate names, sizes, gaps, prefix or trailing data), so what tsctl
checks and signs is what TorchServe unpacks. ``check_tar`` refuses a .tar.gz that extraction could read
otherwise than tsctl (a name given twice, links, devices). Both refuse, from the sizes an archive
declares and before anything is inflated, more than ``unpack_limit`` (a zip bomb).
"""

import struct
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Optional

from .metadata import ArchiveError, printable

UNPACK_RATIO = 100  # an archive may unpack to this many times its own size (or MIN_UNPACK_LIMIT)
MIN_UNPACK_LIMIT = 1 << 30
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


def check_zip(archive: Path):
    """``open_zip`` on a file of its own, closed after: the check alone."""
    with open(archive, "rb") as f:
        open_zip(archive, f).close()


def open_zip(archive: Path, f) -> zipfile.ZipFile:
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
    its headers), so a check inflates at most that much; any other zip is checked from its headers.

    Returns the checked ``ZipFile`` over ``f`` (the open file of ``archive``), for its reader to keep."""
    try:
        try:
            z = zipfile.ZipFile(f)
        except UnicodeDecodeError as exc:  # a name flagged UTF-8 that is not
            name = printable(exc.object.decode("utf-8", "replace"))
            raise ArchiveError(f"{archive}: entry {name} is marked UTF-8 but its name is not: build it again") from None
        except NotImplementedError as exc:  # "zip file version 7.0": a central record's version needed
            name = printable(_entry_needing_a_newer_zip(f))
            raise ArchiveError(f"{archive}: entry {name} needs a newer zip reader ({exc}): build it again") from None
        try:
            _check_zip(archive, f, z)
        except BaseException:
            z.close()
            raise
        return z
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
    """``open_tar`` on a file of its own, closed after: the check alone."""
    with open(archive, "rb") as f:
        open_tar(archive, f).close()


def open_tar(archive: Path, f) -> tarfile.TarFile:
    """Refuse a .tar.gz that extraction could read otherwise than tsctl: a member name given twice (tar -x,
    Python's extractall and TorchServe's TarArchiveInputStream loop keep the last copy, tsctl's readers
    the first) or a member other than a regular file or directory (a link, device or pipe). Returns the
    checked ``TarFile`` over ``f`` (the open file of ``archive``, a tar the caller has recognised), its
    members read."""
    seen = set()
    f.seek(0)
    try:
        t = tarfile.open(fileobj=f)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ArchiveError(f"{archive} is damaged or truncated ({exc}): build it again") from None
    try:
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
        return t
    except BaseException as exc:
        t.close()
        if isinstance(exc, (tarfile.TarError, EOFError, OSError, zlib.error)):
            raise ArchiveError(f"{archive} is damaged or truncated ({exc}): build it again") from None
        raise


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
