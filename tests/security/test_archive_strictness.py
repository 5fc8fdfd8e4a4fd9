"""A zip is read two ways (issue #29): tsctl's Python ``zipfile`` reads the central directory,
TorchServe's Java ``ZipInputStream`` the local entries in order. A signed archive with one more local
entry that the central directory does not list passed ``tsctl verify --public-key`` while TorchServe
unpacked and ran the hidden file. ``handlers.archives.check_zip`` refuses any zip whose two views could
differ; every reader (verify, run, inspect, package's reading, the engine) goes through it.

Each mutation below is made on the bytes of a real packaged .mar and must be refused in one line
naming the entry; clean archives from ``tsctl package`` and torch-model-archiver must pass.
"""

import io
import os
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from handlers import archives
from helpers.engine import Engine, snapshot_entry, write_config
from helpers.models import package_resnet
from helpers.zips import HIDDEN, central, hidden_entry, insert

BIN = Path(sys.executable).parent


def tsctl(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "tsctl"), *map(str, args)], capture_output=True, text=True, timeout=300)


# ---- mutations of a zip's bytes ------------------------------------------------------------------------


def entry_offsets(data: bytes):
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {i.filename: i.header_offset for i in z.infolist()}


def duplicate_name(data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        with pytest.warns(UserWarning, match="Duplicate name"):
            dst.writestr("index_to_name.json", b"{}")
    return out.getvalue()


def renamed_locally(data: bytes) -> bytes:
    at = entry_offsets(data)["index_to_name.json"]
    out = bytearray(data)
    out[at + 30 : at + 30 + len("index_to_name.json")] = b"index_to_nbme.json"
    return bytes(out)


def resized_locally(data: bytes) -> bytes:
    at = entry_offsets(data)["index_to_name.json"]
    out = bytearray(data)
    struct.pack_into("<I", out, at + 22, struct.unpack_from("<I", data, at + 22)[0] + 1)  # uncompressed size
    return bytes(out)


def stored_sizes_differ(data: bytes) -> bytes:
    """resnet18.pt is stored: both headers agree on a size other than the stored bytes' (Java refuses
    such an entry, zipfile reads it)."""
    at = entry_offsets(data)["resnet18.pt"]
    record = next(r for r in central(data)[2] if struct.unpack_from("<I", data, r + 42)[0] == at)
    out = bytearray(data)
    for where in (at + 22, record + 24):  # the uncompressed size, local and central
        struct.pack_into("<I", out, where, struct.unpack_from("<I", data, where)[0] - 1)
    return bytes(out)


def trailing(data: bytes) -> bytes:
    return data + b"trailing bytes"


def prefixed(data: bytes) -> bytes:
    return b"#!/bin/sh\nexit 0\n" + data  # zipfile reads a zip after a prefix; ZipInputStream does not


def gap(data: bytes) -> bytes:
    return insert(data, entry_offsets(data)["index_to_name.json"], b"\0" * 64)


def commented(data: bytes) -> bytes:
    out = bytearray(data[:-2] + struct.pack("<H", 5) + b"hello")
    return bytes(out)


MUTATIONS = {
    "hidden entry": (hidden_entry, HIDDEN),
    "duplicate name": (duplicate_name, "index_to_name.json"),
    "local name differs": (renamed_locally, "index_to_name.json"),
    "sizes differ": (resized_locally, "index_to_name.json"),
    "stored sizes differ": (stored_sizes_differ, "resnet18.pt"),
    "trailing bytes": (trailing, "end record"),
    "prefix bytes": (prefixed, "MAR-INF/tsctl.json"),
    "gap between entries": (gap, "index_to_name.json"),
    "comment": (commented, "end record"),
}


@pytest.fixture(scope="module")
def clean(image_sample, tmp_path_factory) -> Path:
    return package_resnet(image_sample, tmp_path_factory.mktemp("strict") / "model-store", name="strict")


def mutated(clean: Path, case: str, where: Path) -> Path:
    out = where / case.replace(" ", "-") / "strict.mar"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(MUTATIONS[case][0](clean.read_bytes()))
    return out


def refused_in_one_line(done: subprocess.CompletedProcess, words: str):
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert words in lines[0] and "disagree" in lines[0], lines[0]


@pytest.mark.parametrize("case", list(MUTATIONS))
def test_every_disagreement_is_refused_by_inspect_in_one_line_naming_the_entry(clean, case, tmp_path):
    archive = mutated(clean, case, tmp_path)
    with zipfile.ZipFile(archive) as z:  # zipfile alone opens every one of them
        assert "MAR-INF/MANIFEST.json" in z.namelist()
    refused_in_one_line(tsctl("inspect", archive), MUTATIONS[case][1])


def test_a_hidden_entry_is_refused_by_verify_run_and_the_engine(clean, image_sample, tmp_path):
    archive = mutated(clean, "hidden entry", tmp_path)
    refused_in_one_line(tsctl("verify", archive), HIDDEN)
    refused_in_one_line(tsctl("run", archive, image_sample / "kitten.jpg"), HIDDEN)
    store = tmp_path / "tree" / "model-store"
    store.mkdir(parents=True)
    (store / "strict.mar").write_bytes(archive.read_bytes())
    (store.parent / "config").mkdir()
    write_config(store.parent / "config" / "config.properties", {"strict": snapshot_entry("strict.mar", 1, 1, 0, 60)})
    engine = Engine(store.parent, "--enable_grpc", "false")
    try:
        assert engine.process.wait(60) == 2
    finally:
        engine.stop()
    refusals = [line for line in engine.output().splitlines() if line.startswith("tsctl engine:")]
    assert len(refusals) == 1 and HIDDEN in refusals[0] and "disagree" in refusals[0], engine.output()[-2000:]


def test_clean_archives_pass(clean, image_sample, tmp_path):
    archives.check_zip(clean)
    made = subprocess.run(
        [
            str(BIN / "torch-model-archiver"),
            "--model-name",
            "tma",
            "--version",
            "1.0",
            "--serialized-file",
            str(image_sample / "resnet18.pt"),
            "--model-file",
            str(image_sample / "model.py"),
            "--handler",
            "image_classifier",
            "--export-path",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    archives.check_zip(tmp_path / "tma.mar")
    with zipfile.ZipFile(tmp_path / "zip64.zip", "w") as z:  # mar.py writes entries of 4 GB and more so
        for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            info = zipfile.ZipInfo(f"weights-{method}.bin")
            info.compress_type = method
            with z.open(info, "w", force_zip64=True) as f:
                f.write(b"w" * 100_000)
    archives.check_zip(tmp_path / "zip64.zip")
    done = tsctl("inspect", tmp_path / "tma.mar")
    assert done.returncode == 0, done.stderr


class Unseekable(io.RawIOBase):
    """A pipe-like sink: zipfile writes data descriptors (flag bit 3) to it, as `zip -` or a jar tool does."""

    def __init__(self):
        self.data = bytearray()

    def writable(self):
        return True

    def write(self, b):
        self.data += b
        return len(b)


def with_descriptors(clean: Path) -> bytes:
    sink = Unseekable()
    with zipfile.ZipFile(clean) as src, zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    return bytes(sink.data)


def test_data_descriptors_pass_when_they_agree_and_are_refused_when_they_do_not(clean, tmp_path):
    data = with_descriptors(clean)
    archive = tmp_path / "described.mar"
    archive.write_bytes(data)
    with zipfile.ZipFile(archive) as z:
        info = z.getinfo("index_to_name.json")
        assert info.flag_bits & 8
    archives.check_zip(archive)
    descriptor = info.header_offset + 30 + len(info.filename) + info.compress_size
    assert data[descriptor : descriptor + 4] == b"PK\x07\x08"
    lying = bytearray(data)
    struct.pack_into("<I", lying, descriptor + 12, info.file_size + 1)
    archive.write_bytes(bytes(lying))
    with pytest.raises(archives.ArchiveError, match="index_to_name.json's data descriptor gives other sizes"):
        archives.check_zip(archive)


def test_a_deflate_stream_that_ends_early_is_refused(tmp_path):
    """ZipInputStream reads a data descriptor where the deflate stream ends, zipfile where the central
    directory says: an entry whose stream ends early would hide bytes from one of them."""
    sink = Unseekable()
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.txt", b"a" * 1000)
    data = bytes(sink.data)
    end, cd_offset, records = central(data)
    compressed = struct.unpack_from("<I", data, records[0] + 20)[0]
    start = 30 + len("a.txt")
    padded = insert(data, start + compressed, b"\0" * 16)  # the stream ends 16 bytes before the data does
    out = bytearray(padded)
    for where in (start + compressed + 16 + 8, central(padded)[2][0] + 20):  # descriptor, central record
        struct.pack_into("<I", out, where, compressed + 16)
    archive = tmp_path / "early.zip"
    archive.write_bytes(bytes(out))
    with pytest.raises(archives.ArchiveError, match="a.txt's compressed data does not end"):
        archives.check_zip(archive)


@pytest.mark.matrix
@pytest.mark.parametrize("layout", ["few big entries", "many small entries"])
def test_the_check_is_cheap_on_a_500_mb_archive(layout, tmp_path):
    archive = tmp_path / "big.mar"
    with zipfile.ZipFile(archive, "w") as z:
        if layout == "few big entries":
            block = os.urandom(4 << 20)  # incompressible: deflated entries stay as big
            for index, method in enumerate([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED] * 3):
                info = zipfile.ZipInfo(f"weights-{index}.bin")
                info.compress_type = method
                with z.open(info, "w") as f:
                    for _ in range(21):
                        f.write(block)
        else:
            payload = b"x" * 4096
            for index in range(125_000):
                z.writestr(f"files/{index:06d}.txt", payload)
    size = archive.stat().st_size
    started = time.perf_counter()
    archives.check_zip(archive)
    took = time.perf_counter() - started
    print(f"check_zip: {size / 1e6:.0f} MB, {layout}: {took * 1000:.0f} ms")
    assert size > 400e6 or layout == "many small entries"
    assert took < 5


def test_an_open_archive_is_checked_once_and_refused_when_written_over_while_open(tmp_path):
    """``Archive`` runs the check once, on the file it keeps open; a file written over in place after that
    (the check passed on other bytes) is refused, not read half old, half new."""
    path = tmp_path / "m.mar"
    manifest = b'{"model": {"modelName": "m", "handler": "h.py"}}'
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", manifest)
        z.writestr("h.py", "x = 1\n")
    with archives.Archive(path) as archive:
        assert archive.kind == "zip" and archive.model_name == "m"
        assert archive.read("h.py", 100) == b"x = 1\n"
        with open(path, "r+b") as f:
            f.write(f.read())  # the same bytes again, appended: another size, another ctime
        with pytest.raises(archives.ArchiveError, match="changed on disk while tsctl read it"):
            archive.read("h.py", 100)
        assert archive.manifest["model"]["modelName"] == "m"  # what was read stays readable


def test_an_open_archive_stays_readable_when_it_is_only_linked_elsewhere(tmp_path):
    """A hard link made to an open archive (``tsctl export`` links archives into its tree; ``cp -al``,
    ``rsync --link-dest`` backups) changes the file's ctime and link count, not its bytes: reading on
    is not refused as "changed on disk" (before the Archive object, every read opened the path again)."""
    path = tmp_path / "m.mar"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", b'{"model": {"modelName": "m", "handler": "h.py"}}')
        z.writestr("h.py", "x = 1\n")
    with archives.Archive(path) as archive:
        assert archive.model_name == "m"
        os.link(path, tmp_path / "exported.mar")
        assert archive.read("h.py", 100) == b"x = 1\n"
        (tmp_path / "exported.mar").unlink()
        assert archive.unpack(tmp_path / "unpacked") and (tmp_path / "unpacked" / "h.py").read_text() == "x = 1\n"
        with open(path, "r+b") as f:  # a write is still refused, whatever the link count did
            f.write(f.read())
        with pytest.raises(archives.ArchiveError, match="changed on disk while tsctl read it"):
            archive.read("h.py", 100)
