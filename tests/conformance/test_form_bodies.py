"""Form bodies (``curl -F data=@kitten.jpg``, ``curl -d data=4``): TorchServe's frontend hands each field to
the worker as a parameter of its own (serving/engine/form_bodies.py); the engine did not (the whole body was one
``body`` parameter, so ``row["data"]`` was None). A probe handler answers what each parameter held: the
engine alone in make test, and call for call against TorchServe 0.12 (make matrix)."""

import json
import time
import urllib.error
import urllib.request

import pytest
import urllib3

from archiver import properties
from helpers import side_by_side
from helpers.engine import Engine
from samples import ts_examples

HANDLER = ts_examples.STAND_INS / "form_probe" / "form_probe.py"
JPEG = bytes.fromhex("ffd8ffe0") + b"\r\n--not-a-boundary\r\n\x00\xff" * 50


def bodies() -> list:
    """(name, body, Content-Type) of each request."""
    files, kind = urllib3.encode_multipart_formdata([("data", ("k.jpg", JPEG, "image/jpeg")), ("note", "héllo")])
    plain, plain_kind = urllib3.encode_multipart_formdata([("data", "4"), ("other", "x y")])
    return [
        ("multipart file and field", files, kind),
        ("multipart fields", plain, plain_kind),
        ("urlencoded field", b"data=4&b=a+b%21", "application/x-www-form-urlencoded"),
        ("urlencoded bare value", b"1", "application/x-www-form-urlencoded"),
        ("raw body", b"1", "application/octet-stream"),
    ]


def root_with_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("forms")
    ts_examples.package(ts_examples.Example("forms", str(HANDLER), []), "torch-model-archiver", root / "model-store")
    properties.write_config(
        root / "model-store", root / "config" / "config.properties", extra={"disable_token_authorization": "true"}
    )
    return root


def answers(port: int) -> dict:
    got = {}
    for name, body, kind in bodies():
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/predictions/forms", data=body, method="POST", headers={"Content-Type": kind}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                got[name] = (answer.status, json.loads(answer.read()))
        except urllib.error.HTTPError as exc:
            got[name] = (exc.code, exc.read().decode()[:200])
    return got


def test_the_engine_hands_a_forms_fields_as_parameters(tmp_path_factory):
    root = root_with_store(tmp_path_factory)
    engine = Engine(root).wait_ready()
    try:
        got = answers(engine.http)
        many, kind = urllib3.encode_multipart_formdata([(f"f{i}", "x") for i in range(60_000)])  # 5 MB
        started = time.monotonic()
        refused = urllib.request.Request(f"{engine.url}/predictions/forms", data=many, headers={"Content-Type": kind})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(refused, timeout=60)
        assert caught.value.code == 400 and b"more than the 1000" in caught.value.read()
        assert time.monotonic() - started < 30  # parsed, it held the event loop 3.7 s (140 s with email's parser)
        assert answers(engine.http) == got  # and the engine serves on
    finally:
        assert engine.stop() == 0
    status, fields = got["multipart file and field"]
    assert status == 200 and fields["data"] == ["bytearray", JPEG.hex()], got
    assert got["urlencoded field"][1] == {"b": ["bytearray", b"a b!".hex()], "data": ["bytearray", b"4".hex()]}, got
    assert got["urlencoded bare value"] == (200, {}) and set(got["raw body"][1]) == {"body"}, got  # as Netty


@pytest.mark.matrix
def test_the_engine_hands_them_as_torchserve(tmp_path_factory):
    root = root_with_store(tmp_path_factory)
    with side_by_side.started(root, "tsf-") as (torchserve, engine):
        assert answers(side_by_side.http_port(torchserve)) == answers(engine.http)
