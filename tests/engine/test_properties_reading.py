"""config.properties is read as TorchServe reads it (java.util.Properties.load): continuation lines,
``key: value`` and ``key value``, escapes, ``!`` comments, a model_snapshot spread over many lines.
Where Java is installed, the same files are read by Java itself and the answers compared."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from archiver import properties
from archiver.errors import UserError
from archiver.export.kserve import tsctl_image
from serving import config_properties, ts_config

# A model_snapshot as TorchServe's documentation and users write it: JSON over many lines, each ended by a
# backslash, the next one indented.
SPREAD_SNAPSHOT = """\
inference_address=http://127.0.0.1:8085
model_snapshot={\\
  "name": "startup.cfg",\\
  "modelCount": 1,\\
  "models": {\\
    "resnet18": {\\
      "1.0": {\\
        "defaultVersion": true,\\
        "marName": "resnet18.mar",\\
        "minWorkers": 2,\\
        "maxWorkers": 3,\\
        "batchSize": 4,\\
        "maxBatchDelay": 50,\\
        "responseTimeout": 120\\
      }\\
    }\\
  }\\
}
"""

JAVA_SYNTAX = """\
# a comment
! also a comment
colon: http://127.0.0.1:8080
space   spaced value
tabbed\tvalue
equals = with = signs
continued=first, \\
          second, \\
    third
