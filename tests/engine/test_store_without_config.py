"""The engine without a config serves every archive of the store (.mar, .tar.gz, unpacked directories,
``ts_config.archives_in``); before issue #30 it served only the .mar files. A store holding one model
twice (``tsctl package`` writes NAME.mar, NAME.tar.gz and NAME/ into the same model-store) must not
have one copy silently replace the other (and leave the first copy's workers running): it is refused
in one line naming both, as ``tsctl config`` refuses it."""

import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from serving import ts_config


def manifest(name: str, version: str = "1.0") -> bytes:
    model = {"modelName": name, "modelVersion": version, "handler": "handler.py"}
    return json.dumps({"model": model, "archiverVersion": "0.12.0"}).encode()


def write_mar(path: Path, name: str, version: str = "1.0") -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", manifest(name, version))
        z.writestr("handler.py", "")
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
    with pytest.raises(ts_config.ConfigError) as refused:
        ts_config.models(None, tmp_path)
    message = str(refused.value)
    assert "\n" not in message and "resnet18" in message
    assert str(tmp_path / "resnet18.mar") in message and str(second) in message


def test_versions_of_one_model_are_served_side_by_side(tmp_path):
    write_mar(tmp_path / "m-1.mar", "m", "1.0")
    write_mar(tmp_path / "m-2.mar", "m", "2.0")
    specs, _ = ts_config.models(None, tmp_path)
    assert sorted((s.name, s.version) for s in specs) == [("m", "1.0"), ("m", "2.0")]
