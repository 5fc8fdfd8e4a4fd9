"""Reading an archive is bounded and inert (issue #21): metadata readers cap size, depth and
expansion and give one line, whatever the archive holds; what it names is printed with control
characters escaped; loading runs none of its code unless told to.

Before: a model-config.yaml alias bomb took ``tsctl config`` to 3.9 GB and a traceback; a golden.json
of 132 KB that unpacks to 60 MB of lists took 1.6 GB; malformed golden cases gave tracebacks;
``inspect`` printed terminal escapes raw; ``package --model-name`` of 5,000 characters gave a
traceback; a .pt2 whose sample inputs held a pickle ran it at load with allow_pickle false; a
Hugging Face directory with ``auto_map`` made transformers ask "trust remote code? [y/N]".

The CLI runs as whole processes under an address-space limit (``RLIMIT_AS``), so a blow-up fails
the test instead of the machine.
"""

import io
import json
import os
import resource
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from handlers.archives import printable
from helpers.models import package_resnet
from serving.local_model import LocalModel

BIN = Path(sys.executable).parent
LIMIT = 3 << 30  # address space for a tsctl process: torch's import alone maps about 1.5 GB


def tsctl(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    return subprocess.run(
        [str(BIN / "tsctl"), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, preexec_fn=limited
    )


def one_line_error(done: subprocess.CompletedProcess, *words: str):
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    for word in words:
        assert word in errors[0], errors[0]


def rewritten(archive: Path, replace: dict, add: dict = None) -> Path:
    """``archive`` with some entries' bytes replaced and others added (zip, deflated)."""
    out = archive.with_suffix(".new")
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            dst.writestr(item.filename, replace.get(item.filename, src.read(item)), zipfile.ZIP_DEFLATED)
        for name, data in (add or {}).items():
            dst.writestr(name, data, zipfile.ZIP_DEFLATED)
    out.replace(archive)
    return archive


BOMB = "".join(
    [f"l0: &l0 [{', '.join(['x'] * 9)}]\n"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)]
    + ["minWorkers: 1\n"]
)


def test_a_yaml_alias_bomb_in_an_archive_is_one_line(image_sample, tmp_path):
    archive = package_resnet(image_sample, tmp_path / "model-store")
    rewritten(archive, {"model-config.yaml": BOMB.encode()})
    done = tsctl("config", cwd=tmp_path)
    one_line_error(done, "model-config.yaml", "aliases")


def test_a_golden_json_that_unpacks_to_millions_of_lists_is_one_line(image_sample, tmp_path):
    archive = package_resnet(image_sample, tmp_path / "model-store")
    bomb = b'{"cases": [' + b"[]," * (20 << 20) + b'[]], "fingerprint": {}}'  # 60 MB, deflated to ~60 KB
    rewritten(archive, {}, {"MAR-INF/golden.json": bomb})
    assert archive.stat().st_size < 50 << 20
    for command in (("inspect", str(archive)), ("verify", str(archive))):
        one_line_error(tsctl(*command, cwd=tmp_path), "golden.json", "values")


@pytest.mark.parametrize(
    "golden, words",
    [
        ({"cases": [1, 2]}, "case 0 is not an object"),
        ({"cases": [{"name": 3}]}, "case 0 has no name"),
        ({"cases": [{"name": "a", "content_type": "x", "body_b64": "!!", "status": 200}]}, "not base64"),
        ({"cases": [], "fingerprint": []}, "fingerprint is not an object"),
        ({"cases": "no"}, "no list of cases"),
        ("[" * 5000 + "]" * 5000, "nests deeper"),
    ],
)
def test_a_malformed_golden_json_is_one_line(image_sample, tmp_path, golden, words):
    archive = package_resnet(image_sample, tmp_path / "model-store")
    data = golden.encode() if isinstance(golden, str) else json.dumps(golden).encode()
    rewritten(archive, {}, {"MAR-INF/golden.json": data})
    one_line_error(tsctl("inspect", str(archive), cwd=tmp_path), *words.split(" | "))


def test_inspect_escapes_what_the_archive_names(image_sample, tmp_path):
    archive = package_resnet(image_sample, tmp_path / "model-store")
    evil = "\x1b]0;owned\x07\x1b[2J\r\u202eevil.txt"
    golden = {
        "cases": [{"name": evil, "content_type": "text/plain", "body_b64": "", "status": 200, "answer": 1}],
        "fingerprint": {"handler": evil, "versions": {"torch": evil}},
    }
    rewritten(archive, {}, {f"extra/{evil}": b"x", "MAR-INF/golden.json": json.dumps(golden).encode()})
    done = tsctl("inspect", str(archive), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not any(c in done.stdout for c in "\x1b\x07\r\u202e"), repr(done.stdout[-500:])
    assert printable(evil) in done.stdout


def test_a_model_name_too_long_is_one_line(image_sample, tmp_path):
    weights, model_file = str(image_sample / "resnet18.pt"), str(image_sample / "model.py")
    done = tsctl(
        "package",
        "--model-name",
        "a" * 5000,
        "--serialized-file",
        weights,
        "--model-file",
        model_file,
        "--handler",
        "image_classifier",
        cwd=tmp_path,
    )
    one_line_error(done, "--model-name", "up to 128")
    assert len(done.stderr) < 500


class Evil:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pt2_holding_a_pickle_is_refused_without_allow_pickle(tmp_path):
    """torch.export.load falls back to an unsafe torch.load for sample inputs it cannot read
    safely: the archive is refused, the pickle never runs; with allow_pickle it loads (and runs)."""
    marker = tmp_path / "marker"
    good = tmp_path / "good.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2).eval(), (torch.randn(1, 4),)), str(good))
    buffer = io.BytesIO()
    torch.save(((Evil(str(marker)),), {}), buffer)
    (tmp_path / "pkg").mkdir()
    evil = tmp_path / "pkg" / "model.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(evil, "w") as dst:
        for item in src.infolist():
            inputs = item.filename.endswith("sample_inputs/model.pt")
            dst.writestr(item, buffer.getvalue() if inputs else src.read(item))
    from archiver import mar

    def package(config: str) -> Path:
        (tmp_path / "model-config.yaml").write_text(config)
        return mar.package(
            mar.PackageOptions(
                model_name="exported",
                handler="tensor",
                serialized_file=str(evil),
                config_file=str(tmp_path / "model-config.yaml"),
                export_path=str(tmp_path / "store"),
                force=True,
            )
        )

    with pytest.raises(Exception, match="pickled data that runs code"):
        with LocalModel(package("batchSize: 1\n")):
            pass
    assert not marker.exists()
    with LocalModel(package("batchSize: 1\nhandler:\n  allow_pickle: true\n")):
        pass
    assert marker.exists()  # the control: the crafted file does run code when unpickled


def test_a_hugging_face_directory_with_remote_code_never_prompts_or_runs_it(text_samples, tmp_path):
    """``auto_map`` names the directory's own Python; under a terminal transformers would ask
    "trust remote code? [y/N]". The handlers pass trust_remote_code=False: no prompt, no code run."""
    directory = tmp_path / "remote"
    shutil.copytree(text_samples / "classifier", directory)
    marker = tmp_path / "marker"
    config = json.loads((directory / "config.json").read_text())
    config["auto_map"] = {
        "AutoConfig": "custom.CustomConfig",
        "AutoModelForSequenceClassification": "custom.CustomModel",
        "AutoTokenizer": ["custom.CustomTokenizer", None],
    }
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "custom.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    from archiver import mar

    archive = mar.package(
        mar.PackageOptions(
            model_name="remote", handler="text_classifier", serialized_file=str(directory), export_path=str(tmp_path)
        )
    )
    sample = tmp_path / "input.txt"
    sample.write_text("a fine sentence")
    command = f"{BIN / 'tsctl'} run {archive} {sample}"
    done = subprocess.run(
        ["script", "-qec", command, "/dev/null"],
        input="y\n",
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert "trust" not in done.stdout.lower(), done.stdout[-2000:]
    assert not marker.exists(), done.stdout[-2000:]