escaped_equals=a\\=b
unicode=\\u0041\\u00e9
key\\ with\\ spaces=v
empty=
alone
dup=first
dup=second
"""
JAVA_SYNTAX += "trailing_spaces=kept   \n"  # a value's trailing blanks are its own

EXPECTED = {
    "colon": "http://127.0.0.1:8080",
    "space": "spaced value",
    "tabbed": "value",
    "equals": "with = signs",
    "continued": "first, second, third",
    "escaped_equals": "a=b",
    "unicode": "A\u00e9",
    "key with spaces": "v",
    "trailing_spaces": "kept   ",
    "empty": "",
    "alone": "",
    "dup": "second",
}


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("latin-1"))
    return path


def test_java_syntax_is_read_as_java_reads_it(tmp_path):
    path = write(tmp_path / "config.properties", JAVA_SYNTAX)
    assert dict(properties.read_properties(path)) == EXPECTED
    assert dict(config_properties.read_properties(path)) == EXPECTED  # the tsctl engine reads it the same


def test_a_model_snapshot_over_continuation_lines_is_served(tmp_path):
    config = write(tmp_path / "config.properties", SPREAD_SNAPSHOT)
    props = properties.read_properties(config)
    assert props["inference_address"] == "http://127.0.0.1:8085"
    snapshot = properties.snapshot_of(props, config)
    assert snapshot["models"]["resnet18"]["1.0"]["batchSize"] == 4
    store = tmp_path / "model-store"
    store.mkdir()
    (store / "resnet18.mar").write_bytes(b"")  # the snapshot's checks only look for the file
    specs, _ = ts_config.models(config, store)
    assert [(s.name, s.min_workers, s.max_workers, s.batch_size, s.max_batch_delay) for s in specs] == [
        ("resnet18", 2, 3, 4, 50)
    ]


def test_the_file_is_read_as_iso_8859_1_bytes_as_torchserve_does(tmp_path):
    """Properties.load(InputStream) decodes ISO-8859-1: UTF-8 bytes are two characters, as TorchServe sees them."""
    path = tmp_path / "config.properties"
    path.write_bytes("model_store=/m/caf\u00e9\n".encode("utf-8"))
    assert properties.read_properties(path)["model_store"] == "/m/caf\u00c3\u00a9"


def test_a_broken_unicode_escape_is_one_line_naming_the_file(tmp_path):
    path = write(tmp_path / "config.properties", "model_store=C:\\users\\me\n")
    with pytest.raises(UserError) as caught:
        properties.read_properties(path)
    message = str(caught.value)
    assert str(path) in message and "\\users" in message and "\\\\ for a backslash" in message
    assert "\n" not in message


def test_a_missing_file_still_names_the_fix(tmp_path):
    with pytest.raises(UserError, match="does not exist: write it with 'tsctl config'"):
        properties.read_properties(tmp_path / "nope.properties")


def test_what_tsctl_config_writes_reads_back_unchanged(tmp_path):
    """The writer stays plain key=value (KServe's wrapper splits lines on '='): every value it writes,
    the snapshot's JSON with its ':' included, reads back as written."""
    extra = {"metrics_config": "/mnt/models/config/metrics.yaml", "allowed_urls": "file:///a/.*"}
    text = properties.render({**properties.BASE_PROPERTIES, **extra, "model_snapshot": '{"a":{"b":1}}'})
    path = tmp_path / "config.properties"
    path.write_text(text)
    read = properties.read_properties(path)
    assert read == {**properties.BASE_PROPERTIES, **extra, "model_snapshot": '{"a":{"b":1}}'}


def test_the_engine_image_installs_what_reads_the_config():
    """serving/config_properties.py reads config.properties with javaproperties in the tsctl engine's process: its
    image (archiver/export/kserve/tsctl_image.py) must install it."""
    from importlib import metadata

    lines = tsctl_image.requirements([]).splitlines()
    assert f"javaproperties=={metadata.version('javaproperties')}" in lines


JAVA_DUMP = """\
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Properties;
import java.util.TreeSet;

public class Dump {
    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        try (InputStream s = Files.newInputStream(Paths.get(args[0]))) {  // as TorchServe's ConfigManager
            p.load(s);
        }
        for (String k : new TreeSet<>(p.stringPropertyNames())) {
            System.out.println(hex(k) + " " + hex(p.getProperty(k)));
        }
    }

    static String hex(String s) {
        StringBuilder b = new StringBuilder("x");
        for (char c : s.toCharArray()) b.append(String.format("%04x", (int) c));
        return b.toString();
    }
}
"""


def java_reads(path: Path) -> dict:
    """What java.util.Properties.load reads from ``path``, as TorchServe's ConfigManager loads it."""
    (path.parent / "Dump.java").write_text(JAVA_DUMP)
    command = ["java", str(path.parent / "Dump.java"), str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    def unhex(word):
        return "".join(chr(int(word[i : i + 4], 16)) for i in range(1, len(word), 4))

    pairs = (map(unhex, line.split(" ")) for line in done.stdout.splitlines())
    return {k: v.encode("utf-16", "surrogatepass").decode("utf-16") for k, v in pairs}  # surrogate pairs joined


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")
@pytest.mark.parametrize("text", [JAVA_SYNTAX, SPREAD_SNAPSHOT], ids=["syntax", "snapshot"])
def test_java_reads_the_same_values(tmp_path, text):
    path = write(tmp_path / "config.properties", text)
    java = java_reads(path)
    assert dict(properties.read_properties(path)) == java
    if "model_snapshot" in java:
        assert json.loads(java["model_snapshot"])["models"]["resnet18"]["1.0"]["maxWorkers"] == 3


TRICKY = {
    "windows_path": "C:\\models\\store",  # a backslash Java would read as an escape
    "lines": "one\ntwo\r\nthree",
    "leading": "  spaced",
    "tabbed": "\tx\ty",
    "accents": "café",  # beyond ASCII: Java reads the file as ISO-8859-1
    "snowman": "☃ and 🐍",  # beyond ISO-8859-1, and beyond the BMP
    "url": "http://0.0.0.0:8085",  # ':' and '=' stay as they are (kserve_wrapper splits at the first '=')
    "equals": "a=b",
    "key with = and : in it": "v",
    "#not a comment": "w",
    "!neither": "z",
    "empty": "",
}


def test_what_render_writes_java_reads_back_as_it_was(tmp_path):
    """export kserve reads a user's config and writes it again: a value Java would read another way (a
    Windows path's backslash, a line break, a leading blank, a non-ASCII letter) is escaped, and tsctl's
    own values are written as they are."""
    path = tmp_path / "config.properties"
    path.write_text(properties.render(TRICKY), encoding="ascii")
    assert dict(properties.read_properties(path)) == TRICKY
    assert "url=http://0.0.0.0:8085\n" in path.read_text() and "equals=a=b\n" in path.read_text()
    if shutil.which("java"):
        assert java_reads(path) == TRICKY


def test_the_engine_without_a_config_serves_what_tsctl_config_lists(tmp_path):
    """One ``archives_in``: a .mar, a .tar.gz and an unpacked directory, as TorchServe takes them, are what
    'tsctl config' writes into the model_snapshot and what the engine serves without a config (it skipped
    .tar.gz archives and directories)."""
    import io
    import tarfile
    import zipfile

    store = tmp_path / "model-store"
    store.mkdir()

    def manifest(name: str) -> bytes:
        return json.dumps({"model": {"modelName": name, "handler": "h.py", "modelVersion": "1.0"}}).encode()

    with zipfile.ZipFile(store / "zipped.mar", "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", manifest("zipped"))
    with tarfile.open(store / "tarred.tar.gz", "w:gz") as t:
        info = tarfile.TarInfo("tarred/MAR-INF/MANIFEST.json")
        info.size = len(manifest("tarred"))
        t.addfile(info, io.BytesIO(manifest("tarred")))
    (store / "unpacked" / "MAR-INF").mkdir(parents=True)
    (store / "unpacked" / "MAR-INF" / "MANIFEST.json").write_bytes(manifest("unpacked"))
    (store / "notes.txt").write_text("not an archive")
    listed = [p.name for p in properties.archives_in(store)]
    assert listed == ["tarred.tar.gz", "unpacked", "zipped.mar"]
    specs, _ = ts_config.models(None, store)
    assert [(s.name, s.archive.name) for s in specs] == [(name.split(".")[0], name) for name in listed]
    assert list(properties.build_snapshot(store)["models"]) == ["tarred", "unpacked", "zipped"]
