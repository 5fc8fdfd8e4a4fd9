"""Hostile inputs, made on the spot: what an attacker (or a broken client) sends a served model.

- ``seed_images()``: one small real file per format PIL writes and reads back (PNG, JPEG, GIF, TIFF,
  BMP, ICO, WebP, DDS, TGA, PPM, JPEG 2000, ...), plus the magic bytes of formats PIL only reads;
- ``resized(fmt, data, width, height)``: the same file with the size its header declares patched
  (1x9,000,000, 65535x65535, 0x0, ...) while the pixel data stays tiny;
- ``mutate(data, rng)``: truncations, bit flips, inserted and repeated chunks;
- ``image_corpus(good)`` / ``text_corpus()``: named attacks, each with the status it must get.

The tests send them through ``handle()`` in-process (tests/security/test_hostile.py) and through a served
model whose worker runs under a memory limit (tests/security/test_hostile_served.py); benchmarks/hostile_load.py
mixes them with good traffic from 64 clients.
"""

import base64
import io
import json
import random
import struct
import zlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from PIL import Image

# Formats PIL writes and reads back, with the mode each needs.
WRITABLE = {
    "BLP": "P",
    "BMP": "RGB",
    "DDS": "RGB",
    "DIB": "RGB",
    "GIF": "RGB",
    "ICNS": "RGB",
    "ICO": "RGB",
    "IM": "RGB",
    "JPEG": "RGB",
    "JPEG2000": "RGB",
    "MSP": "1",
    "PCX": "RGB",
    "PNG": "RGB",
    "PPM": "RGB",
    "QOI": "RGB",
    "SGI": "RGB",
    "SPIDER": "F",
    "TGA": "RGB",
    "TIFF": "RGB",
    "WEBP": "RGB",
    "XBM": "1",
    "EPS": "RGB",
    "AVIF": "RGB",
}
# Formats PIL only reads: their magic bytes, for the mutation fuzzer to grow bodies from.
READ_ONLY_MAGIC = {
    "PSD": b"8BPS\x00\x01\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x08\x00\x00\x00\x0c\x00\x08\x00\x03",
    "FITS": b"SIMPLE  =                    T" + b" " * 50,
    "SUN": b"\x59\xa6\x6a\x95\x00\x00\x00\x0c\x00\x00\x00\x08\x00\x00\x00\x18",
    "XPM": b'/* XPM */\nstatic char *x[] = {\n"12 8 1 1",\n',
    "CUR": b"\x00\x00\x02\x00\x01\x00",
    "DCX": b"\xb1\x68\xde\x3a",
    "GBR": b"\x00\x00\x00\x1c\x00\x00\x00\x02\x00\x00\x00\x0c\x00\x00\x00\x08\x00\x00\x00\x01GIMP",
    "FTEX": b"FTEX\x00\x00\x00\x00\x00\x00\x00\x0c\x00\x00\x00\x08",
    "XVTHUMB": b"P7 332\n#XVVERSION:\n#IMGINFO:\n#END_OF_COMMENTS\n12 8 255\n",
    "FLI": b"\x00\x00\x00\x00\x11\xaf",
    "PIXAR": b"\x80\xe8\x00\x00",
    "MCIDAS": b"\x00\x00\x00\x00\x00\x00\x00\x04",
    "WMF": b"\xd7\xcd\xc6\x9a\x00\x00",
}


def photo(width: int = 160, height: int = 120, seed: int = 0) -> Image.Image:
    rng = random.Random(seed)
    return Image.frombytes("RGB", (width, height), bytes(rng.getrandbits(8) for _ in range(width * height * 3)))


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def seed_images() -> Dict[str, bytes]:
    """One small real file per format PIL can write here (formats this Pillow lacks are left out)."""
    base = photo(24, 16)
    seeds = {}
    for fmt, mode in WRITABLE.items():
        image = base.convert(mode)
        if fmt == "ICNS":
            image = image.resize((16, 16))
        try:
            seeds[fmt] = encode(image, fmt)
        except (OSError, ValueError, KeyError):
            continue
    return seeds


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ---- sizes in headers -----------------------------------------------------------------------
def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_header(width: int, height: int, bit_depth: int = 8, color: int = 2, idat: bytes = b"") -> bytes:
    """A PNG whose IHDR says ``width`` x ``height``, with ``idat`` (default: none) as its data."""
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth, color, 0, 0, 0))
    data = png_chunk(b"IDAT", idat) if idat else b""
    return b"\x89PNG\r\n\x1a\n" + ihdr + data + png_chunk(b"IEND", b"")


