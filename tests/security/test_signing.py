"""Signed archives (issue #21): ``tsctl package --sign-key`` signs every file in the OpenSSF
model-signing format, ``tsctl verify --public-key`` checks it, and what serves an archive refuses
one whose signature is missing or does not match, naming the first file that differs: the tsctl
engine (``--public_key``, before any of the archive's code runs), ``LocalModel``/``tsctl run``, and
toolkit handlers on TorchServe (``TSCTL_PUBLIC_KEY``). A signed archive still serves on stock
TorchServe, and model-signing's own CLI verifies it unpacked.
"""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from handlers.signing import SignatureError
from helpers.engine import Engine, snapshot_entry, write_config
from helpers.models import package_resnet
from helpers.paths import short_tmp
from helpers.servers import RunningServer, post
from serving.local_model import LocalModel

BIN = Path(sys.executable).parent


def key_pair(where: Path, name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = where / f"{name}.pem", where / f"{name}.pub.pem"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public


@pytest.fixture(scope="module")
def signed(image_sample, tmp_path_factory):
    """A key pair, another public key, and resnet18 signed (with golden answers) and unsigned."""
    root = tmp_path_factory.mktemp("signing")
    private, public = key_pair(root, "signer")
    _, other = key_pair(root, "other")
    store = root / "model-store"
    golden = root / "golden"
    golden.mkdir()
    (golden / "kitten.jpg").write_bytes((image_sample / "kitten.jpg").read_bytes())
    done = subprocess.run(
        [
            str(BIN / "tsctl"),
            "package",
            "--model-name",
            "signed",
            "--serialized-file",
            str(image_sample / "resnet18.pt"),
            "--model-file",
            str(image_sample / "model.py"),
            "--handler",
            "image_classifier",
            "--extra-files",
            str(image_sample / "index_to_name.json"),
            "--export-path",
            str(store),
            "--golden",
            str(golden),
            "--sign-key",
            str(private),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    unsigned = package_resnet(image_sample, root / "unsigned-store", name="unsigned")
    return {"root": root, "public": public, "other": other, "archive": store / "signed.mar", "unsigned": unsigned}


def tampered(archive: Path, entry: str) -> Path:
    out = archive.parent.parent / f"tampered-{entry.replace('/', '_')}" / archive.name
    out.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == entry and entry.endswith(".json"):  # still JSON: another value
                data = data.replace(b'"1.0"', b'"6.6"', 1) if b'"1.0"' in data else data.replace(b"class_", b"klass", 1)
            elif item.filename == entry:
                data = data[:-1] + bytes([data[-1] ^ 1])
            dst.writestr(item, data)
    return out


def tsctl(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "tsctl"), *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.mark.matrix  # 18 s; make test: the engine serving signed archives, verify refusing tampered ones
def test_verify_checks_the_signature_then_the_golden_answers(signed):
    done = tsctl("verify", signed["archive"], "--public-key", signed["public"])
    assert done.returncode == 0, done.stderr
    assert "signature verified" in done.stdout and "1 of 1 golden answers match" in done.stdout


@pytest.mark.parametrize(
    "case, words",
    [
        ("weights", "resnet18.pt differs from what was signed"),
        ("manifest", "MAR-INF/MANIFEST.json differs from what was signed"),
        ("other key", "signed with another key than the one given (signed by sha256:"),
        ("unsigned", "is not signed"),
    ],
)
def test_a_tampered_unsigned_or_foreign_archive_is_refused_in_one_line(signed, case, words):
    archive, key = signed["archive"], signed["public"]
    if case == "weights":
        archive = tampered(archive, "resnet18.pt")
    elif case == "manifest":
        archive = tampered(archive, "MAR-INF/MANIFEST.json")
    elif case == "other key":
        key = signed["other"]
    elif case == "unsigned":
        archive = signed["unsigned"]
    done = tsctl("verify", archive, "--public-key", key)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert words in done.stderr and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    with pytest.raises(SignatureError, match=re.escape(words)):
        LocalModel(archive, public_key=str(key))


def test_model_signing_cli_verifies_the_unpacked_archive(signed, tmp_path):
    with zipfile.ZipFile(signed["archive"]) as archive:
        archive.extractall(tmp_path)
    cli = BIN / "model_signing"
    done = subprocess.run(
        [
            str(cli),
            "verify",
            "key",
            str(tmp_path),
            "--signature",
            str(tmp_path / "MAR-INF" / "model.sig"),
            "--public_key",
            str(signed["public"]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "Verification succeeded" in done.stdout + done.stderr, done.stderr


def test_toolkit_handlers_check_themselves_under_tsctl_public_key(signed, monkeypatch):
    """On TorchServe the worker runs the archive's handler first; a toolkit handler checks its own
    archive in initialize when the worker's environment names a key."""
    monkeypatch.setenv("TSCTL_PUBLIC_KEY", str(signed["public"]))
    with LocalModel(signed["archive"]) as model:
        assert model.predict([b"not an image"])[0].status == 400  # loaded, answering
    with pytest.raises(Exception, match="differs from what was signed"):
        LocalModel(tampered(signed["archive"], "index_to_name.json"))


def test_the_engine_serves_signed_archives_and_refuses_the_rest(signed, image_sample, tmp_path):
    root = tmp_path / "tree"
    store = root / "model-store"
    store.mkdir(parents=True)
    (store / "signed.mar").write_bytes(signed["archive"].read_bytes())
    (root / "config").mkdir()
    write_config(root / "config" / "config.properties", {"signed": snapshot_entry("signed.mar", 1, 1, 0, 120)})
    engine = Engine(root, "--public_key", str(signed["public"]), "--enable_grpc", "false").wait_ready()
    try:
        status, body = engine.post("/predictions/signed", (image_sample / "kitten.jpg").read_bytes(), "image/jpeg")
        assert status == 200, body
    finally:
        assert engine.stop() == 0
    (store / "signed.mar").write_bytes(tampered(signed["archive"], "resnet18.pt").read_bytes())
    refused = Engine(root, "--public_key", str(signed["public"]), "--enable_grpc", "false")
    assert refused.process.wait(60) == 1
    assert "resnet18.pt differs from what was signed" in refused.output(), refused.output()[-2000:]
    # tsctl serve --public-key: the engine checks every archive (its --public_key from TSCTL_PUBLIC_KEY)
    home, config = short_tmp("signed-serve-"), root / "config" / "config.properties"
    serve = ["serve", "--engine", "tsctl", "--config", config, "--model-store", store, "--home", home]
    try:
        done = tsctl(*serve, "--public-key", signed["public"], "--timeout", "120")
        assert done.returncode == 1 and "resnet18.pt differs from what was signed" in done.stderr, done.stderr
        private = signed["root"] / "signer.pem"
        done = tsctl(*serve, "--public-key", private)  # refused before anything starts
        assert done.returncode == 2 and "is a private key: give its public half" in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
    finally:
        tsctl("stop", "--home", home)


@pytest.mark.matrix  # 10 s; make test serves signed archives on the engine and tsctl archives on TorchServe
def test_a_signed_archive_serves_on_torchserve_as_an_unsigned_one(signed, image_sample, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "signed.mar").write_bytes(signed["archive"].read_bytes())
    kitten = (image_sample / "kitten.jpg").read_bytes()
    with LocalModel(signed["unsigned"]) as model:
        expected = model.predict([kitten])[0].json()
    with RunningServer(store, env={**os.environ, "TSCTL_PUBLIC_KEY": str(signed["public"])}) as srv:
        status, body = post(srv, "signed", kitten, "image/jpeg")
    assert status == 200 and body.keys() == expected.keys(), body


def test_a_mismatch_message_in_any_quoting_names_the_file():
    """model-signing's message may be a list's repr whose quotes are escaped (a hash's bytes held a quote)."""
    from handlers.signing import difference

    escaped = "Signature mismatch: ['Hash mismatch for \\'MAR-INF/MANIFEST.json\\': value=b\\'\\\\xc8\"\\']"
    plain = "Hash mismatch for 'resnet18.pt': Expected b'...'"
    assert difference(escaped).startswith("MAR-INF/MANIFEST.json differs from what was signed")
    assert difference(plain).startswith("resnet18.pt differs from what was signed")


# ---- issue #29: what a signature binds, the key files, who signed ------------------------------------
def test_a_hidden_zip_entry_in_a_signed_archive_is_refused(signed, tmp_path):
    """The reproduction: one more local entry the central directory does not list passed verify
    ("every file is as signed") while TorchServe's ZipInputStream unpacked it (test_archive_strictness.py)."""
    from helpers.zips import HIDDEN, hidden_entry

    archive = tmp_path / "signed.mar"
    archive.write_bytes(hidden_entry(signed["archive"].read_bytes()))
    done = tsctl("verify", archive, "--public-key", signed["public"])
    assert done.returncode == 2 and "every file is as signed" not in done.stdout, (done.stdout, done.stderr)
    assert HIDDEN in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


@pytest.fixture(scope="module")
def versions(signed, image_sample, tmp_path_factory):
    """Versions 1.0 and 2.0 of one model signed with one key, and a store whose signed.mar is v2's file
    with v1 copied over it."""
    root = tmp_path_factory.mktemp("versions")
    private = signed["root"] / "signer.pem"
    v1 = package_resnet(image_sample, root / "v1", name="signed", version="1.0", sign_key=str(private))
    v2 = package_resnet(image_sample, root / "v2", name="signed", version="2.0", sign_key=str(private))
    store = root / "tree" / "model-store"
    store.mkdir(parents=True)
    (store / "signed.mar").write_bytes(v1.read_bytes())  # copied over v2's file
    return {"v1": v1, "v2": v2, "store": store}


def test_an_older_version_copied_over_the_current_one_is_refused(signed, versions):
    key = signed["public"]
    replayed = versions["store"] / "signed.mar"
    done = tsctl("verify", versions["v2"], "--public-key", key, "--expect-version", "2.0")
    assert done.returncode == 0 and "as signed version 2.0" in done.stdout, done.stderr
    done = tsctl("verify", replayed, "--public-key", key, "--expect-version", "2.0")
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, (done.stdout, done.stderr)
    assert (
        "signed.mar is signed as signed version 1.0, expected signed version 2.0: an older archive was copied over it?"
        in done.stderr
    )
    done = tsctl("verify", replayed, "--public-key", key)  # no expected version: says what is signed
    assert done.returncode == 0 and "as signed version 1.0 by key sha256:" in done.stdout, done.stderr
    renamed = versions["store"].parent / "other.mar"
    renamed.write_bytes(replayed.read_bytes())  # another model's file: the name is its stem
    done = tsctl("verify", renamed, "--public-key", key)
    assert done.returncode == 1 and "is signed as model signed, expected other:" in done.stderr, done.stderr
    assert "give --expect-name signed" in done.stderr  # a renamed archive: the way to say so
    done = tsctl("verify", replayed, "--expect-version", "2.0")  # which checks nothing without a key
    assert done.returncode == 2 and "give --public-key too" in done.stderr, done.stderr
    with pytest.raises(SignatureError, match="expected signed version 2.0"):
        LocalModel(replayed, public_key=str(key), expected=("signed", "2.0"))


def test_the_engine_refuses_an_archive_signed_as_another_version_than_its_snapshot(signed, versions):
    root = versions["store"].parent
    (root / "config").mkdir(exist_ok=True)
    entry = snapshot_entry("signed.mar", 1, 1, 0, 60)["1.0"]
    write_config(root / "config" / "config.properties", {"signed": {"2.0": entry}})
    engine = Engine(root, "--public_key", str(signed["public"]), "--enable_grpc", "false")
    try:
        assert engine.process.wait(60) == 1
    finally:
        engine.stop()
    refusals = [line for line in engine.output().splitlines() if line.startswith("tsctl engine:")]
    assert len(refusals) == 1, engine.output()[-2000:]
    assert "signed.mar is signed as signed version 1.0, expected signed version 2.0" in refusals[0]


def test_a_private_key_or_another_file_given_as_the_public_key_is_one_line(signed, image_sample, tmp_path):
    private = signed["root"] / "signer.pem"
    not_a_key = image_sample / "index_to_name.json"
    cases = [
        (private, f"{private} is a private key: give its public half (openssl pkey -in {private} -pubout)"),
        (not_a_key, f"{not_a_key} is not a PEM public key"),
    ]
    for key, words in cases:
        for command in (["verify", signed["archive"]], ["run", signed["archive"], image_sample / "kitten.jpg"]):
            done = tsctl(*command, "--public-key", key)
            assert done.returncode == 2, (command, done.stdout, done.stderr)
            assert words in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    root = tmp_path / "tree"
    (root / "model-store").mkdir(parents=True)
    (root / "model-store" / "signed.mar").write_bytes(signed["archive"].read_bytes())
    (root / "config").mkdir()
    write_config(root / "config" / "config.properties", {"signed": snapshot_entry("signed.mar", 1, 1, 0, 60)})
    engine = Engine(root, "--public_key", str(private), "--enable_grpc", "false")
    try:
        assert engine.process.wait(60) == 2
    finally:
        engine.stop()
    assert f"tsctl engine: {cases[0][1]}" in engine.output(), engine.output()[-2000:]
    done = tsctl(
        "package",
        "--model-name",
        "x",
        "--handler",
        "image_classifier",
        "--export-path",
        tmp_path,
        "--serialized-file",
        image_sample / "resnet18.pt",
        "--model-file",
        image_sample / "model.py",
        "--sign-key",
        signed["public"],
    )
    assert done.returncode == 2 and "is a public key: signing needs its private half" in done.stderr, done.stderr


def test_inspect_and_package_say_whether_an_archive_is_signed_and_by_which_key(signed, image_sample, tmp_path):
    import json

    from handlers.signing import fingerprint, read_key

    expected = fingerprint(read_key(signed["public"]))
    openssl = subprocess.run(["openssl", "pkey", "-pubin", "-in", str(signed["public"])], capture_output=True)
    if openssl.returncode == 0:  # the documented way to compute it
        import hashlib

        assert expected == "sha256:" + hashlib.sha256(openssl.stdout).hexdigest()
    done = tsctl("inspect", signed["archive"], "--json")
    assert json.loads(done.stdout)["signature"] == {"signed": True, "key_fingerprint": expected}, done.stderr
    assert f"signed by key {expected}" in tsctl("inspect", signed["archive"]).stdout
    done = tsctl("inspect", signed["unsigned"], "--json")
    assert json.loads(done.stdout)["signature"] == {"signed": False, "key_fingerprint": None}
    assert "not signed" in tsctl("inspect", signed["unsigned"]).stdout
    done = tsctl(
        "package",
        "--model-name",
        "fresh",
        "--handler",
        "image_classifier",
        "--export-path",
        tmp_path,
        "--serialized-file",
        image_sample / "resnet18.pt",
        "--model-file",
        image_sample / "model.py",
        "--sign-key",
        signed["root"] / "signer.pem",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["signature"] == {"signed": True, "key_fingerprint": expected}


def test_package_signs_before_its_one_write_and_unpacks_nothing(signed, image_sample, tmp_path, monkeypatch):
    """--sign-key signs the archive's files as they will be written and writes the archive once: nothing
    is written aside, unpacked and written again (an Archive's unpack would fail here)."""
    from archiver import signing as archive_signing
    from handlers import archives

    def no_unpack(self, into):
        raise AssertionError(f"{self.path} was unpacked while packaging")

    monkeypatch.setattr(archives.Archive, "unpack", no_unpack)
    archive = package_resnet(image_sample, tmp_path / "store", name="once", sign_key=str(signed["root"] / "signer.pem"))
    monkeypatch.undo()
    name, version, _ = archive_signing.verify_archive(archive, str(signed["public"]))
    assert (name, version) == ("once", "1.0")


def test_an_input_written_to_while_package_signs_is_not_shipped_with_a_signature_that_lies(
    signed, image_sample, tmp_path, monkeypatch
):
    """--sign-key lays the inputs out as hard links and signs them before the one write: an input that
    another process rewrites in place meanwhile (a training job still saving, an editor) must not give
    an archive whose signature does not cover what it holds. Either package refuses in one line or the
    archive it writes verifies."""
    from archiver import signing as archive_signing
    from archiver.errors import UserError

    sample = tmp_path / "sample"
    shutil.copytree(image_sample, sample)
    labels = sample / "index_to_name.json"
    signed_first = archive_signing.sign

    def sign_then_edit(root, key):
        signature = signed_first(root, key)
        with open(labels, "r+b") as f:  # in place: the same inode the scratch tree links to
            f.seek(0)
            data = f.read()
            f.seek(0)
            f.write(data.replace(b"class_", b"klass_", 1))
        return signature

    monkeypatch.setattr(archive_signing, "sign", sign_then_edit)
    try:
        archive = package_resnet(sample, tmp_path / "store", name="raced", sign_key=str(signed["root"] / "signer.pem"))
    except UserError as refused:
        assert "\n" not in str(refused) and "index_to_name.json" in str(refused)
        return
    finally:
        monkeypatch.undo()
    name, _, _ = archive_signing.verify_archive(archive, str(signed["public"]))
    assert name == "raced"


@pytest.mark.matrix  # 19 s; make test: the engine refusing unsigned archives at start
def test_a_registered_archive_is_checked_as_startup_checks_one(signed, versions, tmp_path):
    """With --public_key, the management API's register checks the archive where startup checks the
    snapshot's (``open_model``), before any of its code runs: unsigned, tampered, or signed as another
    model is one 400 and nothing registered, no process started; a version signed as itself registers."""
    root = tmp_path / "tree"
    store = root / "model-store"
    store.mkdir(parents=True)
    (store / "signed.mar").write_bytes(signed["archive"].read_bytes())
    (store / "unsigned.mar").write_bytes(signed["unsigned"].read_bytes())
    (store / "tampered.mar").write_bytes(tampered(signed["archive"], "resnet18.pt").read_bytes())
    (store / "v2.mar").write_bytes(versions["v2"].read_bytes())
    (root / "config").mkdir()
    entry = snapshot_entry("signed.mar", 1, 1, 0, 120)
    write_config(root / "config" / "config.properties", {"signed": entry}, "enable_model_api=true\n")
    engine = Engine(root, "--public_key", str(signed["public"]), "--enable_grpc", "false").wait_ready()
    try:
        import psutil

        listed = engine.get("/models")
        processes = {p.pid for p in psutil.Process(engine.process.pid).children(recursive=True)}
        for url, words in (
            ("unsigned.mar", "unsigned.mar is not signed"),
            ("tampered.mar&model_name=tampered", "resnet18.pt differs from what was signed"),
            ("signed.mar&model_name=other", "is signed as model signed, expected other"),
        ):
            status, body = engine.post(f"/models?url={url}&initial_workers=1", b"")
            assert (status, body["type"]) == (400, "InvalidModelException") and words in body["message"], body
            assert engine.get("/models") == listed
            assert {p.pid for p in psutil.Process(engine.process.pid).children(recursive=True)} == processes
            assert [d.name for d in engine.home.glob("tsctl-engine-*/m*")] == ["m0"]  # nothing it unpacked stays
        status, body = engine.post("/models?url=v2.mar", b"")  # its model-config.yaml's workers, as TorchServe
        assert status == 200 and 'Model "signed" Version: 2.0 registered with 1 initial workers' == body["status"]
        assert [m["modelVersion"] for m in engine.get("/models/signed/all")[1]] == ["1.0", "2.0"]
    finally:
        engine.stop()
