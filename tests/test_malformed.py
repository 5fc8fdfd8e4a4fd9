"""A corpus of malformed and odd inputs, each sent inside a batch with valid neighbours, on the real
TorchServe: every bad one gets a 4xx JSON error naming the problem (odd-but-valid images get an
answer), every neighbour its correct answer, and no worker restarts."""

import base64
import io
import json
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from conftest import RunningServer, batch_lines, package_resnet, package_text, post_mixed_concurrently, workers
from handlers.testing import LocalModel

BATCHING = "batchSize: 8\nmaxBatchDelay: 300\n"


def png(image: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG", **options)
    return out.getvalue()


def jpeg(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG")
    return out.getvalue()


def zero_size_png() -> bytes:
    """A PNG whose header says 0x0 (PIL cannot write one)."""
    header = struct.pack(">IIBBBBB", 0, 0, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    ihdr = struct.pack(">I", len(header)) + chunk + struct.pack(">I", zlib.crc32(chunk))
    end = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    return b"\x89PNG\r\n\x1a\n" + ihdr + end


def photo() -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image_corpus():
    """(name, body, content type, expected status, words in the error message)."""
    good = jpeg(photo())
    sixteen = Image.fromarray((np.linspace(0, 65535, 96 * 128).reshape(96, 128)).astype(np.uint16))
    v2 = lambda datatype, shape, data: json.dumps(  # noqa: E731
        {"inputs": [{"name": "i", "shape": shape, "datatype": datatype, "data": data}]}
    ).encode()
    return [
        ("truncated JPEG", good[: len(good) // 3], "image/jpeg", 400, "could not decode image"),
        ("PNG with a broken header", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "image/png", 400, "could not decode image"),
        ("zero bytes", b"", "image/jpeg", 400, "empty"),
        ("0x0 PNG", zero_size_png(), "image/png", 400, "image"),
        ("text instead of an image", b"hello, I am not a picture", "text/plain", 400, "not valid base64"),
        ("decompression bomb", png(Image.new("1", (10000, 10000))), "image/png", 413, "above the limit"),
        ("invalid base64", json.dumps({"data": "%%%not-base64"}).encode(), "application/json", 400, "not valid base64"),
        (
            "base64 of garbage",
            json.dumps({"data": b64(b"garbage")}).encode(),
            "application/json",
            400,
            "could not decode",
        ),
        ("JSON with a number for the image", b'{"data": 123}', "application/json", 400, "got int"),
        ("JSON without an input field", b'{"picture": "x"}', "application/json", 400, "no input field"),
        ("v1 instances not a list", b'{"instances": "x"}', "application/json", 400, "must be a list"),
        ("v1 empty instances", b'{"instances": []}', "application/json", 400, "empty"),
        (
            "v1 with one bad instance",
            json.dumps({"instances": [{"data": b64(good)}, {"data": "!!"}]}).encode(),
            "application/json",
            400,
            "input 1: image is a string but not valid base64",
        ),
        ("v2 wrong datatype", v2("FP32", [1], [1.0]), "application/json", 400, "datatype 'FP32' is not supported"),
        ("v2 wrong shape", v2("BYTES", [3], [b64(good)]), "application/json", 400, "holds 3 values but 'data' has 1"),
        ("empty JSON list", b"[]", "application/json", 400, "empty"),
        ("JSON null", b"null", "application/json", 400, "no body"),
        ("1x1 image", png(Image.new("RGB", (1, 1), (200, 10, 10))), "image/png", 200, None),
        ("16-bit grayscale PNG", png(sixteen), "image/png", 200, None),
        ("CMYK JPEG", jpeg(photo().convert("CMYK")), "image/jpeg", 200, None),
        ("palette PNG", png(photo().convert("P")), "image/png", 200, None),
        ("RGBA PNG", png(photo().convert("RGBA")), "image/png", 200, None),
        ("grayscale JPEG", jpeg(photo().convert("L")), "image/jpeg", 200, None),
        ("GIF", (lambda o: (photo().save(o, "GIF"), o.getvalue())[1])(io.BytesIO()), "image/gif", 200, None),
    ]


def text_corpus():
    return [
        ("invalid UTF-8", b"\xff\xfe\xfa broken", "application/octet-stream", 400, "not valid UTF-8"),
        ("empty text", b"", "text/plain", 400, "empty"),
        ("only spaces", b"     ", "text/plain", 400, "empty"),
        ("a number for text", b'{"text": 5}', "application/json", 400, "must be a string, got int"),
        ("an empty text list", b'{"text": []}', "application/json", 400, "empty"),
        ("nested lists", b'[["a"]]', "application/json", 400, "must be a string, got list"),
        (
            "v2 BYTES holding a number",
            b'{"inputs":[{"name":"t","shape":[1],"datatype":"BYTES","data":[7]}]}',
            "application/json",
            400,
            "must be a string",
        ),
        ("100 kB of text", ("word " * 20000).encode(), "text/plain", 200, None),
    ]


@pytest.fixture(scope="module")
def srv(image_sample, text_samples, tmp_path_factory):
    store = tmp_path_factory.mktemp("malformed") / "model-store"
    package_resnet(image_sample, store, config_text=BATCHING)
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier", BATCHING)
    with RunningServer(store) as running:
        running.store = store
        yield running


def run_corpus(srv, model, corpus, good, good_type):
    """Send the corpus in groups of four, each group alongside four valid requests, all at once.
    Odd-but-valid inputs must get the answer the same archive gives in-process."""
    before = workers(srv, model)
    rejected_in_shared_batch = False
    with LocalModel(srv.store / f"{model}.mar") as local:
        [expected] = [r.json() for r in local.predict([good])]
        for start in range(0, len(corpus), 4):
            group = corpus[start : start + 4]
            bodies = [(good, good_type)] * 4 + [(body, ctype) for _, body, ctype, _, _ in group]
            results = post_mixed_concurrently(srv, f"/predictions/{model}", bodies)
            for status, body in results[:4]:
                assert status == 200, body
                assert_same(body, expected)
            for (name, sent, _, want, words), (status, body) in zip(group, results[4:]):
                assert status == want, f"{name}: {status} {body}"
                if words is not None:
                    assert body["code"] == want and words in body["message"], f"{name}: {body}"
                else:
                    assert_same(body, local.predict([sent])[0].json())
            lines = batch_lines(srv)
            rejected_in_shared_batch |= any(line["rejected"] and line["size"] > line["rejected"] for line in lines)
    assert rejected_in_shared_batch, "no bad input shared a batch with valid ones"
    assert workers(srv, model) == before, "a worker restarted"


def assert_same(served: dict, expected: dict):
    assert list(served) == list(expected)
    assert list(served.values()) == pytest.approx(list(expected.values()), rel=1e-4, abs=1e-6)


def test_image_corpus(srv):
    corpus = image_corpus()
    assert len(corpus) >= 20
    run_corpus(srv, "resnet18", corpus, jpeg(photo()), "image/jpeg")


def test_text_corpus(srv):
    run_corpus(srv, "sentiment", text_corpus(), b"a perfectly normal sentence", "text/plain")


def test_corpus_is_large_enough():
    assert len(image_corpus()) + len(text_corpus()) >= 20