def resized(fmt: str, data: bytes, width: int, height: int) -> bytes:
    """``data`` (a file of ``fmt``) with the size in its header replaced; the rest is kept."""
    b = bytearray(data)
    if fmt == "PNG":
        return png_header(width, height) + data[33:]
    if fmt in ("BMP", "DIB"):
        start = 14 if fmt == "BMP" else 0
        struct.pack_into("<ii", b, start + 4, _i32(width), _i32(height))
    elif fmt == "GIF":
        struct.pack_into("<HH", b, 6, width & 0xFFFF, height & 0xFFFF)
        descriptor = b.find(b"\x2c", 13)
        if descriptor > 0:
            struct.pack_into("<HH", b, descriptor + 5, width & 0xFFFF, height & 0xFFFF)
    elif fmt == "JPEG":
        for marker in (b"\xff\xc0", b"\xff\xc2"):
            at = b.find(marker)
            if at > 0:
                struct.pack_into(">HH", b, at + 5, height & 0xFFFF, width & 0xFFFF)
    elif fmt == "DDS":
        struct.pack_into("<II", b, 12, height & 0xFFFFFFFF, width & 0xFFFFFFFF)
    elif fmt == "TGA":
        struct.pack_into("<HH", b, 12, width & 0xFFFF, height & 0xFFFF)
    elif fmt == "PPM":
        body = data.split(b"\n", 3)[-1]
        return b"P6\n%d %d\n255\n" % (width, height) + body
    elif fmt == "TIFF":
        _tiff_size(b, width, height)
    elif fmt == "QOI":
        struct.pack_into(">II", b, 4, width & 0xFFFFFFFF, height & 0xFFFFFFFF)
    elif fmt == "SGI":
        struct.pack_into(">HH", b, 6, width & 0xFFFF, height & 0xFFFF)
    elif fmt == "PCX":
        struct.pack_into("<HHHH", b, 4, 0, 0, (width - 1) & 0xFFFF, (height - 1) & 0xFFFF)
    return bytes(b)


def _i32(value: int) -> int:
    return max(-(2**31), min(2**31 - 1, value))


