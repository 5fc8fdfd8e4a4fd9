"""tsctl package / inspect: archive contents, manifest, determinism, and user mistakes."""

import hashlib
import json
import zipfile

import pytest
from click.testing import CliRunner

from archiver import mar
from archiver.cli import main
from handlers.archives import ArchiveError
from helpers import archive_reading
from helpers.models import package_resnet


def test_manifest_and_entries_match_what_torchserve_expects(image_sample, tmp_path):
    path = package_resnet(image_sample, tmp_path / "store")
    assert path == tmp_path / "store" / "resnet18.mar"
    manifest = archive_reading.manifest(path)
    assert manifest["runtime"] == "python"
    assert manifest["model"] == {
        "modelName": "resnet18",
        "serializedFile": "resnet18.pt",
        "handler": "handlers.image:handle",
        "modelFile": "model.py",
        "modelVersion": "1.0",
        "configFile": "model-config.yaml",
    }
    names = {name for name, _ in archive_reading.members(path)}
    assert {"resnet18.pt", "model.py", "index_to_name.json", "model-config.yaml", "MAR-INF/MANIFEST.json"} <= names
    assert {"handlers/__init__.py", "handlers/base.py", "handlers/image.py", "handlers/requests.py"} <= names
    with zipfile.ZipFile(path) as z:  # weights stored, code deflated
        assert z.getinfo("resnet18.pt").compress_type == zipfile.ZIP_STORED
        assert z.getinfo("handlers/base.py").compress_type == zipfile.ZIP_DEFLATED
        assert z.testzip() is None


def test_two_builds_of_the_same_inputs_are_byte_identical(image_sample, tmp_path):
    first = package_resnet(image_sample, tmp_path / "a").read_bytes()
    second = package_resnet(image_sample, tmp_path / "b").read_bytes()
    assert hashlib.sha256(first).hexdigest() == hashlib.sha256(second).hexdigest()


def test_directories_in_extra_files_keep_their_structure(image_sample, tmp_path):
    extra = tmp_path / "assets"
    (extra / "nested").mkdir(parents=True)
    (extra / "top.txt").write_text("a")
    (extra / "nested" / "deep.txt").write_text("b")
    (extra / "__pycache__").mkdir()
    (extra / "__pycache__" / "x.pyc").write_bytes(b"")
    path = package_resnet(image_sample, tmp_path / "store", extra_files=[str(extra)])
    names = {name for name, _ in archive_reading.members(path)}
    assert {"assets/top.txt", "assets/nested/deep.txt"} <= names
    assert not any("__pycache__" in n for n in names)


def test_user_handler_file_is_stored_and_toolkit_bundled_only_when_imported(image_sample, tmp_path):
    plain = tmp_path / "my_handler.py"
    plain.write_text("def handle(data, context):\n    return data\n")
    path = package_resnet(image_sample, tmp_path / "s1", handler=f"{plain}:handle", config_file=None)
    assert archive_reading.manifest(path)["model"]["handler"] == "my_handler.py:handle"
    assert not any(n.startswith("handlers/") for n, _ in archive_reading.members(path))

    subclass = tmp_path / "custom.py"
    subclass.write_text("from handlers.image import ImageClassifier\n\nclass Custom(ImageClassifier):\n    pass\n")
    path = package_resnet(image_sample, tmp_path / "s2", handler=str(subclass))
    assert archive_reading.manifest(path)["model"]["handler"] == "custom.py"
    assert any(n == "handlers/image.py" for n, _ in archive_reading.members(path))


@pytest.mark.parametrize("archive_format, suffix", [("zip-store", ".mar"), ("tgz", ".tar.gz"), ("no-archive", "")])
def test_other_archive_formats_hold_the_same_files(image_sample, tmp_path, archive_format, suffix):
    path = package_resnet(image_sample, tmp_path / "store", archive_format=archive_format)
    assert path.name == "resnet18" + suffix
    assert archive_reading.manifest(path)["model"]["modelName"] == "resnet18"
    assert (
        "handlers/image.py",
        (mar.Path(mar.__file__).parents[1] / "handlers/image.py").stat().st_size,
    ) in archive_reading.members(path)


