"""The Content-Type tsctl sends a file with (predict, run, bench, --golden) does not depend on the machine's
mime.types: the image formats the image handler opens have their image type even with Python's own table
alone, where .webp is missing before Python 3.13 (slim containers have no /etc/mime.types)."""

import base64
import glob
import http.server
import json
import mimetypes
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver import engines, server
from archiver.cli import main
from handlers import archives, protocol
from handlers import golden as golden_format
from helpers.servers import stand_in_http

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {
    ".bmp": "image/bmp",
    ".webp": "image/webp",
    ".gif": "image/gif",
    ".tif": "image/tiff",
    ".tiff": "image/tiff",
    ".jpg": "image/jpeg",
    ".JPEG": "image/jpeg",
    ".png": "image/png",
}
OTHERS = {
    ".txt": "text/plain",
    ".json": "application/json",
    ".npy": "application/octet-stream",
    "": protocol.OCTET_STREAM,
}


@pytest.fixture
def no_system_mime_types(monkeypatch):
    """mimetypes with Python's built-in table only, as where no mime.types file exists."""
    monkeypatch.setattr(mimetypes, "_db", mimetypes.MimeTypes(filenames=()))


def test_image_files_have_image_types_without_a_system_table(no_system_mime_types):
    for suffix, kind in {**IMAGES, **OTHERS}.items():
        assert protocol.content_type(f"dir.d/input{suffix}") == kind, suffix


def test_predict_sends_the_image_type(no_system_mime_types, tmp_path):
    """tsctl predict's request, as a server receives it."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.headers["Content-Type"])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

    with stand_in_http(Handler) as address:
        running = server.Server(os.getpid(), str(tmp_path), address, address, address, ["m"])
        for suffix in IMAGES:
            image = tmp_path / f"cat{suffix}"
            image.write_bytes(b"not decoded here")
            assert engines.predict(running, "m", image) == (200, {})
    assert seen == list(IMAGES.values())


def test_predict_sends_the_content_type_given(tmp_path):
    """``tsctl predict --content-type``: the file's bytes with that type, not its suffix's; to MLServer one
    BYTES element carrying it as ``content_type`` (text as it is, other types in base64), a .json file
    too, which without the option is sent as the v2 request itself."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((self.path, self.headers["Content-Type"], self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

    text, document = tmp_path / "row.txt", tmp_path / "request.json"
    text.write_bytes(b"6.1,2.8,4.7,1.2\n")
    document.write_bytes(b'{"inputs": []}')
    with stand_in_http(Handler) as address:
        torchserve = server.Server(os.getpid(), str(tmp_path), address, address, address, ["m"])
        mlserver = server.Server(os.getpid(), str(tmp_path), address, "", address, ["m"], engine="mlserver")
        engines.predict(torchserve, "m", text)
        engines.predict(torchserve, "m", text, kind="application/octet-stream")
        engines.predict(mlserver, "m", text)
        engines.predict(mlserver, "m", text, kind="application/octet-stream")
        engines.predict(mlserver, "m", document)
        engines.predict(mlserver, "m", document, kind="application/json; charset=utf-8")
        engines.predict(torchserve, "m", text, kind="")  # none, as curl -T sends a file
        engines.predict(mlserver, "m", text, kind="")
    assert seen[:2] + seen[6:7] == [
        ("/predictions/m", "text/plain", text.read_bytes()),
        ("/predictions/m", "application/octet-stream", text.read_bytes()),
        ("/predictions/m", None, text.read_bytes()),
    ]
    tensors = [json.loads(body)["inputs"] for _, _, body in seen[2:6] + seen[7:]]
    element = {"name": "input-0", "shape": [1], "datatype": "BYTES"}
    assert tensors == [
        [{**element, "data": ["6.1,2.8,4.7,1.2\n"], "parameters": {"content_type": "text/plain"}}],
        [{**element, "data": ["Ni4xLDIuOCw0LjcsMS4yCg=="], "parameters": {"content_type": "application/octet-stream"}}],
        [],  # the file itself: a v2 request
        [{**element, "data": ['{"inputs": []}'], "parameters": {"content_type": "application/json"}}],
        [{**element, "data": ["Ni4xLDIuOCw0LjcsMS4yCg=="], "parameters": {"content_type": "base64"}}],  # bytes
    ]
    assert {(path, kind) for path, kind, _ in seen[2:6] + seen[7:]} == {("/v2/models/m/infer", "application/json")}
    for command in (["predict", "m"], ["run", "m.mar"]):  # one option: its check too
        refused = CliRunner().invoke(main, [*command, str(text), "--content-type", "json"])
        assert refused.exit_code == 2 and "'json' is not a media type" in refused.output, refused.output