def _tiff_size(b: bytearray, width: int, height: int):
    order = "<" if b[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(order + "I", b, 4)
    (count,) = struct.unpack_from(order + "H", b, ifd)
    for i in range(count):
        at = ifd + 2 + 12 * i
        tag, kind = struct.unpack_from(order + "HH", b, at)
        if tag in (256, 257):
            value = width if tag == 256 else height
            if kind == 3:
                struct.pack_into(order + "HHIH", b, at, tag, 3, 1, value & 0xFFFF)
            else:
                struct.pack_into(order + "HHII", b, at, tag, 4, 1, value & 0xFFFFFFFF)


def tiny_tall_tiff(width: int, height: int) -> bytes:
    """A few hundred bytes of TIFF declaring ``width`` x ``height`` (the 378 B 1x9,000,000 attack)."""
    return resized("TIFF", encode(Image.new("L", (1, 1)), "TIFF"), width, height)


# ---- mutations --------------------------------------------------------------------------------
def mutate(data: bytes, rng: random.Random, rounds: int = 3) -> bytes:
    b = bytearray(data)
    for _ in range(rounds):
        if not b:
            break
        op = rng.randrange(6)
        at = rng.randrange(len(b))
        if op == 0:
            del b[at:]
        elif op == 1:
            b[at] ^= 1 << rng.randrange(8)
        elif op == 2:
            b[at:at] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64)))
        elif op == 3:
            piece = b[at : at + rng.randrange(1, 256)]
            b[at:at] = piece * rng.randrange(1, 50)
        elif op == 4:
            b[at : at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\x7f\xff\xff\xff"])
        else:
            del b[at : at + rng.randrange(1, 64)]
    return bytes(b)


# ---- named corpora ----------------------------------------------------------------------------
ANY_4XX = "4xx"
ANSWER_OR_4XX = "200 or 4xx"  # a mutated file may still be a readable image


@dataclass
class Case:
    name: str
    body: bytes
    content_type: str
    status: Union[int, str]  # the exact status, ANY_4XX or ANSWER_OR_4XX
    words: Optional[str] = None  # in the error message; a 200 must be the in-process answer
    frontend: bool = False  # refused by TorchServe's frontend before a worker sees it (no JSON body)

    def accepts(self, status: int) -> bool:
        if self.status == ANY_4XX:
            return 400 <= status < 500
        if self.status == ANSWER_OR_4XX:
            return status == 200 or 400 <= status < 500
        return status == self.status


def deep_json(levels: int, inner: str = "1") -> bytes:
    return ("[" * levels + inner + "]" * levels).encode()


def png_text_bomb() -> bytes:
    """A valid 8x8 PNG with a zTXt chunk that inflates to 64 MB."""
    text = png_chunk(b"zTXt", b"Comment\x00\x00" + zlib.compress(b"\0" * (64 << 20), 9))
    good = encode(Image.new("RGB", (8, 8)), "PNG")
    return good[:33] + text + good[33:]


def image_corpus(good: bytes) -> List[Case]:
    """Attacks on an image model (default limits, batchSize 8: max_items 32); ``good`` is a JPEG."""
    seeds = seed_images()
    json_ = "application/json"
    v1 = lambda items: json.dumps({"instances": [{"b64": b64(i)} for i in items]}).encode()  # noqa: E731

    def v2(data, datatype="BYTES", shape=None):
        return json.dumps(
            {"inputs": [{"name": "i", "shape": shape or [len(data)], "datatype": datatype, "data": data}]}
        ).encode()

    tall_png = encode(Image.new("1", (1, 100_000)), "PNG")
    very_tall_png = encode(Image.new("L", (1, 9_000_000)), "PNG")
    wide_1e4 = encode(Image.new("1", (10_000, 1)), "PNG")
    tiny_jpeg = encode(Image.new("RGB", (2, 2)), "JPEG")
    huge_zero_png = encode(Image.new("L", (9000, 9000)), "PNG")
    sixteen_bit = encode(Image.new("I;16", (4000, 4000), 40000), "PNG")
    palette_alpha = encode(Image.new("P", (6000, 6000)), "PNG", transparency=0)
    zero_png = png_header(0, 0, idat=zlib.compress(b""))
    picture = photo()
    sixteen_small = Image.frombytes("I;16", (128, 96), bytes(range(256)) * 96)
    malformed = [
        Case("truncated JPEG", good[: len(good) // 3], "image/jpeg", 400, "could not decode image"),
        Case("PNG with a broken header", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "image/png", 400, "could not decode"),
        Case("zero bytes", b"", "image/jpeg", 400, "empty"),
        Case("0x0 PNG with data", zero_png, "image/png", 400, "image"),
        Case("text instead of an image", b"hello, I am not a picture", "text/plain", 400, "could not decode image"),
        Case("invalid base64", json.dumps({"data": "%%%not-base64"}).encode(), json_, 400, "not valid base64"),
        Case("JSON with a number for the image", b'{"data": 123}', json_, 400, "got int"),
        Case("JSON without an input field", b'{"picture": "x"}', json_, 400, "no input field"),
        Case("v1 instances not a list", b'{"instances": "x"}', json_, 400, "must be a list"),
        Case("v1 empty instances", b'{"instances": []}', json_, 400, "empty"),
        Case(
            "v1 with one bad instance",
            json.dumps({"instances": [{"data": b64(good)}, {"data": "!!"}]}).encode(),
            json_,
            400,
            "input 1: image is a string but not valid base64",
        ),
        Case("v2 wrong shape", v2([b64(good)], shape=[3]), json_, 400, "holds 3 values but 'data' has 1"),
        Case("empty JSON list", b"[]", json_, 400, "empty"),
        Case("JSON null", b"null", json_, 400, None),
        Case("1x1 image", encode(Image.new("RGB", (1, 1), (200, 10, 10)), "PNG"), "image/png", 200),
        Case("16-bit grayscale PNG", encode(sixteen_small, "PNG"), "image/png", 200),
        Case("CMYK JPEG", encode(picture.convert("CMYK"), "JPEG"), "image/jpeg", 200),
        Case("palette PNG", encode(picture.convert("P"), "PNG"), "image/png", 200),
        Case("RGBA PNG", encode(picture.convert("RGBA"), "PNG"), "image/png", 200),
        Case("grayscale JPEG", encode(picture.convert("L"), "JPEG"), "image/jpeg", 200),
    ]
    return (
        malformed
        + [
            Case(
                "JSON nested 100k deep, as octet-stream",
                deep_json(100_000),
                "application/octet-stream",
                413,
                "nested deeper",
            ),
            Case("JSON nested 100k deep, as application/json", deep_json(100_000), json_, 413, "nested deeper"),
            Case("JSON nested 990 deep (TorchServe parses it)", deep_json(990), json_, 413, "max_json_depth"),
            Case("object nested 5000 deep", b'{"data":' * 5000 + b"1" + b"}" * 5000, json_, 413, "nested deeper"),
            Case("PNG 1x9,000,000", very_tall_png, "image/png", 413, "max_aspect_ratio"),
            Case(
                "TIFF 1x9,000,000 in a few hundred bytes",
                tiny_tall_tiff(1, 9_000_000),
                "image/tiff",
                413,
                "max_aspect_ratio",
            ),
            Case("PNG 1x100,000", tall_png, "image/png", 413, "max_aspect_ratio"),
            Case("PNG header 65535x65535", png_header(65535, 65535), "image/png", 413, "max_pixels"),
            Case("PNG header 2^31-1 square", png_header(2**31 - 1, 2**31 - 1), "image/png", ANY_4XX),
            Case("PNG header 0x0", png_header(0, 0), "image/png", 400, None),
            Case("PNG header 100000x1 with no data", png_header(100_000, 1), "image/png", 413, "max_aspect_ratio"),
            Case(
                "GIF declaring 65535x65535", resized("GIF", seeds["GIF"], 65535, 65535), "image/gif", 413, "max_pixels"
            ),
            Case(
                "BMP declaring 2^31-1 by -2^31", resized("BMP", seeds["BMP"], 2**31 - 1, -(2**31)), "image/bmp", ANY_4XX
            ),
            Case(
                "JPEG declaring 65500x65500",
                resized("JPEG", seeds["JPEG"], 65500, 65500),
                "image/jpeg",
                413,
                "max_pixels",
            ),
            Case(
                "TGA declaring 65535x65535",
                resized("TGA", seeds["TGA"], 65535, 65535),
                "image/x-tga",
                413,
                "max_pixels",
            ),
            Case(
                "PPM declaring 1x9,000,000",
                resized("PPM", seeds["PPM"], 1, 9_000_000),
                "image/x-portable-pixmap",
                413,
                "max_aspect_ratio",
            ),
            Case("DDS, a format not accepted by default", seeds["DDS"], "image/vnd-ms.dds", 400, "does not accept"),
            Case("malformed DDS", resized("DDS", seeds["DDS"], 7, 3)[:200], "image/vnd-ms.dds", 400, None),
            Case("EPS (would run Ghostscript)", seeds["EPS"], "application/postscript", 400, "does not accept"),
            Case("truncated PNG", seeds["PNG"][:60], "image/png", 400, "could not decode image"),
            Case("truncated TIFF", seeds["TIFF"][:100], "image/tiff", 400, "could not decode image"),
            Case("PNG whose zTXt inflates to 64 MB", png_text_bomb(), "image/png", ANY_4XX),
            Case(
                "image above max_pixels (10000x10000)",
                encode(Image.new("1", (10000, 10000)), "PNG"),
                "image/png",
                413,
                "max_pixels",
            ),
            Case("v1 with 50 copies of a 1x10,000 PNG", v1([wide_1e4] * 50), json_, 413, "max_items"),
            Case("v1 with 20 copies of a 1x10,000 PNG", v1([wide_1e4] * 20), json_, 413, "input 0: image is 10000x1"),
            Case("v1 with 5,000 tiny JPEGs", v1([tiny_jpeg] * 5000), json_, 413, "max_items"),
            Case("v1 with 32 tiny JPEGs (the limit)", v1([tiny_jpeg] * 32), json_, 200, None),
            Case(
                "v1 with three 9000x9000 PNGs (pixels per request)",
                v1([huge_zero_png] * 3),
                json_,
                413,
                "max_request_pixels",
            ),
            Case("60 MB JSON list of zeros", b"[" + b"0," * 30_000_000 + b"0]", json_, 413, "max_body_bytes"),
            Case(
                "JSON object of 200,000 keys",
                json.dumps({f"k{i}": 0 for i in range(200_000)}).encode(),
                json_,
                413,
                "max_json_values",
            ),
            Case("v2 BYTES with 5,000 elements", v2([b64(tiny_jpeg)] * 5000), json_, 413, "max_items"),
            Case("v2 shape of 10^12 with one element", v2(["x"], shape=[10**12]), json_, 400, "holds"),
            Case("v2 FP32 to an image model", v2([1.0, 2.0], "FP32"), json_, 400, "not supported"),
            Case("v2 with nested data 40 deep", v2(json.loads(deep_json(40, '"x"'))), json_, 413, "max_json_depth"),
            Case(
                "base64 holding random bytes",
                json.dumps({"data": b64(random.Random(1).randbytes(5000))}).encode(),
                json_,
                400,
                "could not decode image",
            ),
            Case("lone surrogate in a JSON string", b'{"data": "\\ud800\\udfff\\ud800"}', json_, 400, None),
            Case("JSON with NaN and Infinity", b'{"data": [NaN, Infinity]}', json_, 400, None),
            Case("invalid UTF-8 sent as JSON", b'{"data": "\xff\xfe"}', json_, 400, None),
            Case(
                "70 MB body (above max_request_size)",
                b"\0" * (70 << 20),
                "application/octet-stream",
                413,
                frontend=True,
            ),
            Case("9000x9000 grayscale PNG (valid, near max_pixels)", huge_zero_png, "image/png", 200, None),
            Case("4000x4000 16-bit PNG (valid)", sixteen_bit, "image/png", 200, None),
            Case("6000x6000 palette PNG with transparency (valid)", palette_alpha, "image/png", 200, None),
            Case("valid GIF", seeds["GIF"], "image/gif", 200, None),
            Case("valid WebP", seeds["WEBP"], "image/webp", 200, None),
            Case("valid ICO", seeds["ICO"], "image/x-icon", 200, None),
        ]
        + [
            Case(f"mutated {fmt} #{i}", mutate(seeds[fmt], random.Random(i)), "application/octet-stream", ANSWER_OR_4XX)
            for i, fmt in enumerate(("PNG", "JPEG", "GIF", "TIFF", "BMP", "WEBP", "ICO", "TGA"))
        ]
    )


def text_corpus() -> List[Case]:
    """Attacks on a text model (default limits, batchSize 8: max_items 32)."""
    json_ = "application/json"
    return [
        Case("empty text", b"", "text/plain", 400, "empty"),
        Case("only spaces", b"     ", "text/plain", 400, "empty"),
        Case("a number for text", b'{"text": 5}', json_, 400, "must be a string, got int"),
        Case("an empty text list", b'{"text": []}', json_, 400, "empty"),
        Case("nested lists", b'[["a"]]', json_, 400, "must be a string, got list"),
        Case("100 kB of text (the limit)", ("word " * 20000).encode(), "text/plain", 200),
        Case("100,001 characters", b"a" * 100_001, "text/plain", 413, "max_text_chars"),
        Case("10 MB of text", ("word " * 2_000_000).encode(), "text/plain", 413, "max_text_chars"),
        Case("text wrapped 1000 deep", b'{"text":' * 1000 + b'"x"' + b"}" * 1000, json_, 413, "nested"),
        Case("5,000 texts in one request", json.dumps(["hi"] * 5000).encode(), json_, 413, "max_items"),
        Case("invalid UTF-8", b"\xff\xfe\xfa", "application/octet-stream", 400, "UTF-8"),
        Case("lone surrogates", b'{"text": "\\ud800 x"}', json_, ANSWER_OR_4XX),
        Case("50,000 combining marks", ("a" + "\u0301" * 50_000).encode(), "text/plain", 200, None),
        Case("one 90,000-character word", b"x" * 90_000, "text/plain", 200, None),
        Case(
            "v2 BYTES holding numbers",
            b'{"inputs":[{"name":"t","shape":[2],"datatype":"BYTES","data":[1,2]}]}',
            json_,
            400,
            "must be a string",
        ),
        Case("32 texts (the limit)", json.dumps(["a fine sentence"] * 32).encode(), json_, 200, None),
    ]


def extreme_sizes() -> List[Tuple[int, int]]:
    return [
        (0, 0),
        (1, 0),
        (1, 1),
        (1, 9_000_000),
        (9_000_000, 1),
        (65535, 65535),
        (1, 100_000),
        (2**31 - 1, 1),
        (50_000, 50_000),
        (9000, 9000),
        (16383, 16383),
        (300, 2),
    ]