def cli(*args):
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def package_args(sample, store, **changes):
    flags = {
        "--model-name": "resnet18",
        "--serialized-file": str(sample / "resnet18.pt"),
        "--model-file": str(sample / "model.py"),
        "--handler": "image_classifier",
        "--export-path": str(store),
    }
    flags.update(changes)
    args = ["package"]
    for key, value in flags.items():
        if value is not None:
            args += [key, value]
    return args


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"--serialized-file": "missing/weights.pt"}, "--serialized-file missing/weights.pt does not exist"),
        ({"--handler": "image_classifer"}, "unknown --handler 'image_classifer'"),
        ({"--model-name": "bad name!"}, "invalid --model-name 'bad name!'"),
        ({"--model-name": "-leading"}, "invalid --model-name"),
        ({"--model-name": "trailing\n"}, "invalid --model-name"),  # $ matched before a last newline: \Z now
        ({"--version": "1.0\n"}, "invalid --version"),
        ({"--extra-files": "nope.json"}, "--extra-files nope.json does not exist"),
    ],
)
def test_user_mistakes_are_one_clear_sentence(image_sample, tmp_path, changes, words):
    code, output = cli(*package_args(image_sample, tmp_path, **changes))
    assert code == 2, output
    assert words in output
    assert "Traceback" not in output and output.count("\n") == 1
    assert not list(tmp_path.glob("*"))  # nothing written, not even a temp file


@pytest.mark.parametrize("handler", ["path/typo.py", "path/typo.py:handle", "path/typo", "./typo", "typo.py"])
def test_a_handler_path_that_does_not_exist_is_no_such_file(image_sample, tmp_path, handler):
    """A value that names a file (a '/' in it, or .py) is a missing file, not an unknown handler name."""
    code, output = cli(*package_args(image_sample, tmp_path / "store", **{"--handler": handler}))
    assert code == 2, output
    path = handler.partition(":")[0]
    assert output.startswith(f"error: --handler {path}: no such file: check the path of your handler file"), output
    assert "image_classifier" in output  # the fix: the toolkit's names, for who meant one
    assert "unknown --handler" not in output and "Traceback" not in output and output.count("\n") == 1
    assert not (tmp_path / "store").exists()


def test_a_mistyped_handler_file_is_named_with_the_file_meant(image_sample, tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "my_handler.py").write_text("def handle(data, context):\n    return data\n")
    monkeypatch.chdir(tmp_path)
    code, output = cli(*package_args(image_sample, tmp_path / "store", **{"--handler": "src/my_handlr.py"}))
    assert code == 2, output
    assert "--handler src/my_handlr.py: no such file (did you mean src/my_handler.py?)" in output
    code, output = cli(*package_args(image_sample, tmp_path / "store", **{"--handler": "src/"}))
    assert code == 2 and "--handler src/: is a directory, not a handler file" in output, output
    code, output = cli(*package_args(image_sample, tmp_path / "store", **{"--handler": "image_clasifier"}))
    assert "unknown --handler 'image_clasifier'" in output and "did you mean 'image_classifier'" in output


@pytest.mark.parametrize(
    "config_text, words",
    [
        ("batchSize: 4\nhandler:\n  topk: 3\n", "unknown key 'handler.topk'; did you mean 'top_k'?"),
        ("batchSize: four\n", "'batchSize' must be a whole number"),
        ("batchsize: 4\n", "unknown key 'batchsize'; did you mean 'batchSize'?"),
        ("handler:\n  mean: [0.5, 0.5]\n", "must each hold 3 numbers"),
        ("handler:\n  top_k: 2.5\n", "'handler.top_k' must be a whole number"),
        ("batchSize: [4\n", "is not valid YAML (line"),
        ("sequenceBatching: true\n", "sequenceBatching is true but sequenceMaxIdleMSec is 0"),
    ],
)
def test_malformed_model_config_is_reported_with_file_and_key(image_sample, tmp_path, config_text, words):
    config = tmp_path / "model-config.yaml"
    config.write_text(config_text)
    code, output = cli(*package_args(image_sample, tmp_path / "store", **{"--config-file": str(config)}))
    assert code == 2, output
    assert words in output and str(config) in output
    assert "Traceback" not in output
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").iterdir())


def test_failed_repackaging_leaves_the_previous_archive_intact(image_sample, tmp_path):
    store = tmp_path / "store"
    good = package_resnet(image_sample, store)
    before = good.read_bytes()
    config = tmp_path / "bad.yaml"
    config.write_text("handler:\n  crop: 0\n")
    code, output = cli(*package_args(image_sample, store, **{"--config-file": str(config), "--force": None}), "--force")
    assert code == 2 and "'handler.crop' must be at least 1" in output
    assert good.read_bytes() == before
    assert [p.name for p in store.iterdir()] == ["resnet18.mar"]


