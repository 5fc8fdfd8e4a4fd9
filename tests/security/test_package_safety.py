"""Packaging and archive reading as an attacker or a careless user would drive them: nothing is lost,
nothing outside the inputs is bundled silently, nothing unsafe is read, every mistake is one line."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver import properties
from archiver.cli import main
from handlers.archives import MIN_UNPACK_LIMIT
from helpers import archive_reading
from helpers.models import stand_in_torchscript

ROOT = Path(__file__).resolve().parents[2]
TSCTL = [sys.executable, "-m", "archiver.cli"]


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def one_line_error(code, output, words, exit_code=2):
    assert code == exit_code, output
    assert words in output, output
    assert "Traceback" not in output and output.count("\n") == 1, output


@pytest.fixture
def inputs(tmp_path):
    """Small stand-ins: packaging never loads weights."""
    d = tmp_path / "in"
    d.mkdir()
    stand_in_torchscript(d / "w.pt", 700)
    (d / "labels.json").write_text('{"0": "cat"}')
    return d


def package_args(inputs, store, *extra, name="m"):
    return [
        "package",
        "--model-name",
        name,
        "--serialized-file",
        inputs / "w.pt",
        "--handler",
        "image_classifier",
        "--export-path",
        store,
        *extra,
    ]


def tree(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_target_that_is_an_input_is_refused_and_the_input_kept(tmp_path):
    store = tmp_path / "store"
    model_dir = store / "minilm"  # an HF-style directory inside the export path, named like the model
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text("{}")
    (model_dir / "model.safetensors").write_bytes(b"x" * 1000)
    before = tree(model_dir)
    code, output = cli(
        "package",
        "--model-name",
        "minilm",
        "--serialized-file",
        model_dir,
        "--handler",
        "text_embedder",
        "--export-path",
        store,
        "--archive-format",
        "no-archive",
        "--force",
    )
    one_line_error(code, output, f"would overwrite the input {model_dir}")
    assert tree(model_dir) == before


def test_an_archive_never_overwrites_a_file_it_reads(inputs, tmp_path):
    store = tmp_path / "store"
    assert cli(*package_args(inputs, store))[0] == 0
    code, output = cli(*package_args(inputs, store, "--extra-files", store / "m.mar", "--force"))
    one_line_error(code, output, "would overwrite the input")


def test_symbolic_links_are_refused_unless_followed_and_each_is_named(inputs, tmp_path):
    (inputs / "passwd").symlink_to("/etc/passwd")
    store = tmp_path / "store"
    code, output = cli(*package_args(inputs, store, "--extra-files", inputs / "passwd"))
    one_line_error(code, output, f"{inputs / 'passwd'} is a symbolic link (to /etc/passwd): pass --follow-symlinks")
    assert not store.exists() or not list(store.iterdir())

    nested = inputs / "assets"
    nested.mkdir()
    (nested / "link.txt").symlink_to(inputs / "labels.json")
    code, output = cli(*package_args(inputs, store, "--extra-files", nested))
    one_line_error(code, output, f"{nested / 'link.txt'} is a symbolic link")

    code, output = cli(
        *package_args(inputs, store, "--extra-files", f"{inputs / 'passwd'},{nested}", "--follow-symlinks")
    )
    assert code == 0, output
    assert f"followed {inputs / 'passwd'} -> /etc/passwd" in output
    assert f"followed {nested / 'link.txt'} -> {inputs / 'labels.json'}" in output
    assert archive_reading.member(store / "m.mar", "passwd") == Path("/etc/passwd").read_bytes()


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda d: (d / "x").symlink_to(d / "nowhere"), "is a broken symbolic link"),
        (lambda d: ((d / "x").symlink_to(d / "y"), (d / "y").symlink_to(d / "x")), "is a symbolic link loop"),
        (lambda d: ((d / "x").mkdir(), (d / "x" / "up").symlink_to(d / "x")), "is a symbolic link loop"),
        (lambda d: os.mkfifo(d / "x"), "is not a regular file"),
    ],
)
def test_broken_links_loops_and_special_files_are_one_line(inputs, tmp_path, make, words):
    make(inputs)
    code, output = cli(*package_args(inputs, tmp_path / "store", "--extra-files", inputs / "x", "--follow-symlinks"))
    one_line_error(code, output, words)


def test_names_that_are_not_utf8_are_refused(inputs, tmp_path):
    odd = os.fsencode(str(inputs)) + b"/caf\xe9.txt"
    with open(odd, "wb") as f:
        f.write(b"x")
    code, output = cli(*package_args(inputs, tmp_path / "store", "--extra-files", inputs))
    one_line_error(code, output, "not valid UTF-8")


@pytest.mark.parametrize(
    "make, handler, words",
    [
        (
            lambda d: ((d / "MAR-INF").mkdir(), (d / "MAR-INF" / "MANIFEST.json").write_text("{}")),
            "image_classifier",
            "where the archive's manifest lives",
        ),
        (lambda d: (d / "requirements.txt").write_text("evil\n"), "text_embedder", "holds the archive's requirements"),
        (
            lambda d: ((d / "handlers").mkdir(), (d / "handlers" / "extra.py").write_text("")),
            "image_classifier",
            "inside the toolkit's bundled handlers/ package",
        ),
    ],
)
def test_names_tsctl_writes_itself_cannot_be_taken_by_inputs(inputs, tmp_path, make, handler, words):
    make(inputs)
    extra = inputs / next(n for n in ("MAR-INF", "requirements.txt", "handlers") if (inputs / n).exists())
    serialized = inputs / "w.pt"
    if handler == "text_embedder":  # a text handler takes a Hugging Face directory
        serialized = inputs / "hf"
        serialized.mkdir()
        (serialized / "config.json").write_text('{"architectures": ["BertModel"]}')
    code, output = cli(
        "package",
        "--model-name",
        "m",
        "--serialized-file",
        serialized,
        "--handler",
        handler,
        "--extra-files",
        extra,
        "--export-path",
        tmp_path / "store",
    )
    one_line_error(code, output, words)


@pytest.mark.parametrize("version", ["1\\0", '1"0', "1 0", "1=0", "v\u00e9", ""])
def test_versions_config_properties_cannot_carry_are_refused(inputs, tmp_path, version):
    code, output = cli(*package_args(inputs, tmp_path / "store", "--version", version))
    one_line_error(code, output, "invalid --version")


def test_config_refuses_a_foreign_archive_whose_names_it_cannot_carry(inputs, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    foreign = store / "odd.mar"
    with zipfile.ZipFile(foreign, "w") as z:
        z.writestr(
            "MAR-INF/MANIFEST.json",
            json.dumps({"model": {"modelName": "odd", "handler": "h.py", "modelVersion": 'a\\"b'}}),
        )
    code, output = cli("config", "--model-store", store, "--output", tmp_path / "c.properties")
    one_line_error(code, output, "cannot go into config.properties")
    assert not (tmp_path / "c.properties").exists()


@pytest.mark.parametrize(
    "manifest, config, words",
    [
        ({"runtime": "python"}, None, "has no 'model' object"),
        ({"model": {"modelName": "x"}}, None, "names no model.handler"),
        ({"model": {"modelName": "x", "handler": "h.py", "configFile": "c.yaml"}}, "a: [b\n", "is not valid YAML"),
        ({"model": {"modelName": "x", "handler": "h.py", "configFile": "c.yaml"}}, "- a\n", "must be a YAML mapping"),
        ("not json {", None, "is not valid JSON"),
    ],
)
def test_foreign_archives_with_broken_manifests_or_configs_are_one_line(tmp_path, manifest, config, words):
    store = tmp_path / "store"
    store.mkdir()
    with zipfile.ZipFile(store / "x.mar", "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", manifest if isinstance(manifest, str) else json.dumps(manifest))
        if config is not None:
            z.writestr("c.yaml", config)
    one_line_error(*cli("config", "--model-store", store, "--output", tmp_path / "c.properties"), words)
    if config is None:
        one_line_error(*cli("inspect", store / "x.mar"), words)
        one_line_error(*cli("run", store / "x.mar", store / "x.mar"), words)


def test_inspect_and_run_mistakes_are_one_line(inputs, tmp_path):
    store = tmp_path / "store"
    assert cli(*package_args(inputs, store))[0] == 0
    good = store / "m.mar"
    truncated = tmp_path / "truncated.mar"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    for command in ("inspect", "run"):
        extra = [inputs / "labels.json"] if command == "run" else []
        one_line_error(*cli(command, tmp_path / "missing.mar", *extra), "does not exist")
        one_line_error(*cli(command, inputs / "labels.json", *extra), "is not a model archive")
        one_line_error(
            *cli(command, truncated, *extra),
            "is not a model archive (.mar zip, .tar.gz or directory), or it is truncated",
        )
    one_line_error(*cli("run", good, tmp_path / "missing.jpg"), "input")
    one_line_error(*cli("run", good, inputs), "is a directory")
    one_line_error(*cli("predict", "m", inputs, "--home", tmp_path / "nohome"), f"input {inputs} is a directory")


def test_a_huge_manifest_is_refused_without_reading_it(tmp_path):
    archive = tmp_path / "big.mar"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z, z.open("MAR-INF/MANIFEST.json", "w") as f:
        f.write(b'{"model": {"modelName": "x", "handler": "h.py", "pad": "' + b" " * (64 << 20) + b'"}}')
    assert archive.stat().st_size < 1 << 20
    code, output = cli("inspect", archive)
    one_line_error(code, output, "MANIFEST.json is larger than 1,048,576 bytes")


def test_run_refuses_zip_bombs_and_paths_outside_the_archive_and_leaves_nothing(inputs, tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr("tempfile.tempdir", None)
    manifest = {"model": {"modelName": "x", "handler": "handlers.image:handle", "serializedFile": "w.pt"}}
    bomb = tmp_path / "bomb.mar"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        with z.open("w.pt", "w", force_zip64=True) as f:
            block = b"\0" * (16 << 20)
            for _ in range((MIN_UNPACK_LIMIT >> 24) + 1):
                f.write(block)
    assert bomb.stat().st_size < 8 << 20
    one_line_error(*cli("run", bomb, inputs / "labels.json"), "refusing a likely zip bomb")

    outside = tmp_path / "outside.mar"
    with zipfile.ZipFile(outside, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {**manifest["model"], "modelFile": "../evil.py"}}))
    one_line_error(*cli("run", outside, inputs / "labels.json"), "unsafe path '../evil.py'")

    escaped = tmp_path / "escaped"  # an unpacked directory whose manifest names a file behind a link
    (escaped / "MAR-INF").mkdir(parents=True)
    (escaped / "evil.py").symlink_to(tmp_path / "elsewhere.py")
    (escaped / "MAR-INF" / "MANIFEST.json").write_text(
        json.dumps({"model": {**manifest["model"], "modelFile": "evil.py"}})
    )
    one_line_error(*cli("run", escaped, inputs / "labels.json"), "points outside the archive")

    broken = tmp_path / "broken.mar"  # loads, then fails in the handler: the temporary tree still goes
    with zipfile.ZipFile(broken, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {**manifest["model"], "handler": "nosuch:handle"}}))
    code, output = cli("run", broken, inputs / "labels.json")
    assert code == 1 and "the handler failed to load" in output and "Traceback" not in output, output
    assert not list(scratch.iterdir()), "tsctl run left files behind"


def test_concurrent_builds_without_force_leave_one_winner_and_clear_errors(inputs, tmp_path):
    store = tmp_path / "store"
    args = [str(a) for a in package_args(inputs, store)]
    processes = [
        subprocess.Popen(TSCTL + args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(6)
    ]
    results = [(p.wait(timeout=300), p.stdout.read()) for p in processes]  # six torch imports on 2 cores
    assert sorted(code for code, _ in results) == [0] + [2] * 5, results
    for code, output in results:
        if code == 2:
            assert "already exists: pass --force" in output or "created by someone else" in output, output
    assert sorted(p.name for p in store.iterdir()) == ["m.mar"]
    assert archive_reading.manifest(store / "m.mar")["model"]["modelName"] == "m"


@pytest.mark.matrix  # a tsctl process per timezone, each importing torch (issue 13): about 45 s
def test_tgz_builds_are_byte_identical_across_timezones(inputs, tmp_path):
    digests = set()
    for zone in ("UTC", "Asia/Kolkata", "America/Los_Angeles"):
        env = {**os.environ, "TZ": zone, "SOURCE_DATE_EPOCH": "1700000000"}
        store = tmp_path / zone.replace("/", "_")
        args = [str(a) for a in package_args(inputs, store, "--archive-format", "tgz")]
        subprocess.run(TSCTL + args, cwd=ROOT, env=env, check=True, capture_output=True)
        digests.add(hashlib.sha256((store / "m.tar.gz").read_bytes()).hexdigest())
        import tarfile

        with tarfile.open(store / "m.tar.gz") as t:
            assert {m.mtime for m in t.getmembers()} == {1700000000}
    assert len(digests) == 1


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare to mount a small tmpfs")
def test_a_full_disk_is_one_line_and_leaves_nothing(inputs, tmp_path):
    (inputs / "big.bin").write_bytes(os.urandom(4 << 20))
    store = tmp_path / "store"
    store.mkdir()
    args = " ".join(str(a) for a in package_args(inputs, store, "--extra-files", inputs / "big.bin"))
    script = (
        f"mount -t tmpfs -o size=1m tmpfs {store} || exit 99; {' '.join(TSCTL)} {args}; echo exit=$?; "
        f"echo left=$(ls -A {store})"
    )
    run = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True
    )
    if run.returncode == 99 or "unshare:" in run.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {run.stderr.strip()}")
    assert run.stdout.splitlines() == ["exit=2", "left="], run  # a clean exit 2, no partial file
    assert run.stderr.count("\n") == 1 and "no space left on the device" in run.stderr, run.stderr


def test_snapshot_entries_are_plain_numbers_for_a_hand_written_config(tmp_path, inputs):
    store = tmp_path / "store"
    config = inputs / "model-config.yaml"
    config.write_text("batchSize: 4\n")
    assert cli(*package_args(inputs, store, "--config-file", config))[0] == 0
    props = properties.read_properties(properties.write_config(store, tmp_path / "c.properties"))
    assert json.loads(props["model_snapshot"])["models"]["m"]["1.0"]["batchSize"] == 4
    assert props["decode_input_request"] == "false"  # toolkit handlers parse bodies under their own limits
