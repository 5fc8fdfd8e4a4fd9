"""The engine without a config serves every archive of the store (.mar, .tar.gz, unpacked directories,
``ts_config.archives_in``); before issue #30 it served only the .mar files. A store holding one model
twice (``tsctl package`` writes NAME.mar, NAME.tar.gz and NAME/ into the same model-store) must not
have one copy silently replace the other (and leave the first copy's workers running): it is refused
in one line naming both, as ``tsctl config`` refuses it. An archive of the store that cannot be read (a stray
.tar.gz that is no model archive, a truncated .mar) does not stop the engine: it logs one line naming the file
and why, and serves the rest (TorchServe 0.12's ``load_models=all`` does not stop for it either)."""

import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from archiver.engines.tsctl import model_specs
from handlers.archives import ArchiveError
from helpers.engine import Engine
from serving import config_properties, ts_config

ECHO = """def handle(data, context):
    return None if data is None else [{"echo": len(row.get("body") or b"")} for row in data]
"""


def manifest(name: str, version: str = "1.0") -> bytes:
    model = {"modelName": name, "modelVersion": version, "handler": "handler.py"}
    return json.dumps({"model": model, "archiverVersion": "0.12.0"}).encode()


def write_mar(path: Path, name: str, version: str = "1.0", handler: str = "") -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", manifest(name, version))
        z.writestr("handler.py", handler)
    return path


def write_tgz(path: Path, name: str) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for member, data in (("MAR-INF/MANIFEST.json", manifest(name)), ("handler.py", b"")):
            info = tarfile.TarInfo(f"{name}/{member}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def write_dir(path: Path, name: str) -> Path:
    (path / "MAR-INF").mkdir(parents=True)
    (path / "MAR-INF" / "MANIFEST.json").write_bytes(manifest(name))
    (path / "handler.py").write_text("")
    return path


def test_every_kind_of_archive_is_served_without_a_config(tmp_path):
    write_mar(tmp_path / "a.mar", "a")
    write_tgz(tmp_path / "b.tar.gz", "b")
    write_dir(tmp_path / "c", "c")
    specs, _ = ts_config.models(None, tmp_path)
    assert [(s.name, s.archive.name) for s in specs] == [("a", "a.mar"), ("b", "b.tar.gz"), ("c", "c")]


@pytest.mark.parametrize("other", ["tgz", "dir", "mar"])
def test_one_model_twice_in_the_store_is_refused_in_one_line(tmp_path, other):
    write_mar(tmp_path / "resnet18.mar", "resnet18")
    second = {
        "tgz": lambda: write_tgz(tmp_path / "resnet18.tar.gz", "resnet18"),
        "dir": lambda: write_dir(tmp_path / "resnet18", "resnet18"),
        "mar": lambda: write_mar(tmp_path / "resnet18-copy.mar", "resnet18"),
    }[other]()
    with pytest.raises(config_properties.ConfigError) as refused:
        ts_config.models(None, tmp_path)
    message = str(refused.value)
    assert "\n" not in message and "resnet18" in message
    assert str(tmp_path / "resnet18.mar") in message and str(second) in message


def test_versions_of_one_model_are_served_side_by_side(tmp_path):
    write_mar(tmp_path / "m-1.mar", "m", "1.0")
    write_mar(tmp_path / "m-2.mar", "m", "2.0")
    specs, _ = ts_config.models(None, tmp_path)
    assert sorted((s.name, s.version) for s in specs) == [("m", "1.0"), ("m", "2.0")]


def unreadable(store: Path) -> dict:
    """A stray .tar.gz that is no model archive and a truncated .mar in ``store``: {file: words of its line}."""
    with tarfile.open(store / "notes.tar.gz", "w:gz") as t:
        info = tarfile.TarInfo("notes.txt")
        t.addfile(info, io.BytesIO(b""))
    whole = io.BytesIO()
    with zipfile.ZipFile(whole, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", manifest("broken"))
        z.writestr("handler.py", ECHO)
    (store / "broken.mar").write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])  # its end is missing
    return {store / "notes.tar.gz": "has no MAR-INF/MANIFEST.json", store / "broken.mar": "truncated"}


def test_the_engine_serves_the_rest_of_a_store_with_a_stray_and_a_broken_archive(tmp_path):
    """The real engine, no config: the good model answers 200, each unreadable file is named in one log line."""
    store = tmp_path / "tree" / "model-store"
    store.mkdir(parents=True)
    write_mar(store / "echo.mar", "echo", handler=ECHO)
    stray = unreadable(store)
    engine = Engine(store.parent, "--enable_grpc", "false", timeout=120)
    try:
        engine.wait_ready()
        status, body = engine.post("/predictions/echo", b"four")
        assert status == 200 and body == {"echo": 4}, body
        status, listed = engine.get("/models")
        assert status == 200 and [m["modelName"] for m in listed["models"]] == ["echo"], listed
    finally:
        assert engine.stop() == 0
    for path, words in stray.items():
        lines = [line for line in engine.output().splitlines() if str(path) in line]
        assert len(lines) == 1 and "WARNING" in lines[0] and words in lines[0], engine.output()[-3000:]


def test_what_tsctl_serve_expects_leaves_the_unreadable_out_as_the_engine_does(tmp_path):
    write_mar(tmp_path / "echo.mar", "echo")
    unreadable(tmp_path)
    assert [spec.name for spec in model_specs(tmp_path, None)] == ["echo"]
    with pytest.raises(ArchiveError):  # without skip_unreadable ('tsctl export seldon'): refused, as before
        ts_config.models(None, tmp_path)


def test_a_store_of_nothing_readable_is_refused_naming_each_file(tmp_path):
    stray = unreadable(tmp_path)
    with pytest.raises(config_properties.ConfigError) as refused:
        ts_config.models(None, tmp_path, skip_unreadable=True)
    assert "\n" not in str(refused.value) and all(str(path) in str(refused.value) for path in stray)


@pytest.mark.parametrize("other", ["tgz", "mar"])
def test_one_model_twice_is_still_refused_when_unreadable_archives_are_skipped(tmp_path, other):
    write_mar(tmp_path / "resnet18.mar", "resnet18")
    unreadable(tmp_path)
    if other == "tgz":
        write_tgz(tmp_path / "resnet18.tar.gz", "resnet18")
    else:
        write_mar(tmp_path / "resnet18-copy.mar", "resnet18")
    with pytest.raises(config_properties.ConfigError, match="both hold model 'resnet18'"):
        ts_config.models(None, tmp_path, skip_unreadable=True)