def test_existing_archive_needs_force(image_sample, tmp_path):
    package_resnet(image_sample, tmp_path)
    code, output = cli(*package_args(image_sample, tmp_path))
    assert code == 2 and "already exists: pass --force" in output


def test_inspect_prints_manifest_and_sizes(image_sample, tmp_path):
    path = package_resnet(image_sample, tmp_path)
    code, output = cli("inspect", str(path))
    assert code == 0
    manifest, _ = json.JSONDecoder().raw_decode(output)
    assert manifest["model"]["handler"] == "handlers.image:handle"
    size = (image_sample / "resnet18.pt").stat().st_size
    assert f"{size:>12,d}  resnet18.pt" in output


def test_inspect_refuses_unsafe_paths(tmp_path):
    evil = tmp_path / "evil.mar"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", "{}")
        z.writestr("../../etc/passwd", "x")
    with pytest.raises(ArchiveError, match="unsafe path '../../etc/passwd'"):
        archive_reading.members(evil)
    code, output = cli("inspect", str(evil))
    assert code == 2 and "unsafe path" in output


def test_a_build_killed_mid_write_leaves_the_old_archive_and_no_temp_file(image_sample, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    store = tmp_path / "store"
    previous = package_resnet(image_sample, store).read_bytes()
    big = tmp_path / "big.pt"
    with open(big, "wb") as f:  # 1.5 GB, mostly zeros: the write takes long enough to be caught in the middle
        f.write(b"\x80\x02")  # begins as torch.save's older pickle format does, which packaging checks
        f.truncate(1536 << 20)
    script = (
        "from archiver import mar; mar.package(mar.PackageOptions(model_name='resnet18', handler='image_classifier', "
        f"serialized_file={str(big)!r}, model_file={str(image_sample / 'model.py')!r}, "
        f"export_path={str(store)!r}, force=True))"
    )
    process = subprocess.Popen([sys.executable, "-c", script], cwd=mar.Path(mar.__file__).parents[1])
    deadline = time.monotonic() + 120
    writing = False
    while time.monotonic() < deadline and process.poll() is None and not writing:
        try:  # the unnamed archive being written shows as an open descriptor into the store
            writing = any(
                str(store) in os.readlink(f"/proc/{process.pid}/fd/{fd}")
                for fd in os.listdir(f"/proc/{process.pid}/fd")
            )
        except OSError:
            pass
        time.sleep(0.01)
    assert writing, "never caught the build writing"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert sorted(p.name for p in store.iterdir()) == ["resnet18.mar"]
    assert (store / "resnet18.mar").read_bytes() == previous


@pytest.mark.parametrize(
    "handler, config, extra, noted",
    [
        ("image_classifier", None, "index_to_name.json", False),
        ("image_classifier", None, None, True),
        ("image_classifier", "handler:\n  labels: classes.json\n", "classes.json", False),
        ("image_classifier", "handler:\n  labels: classes.json\n", "index_to_name.json", True),
        ("tensor", None, None, False),  # a tensor model answers tensors: no labels to miss
    ],
)
def test_an_image_classifier_without_its_labels_file_gets_a_note(image_sample, tmp_path, handler, config, extra, noted):
    """Without labels the answers name classes by index ('238': 0.02), which a newcomer read as broken."""
    options = dict(handler=handler, serialized_file=str(image_sample / "resnet18.pt"))
    options.update(model_file=str(image_sample / "model.py"))
    if config:
        (tmp_path / "model-config.yaml").write_text(config)
        options.update(config_file=str(tmp_path / "model-config.yaml"))
    if extra:
        (tmp_path / extra).write_text('{"0": "tench"}')
        options.update(extra_files=[str(tmp_path / extra)])
    planned = mar.plan(mar.PackageOptions(model_name="m", export_path=str(tmp_path / "s"), **options))
    labels = "classes.json" if config else "index_to_name.json"
    assert planned.notes == (
        [
            f"the archive holds no {labels} (handler.labels): answers name classes by index "
            f"('238'), not label; add it with --extra-files {labels}"
        ]
        if noted
        else []
    )