def test_one_content_type_option_for_predict_run_and_golden():
    """predict, run and package --golden say the same of what each type makes the handler receive."""
    helps = {
        command: CliRunner().invoke(main, [command, "--help"], terminal_width=1000).output
        for command in ("predict", "run", "package")
    }
    said = "application/json -> the decoded JSON (a dict, a list...); text/... -> a str; any other type, or none"
    assert all(" ".join(text.split()).count(said) == 1 for text in helps.values()), helps


@pytest.fixture(scope="module")
def body_probe(tmp_path_factory) -> Path:
    """pytorch/serve's way of handing bodies, answered back: the conformance suite's body_probe stand-in."""
    from samples import ts_examples, ts_probes

    out = tmp_path_factory.mktemp("probe")
    return ts_examples.package(ts_probes.build_body_probe(out), "tsctl", out / "store")


def test_run_sends_each_file_as_the_content_type_given(body_probe, tmp_path):
    """``tsctl run --content-type ''``: a .txt without a Content-Type, as curl -T sends it: a handler that
    is not the toolkit's receives the bytes, not the str its suffix's text/plain gives (about 3 s;
    tests/conformance/test_body_decoding.py has every type, on every runtime)."""
    rows = tmp_path / "rows.txt"
    rows.write_bytes(b"a,b\n1,2\n")
    done = CliRunner().invoke(main, ["run", "--json", "--content-type", "", str(body_probe), str(rows)])
    assert done.exit_code == 0, done.output
    [result] = json.loads(done.stdout)["results"]
    assert result["status"] == 200 and result["answer"]["type"] == "bytearray", result
    assert base64.b64decode(result["answer"]["value"]) == rows.read_bytes(), result


def pythons():
    """Python 3.9 to 3.13 where pyenv has them (their built-in tables differ)."""
    found = []
    for minor in range(9, 14):
        versions = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/3.{minor}.*/bin/python3.{minor}")))
        if versions:
            found.append(pytest.param(versions[-1], id=f"3.{minor}"))
    return found or [pytest.param(None, marks=pytest.mark.skip(reason="no pyenv Pythons 3.9-3.13 here"))]


@pytest.mark.parametrize("python", pythons())
def test_every_supported_pythons_own_table_gives_the_same_types(python):
    code = (
        "import mimetypes; mimetypes.knownfiles[:] = []\n"
        "from handlers.protocol import content_type\n"
        f"print([content_type('x' + s) for s in {list(IMAGES)!r}])"
    )
    done = subprocess.run([python, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(list(IMAGES.values()))


def test_package_golden_records_the_content_type_given(tmp_path):
    """``package --golden DIR --golden-content-type ''``: each file recorded as sent without a type (the
    handler got the bytes), and ``verify`` replays it so (about 6 s: two loads); a JSON list of bodies and
    a package without --golden are refused."""
    from samples import ts_probes

    golden = tmp_path / "golden"
    golden.mkdir()
    (golden / "rows.txt").write_bytes(b"a,b\n1,2\n")
    flags = ts_probes.build_body_probe(tmp_path / "probe").flags("tsctl") + ["--export-path", str(tmp_path)]
    done = CliRunner().invoke(main, ["package", *flags, "--golden", str(golden), "--golden-content-type", "", "--json"])
    assert done.exit_code == 0, done.output
    archive = tmp_path / "body_probe.mar"
    with archives.opened(archive) as found:
        [case] = golden_format.read(found)["cases"]
    assert (case["content_type"], case["answer"]["type"]) == ("", "bytearray"), case
    verified = CliRunner().invoke(main, ["verify", str(archive)])
    assert verified.exit_code == 0 and "1 of 1 golden answers match" in verified.output, verified.output
    listed = tmp_path / "bodies.json"
    listed.write_text('[{"a": 1}]')
    for given in (["--golden", str(listed)], []):
        refused = CliRunner().invoke(main, ["package", *flags, *given, "--golden-content-type", "text/plain", "-f"])
        assert refused.exit_code == 2 and "--golden-content-type" in refused.output, refused.output
