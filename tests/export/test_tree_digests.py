"""Issue #45, an outsider's attack on the tree check (serving/tree_digests.py): what the check cannot see is a
change, not a pass. Run as KServe's TorchServe runtime runs it (``runAsUser: 1000``; the tree's files owned by
whoever copied or built them), the check once passed a tree holding:

- an added directory archive under a folder uid 1000 cannot list (mode 0711 or 0700): ``os.walk`` passed the
  folder over in silence, though TorchServe opens ``evil/MAR-INF/MANIFEST.json`` by name;
- an added file under such a folder in config/;
- model-store/ or config/ itself a link to a folder elsewhere (whose contents can change after the check).

Each is now refused, in one line naming what it could not check. And the tsctl engine, started with the pinned
digest, checked the tree above the store's real path while it read --ts_config where it was given: a link and a
changed config passed."""

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from archiver.server import free_port
from helpers.engine import engine_command
from helpers.paths import ROOT
from serving import tree_digests

UID = 1000  # KServe's TorchServe runtime's runAsUser (kserve-torchserve's securityContext)
CHECK = Path(tree_digests.__file__)
PYTHON = "/usr/bin/python3"  # the check is the standard library alone; the venv's python is not uid 1000's to run


@pytest.fixture
def tree():
    """A tree as the export writes it, under a folder uid 1000 can reach, with its listing; and its digest."""
    root = Path(tempfile.mkdtemp(prefix="tsctl-tree-", dir="/tmp"))
    try:
        (root / "config").mkdir()
        (root / "model-store").mkdir()
        (root / "config" / "config.properties").write_text("inference_address=http://0.0.0.0:8085\n")
        (root / "model-store" / "resnet18.mar").write_bytes(b"PK\x05\x06" + bytes(18))
        listing = tree_digests.listing_bytes(tree_digests.tree_files(str(root)))
        (root / tree_digests.LISTING).write_bytes(listing)
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield root, "sha256:" + hashlib.sha256(listing).hexdigest()
    finally:
        for path in [root, *root.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(root)


def check_as_the_runtime(root: Path, digest: str) -> subprocess.CompletedProcess:
    if os.geteuid() != 0:
        pytest.skip("runs the check as uid 1000, as KServe's TorchServe runtime does: needs root")

    def runtime_user():
        os.setgid(UID)
        os.setuid(UID)

    source = CHECK.read_text()  # as the predictor's command passes it: python -c "$0" ROOT DIGEST
    command = [PYTHON, "-I", "-c", source, str(root), digest]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, preexec_fn=runtime_user)


def test_the_exported_tree_passes_as_the_runtime_user(tree):
    root, digest = tree
    ran = check_as_the_runtime(root, digest)
    assert ran.returncode == 0 and ran.stderr == "", ran


@pytest.mark.parametrize("mode", [0o711, 0o700], ids=["execute-only", "unreadable"])
@pytest.mark.parametrize("where", ["model-store/evil", "config/sub"])
def test_a_folder_the_runtime_cannot_list_is_refused_not_passed_over(tree, where, mode):
    root, digest = tree
    hidden = root / where
    (hidden / "MAR-INF").mkdir(parents=True)
    (hidden / "MAR-INF" / "MANIFEST.json").write_text("{}")
    (hidden / "MAR-INF").chmod(0o755)
    (hidden / "MAR-INF" / "MANIFEST.json").chmod(0o644)
    hidden.chmod(mode)
    ran = check_as_the_runtime(root, digest)
    assert ran.returncode == 1 and ran.stderr.count("\n") == 1, ran
    assert f": {where} cannot be listed (Permission denied)" in ran.stderr, ran.stderr


@pytest.mark.parametrize("top", ["model-store", "config"])
def test_a_tree_folder_that_is_a_link_is_refused(tree, top):
    """The same files, but the folder a link to a copy elsewhere: what the pod serves could change after the check."""
    root, digest = tree
    moved = root.parent / f"{root.name}-{top}"
    shutil.move(root / top, moved)
    try:
        (root / top).symlink_to(moved)
        ran = check_as_the_runtime(root, digest)
        assert ran.returncode == 1 and f": {top} is not a folder (a link or a file)" in ran.stderr, ran
    finally:
        (root / top).unlink()
        shutil.move(moved, root / top)


def engine_start(root: Path, digest: str, *arguments: str) -> subprocess.CompletedProcess:
    """The tsctl engine started on ``root`` with the pinned digest, as the exported predictor starts it; it must
    stop before any worker with exit 2 and one line."""
    ports = ["--http_port", str(free_port()), "--grpc_port", str(free_port())]
    command = engine_command(root / "model-store", *ports, "--tree_digest", digest, *arguments)
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # run where the tree is: the key file an engine writes stays there
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=root.parent, env=env)


def refusals(ran: subprocess.CompletedProcess) -> list:
    return [line for line in ran.stderr.splitlines() if line.startswith("tsctl engine: ")]


def test_the_engine_checks_the_tree_it_serves_not_the_one_a_link_leads_to(tree):
    """An outsider's attack: config.properties changed (enable_model_api turned on), model-store/ made a link to
    a copy of the exported tree elsewhere. The engine checked the tree above the store's real path (the copy,
    unchanged) and served the changed config: its model API registered a model. Now the tree is the one above
    --model_store as given, so the link is refused, and --ts_config must be that tree's config."""
    root, digest = tree
    config = root / "config" / "config.properties"
    alt = root.parent / f"{root.name}-alt"
    shutil.copytree(root, alt)
    try:
        config.write_text(config.read_text() + "enable_model_api=true\n")
        shutil.rmtree(root / "model-store")
        (root / "model-store").symlink_to(alt / "model-store")
        ran = engine_start(root, digest, "--ts_config", str(config))
        assert ran.returncode == 2 and refusals(ran) == [
            "tsctl engine: model-store is not a folder (a link or a file), which the export never writes: copy the tree"
        ], ran.stderr
        ran = engine_start(alt, digest, "--ts_config", str(config))  # the tree unchanged, another config
        assert ran.returncode == 2 and len(refusals(ran)) == 1, ran.stderr
        assert refusals(ran)[0].startswith(f"tsctl engine: --ts_config {config} is not the pinned tree's"), ran.stderr
        assert "worker" not in ran.stderr.lower(), ran.stderr
    finally:
        shutil.rmtree(alt)
