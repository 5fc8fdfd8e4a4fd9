"""The documentation's shell blocks run as written, wherever they live: README.md and docs/*.md.

A block marked ``<!-- readme-test: NAME -->`` is run by bash (``set -euo pipefail``), each block in a
shell of its own that starts in a fresh directory standing in for the repository's root (``.venv`` and
``.runtimes`` link to this checkout's; ``samples`` is importable from it: ``python -m samples...``), as
a reader who ran ``source .venv/bin/activate`` once. So a command that names a missing file, a flag
that changed, an output the next line needs, or a block that relies on another block's ``cd`` or
variables fails here, not on a newcomer's first try. The blocks of one test share the directory (the
files one block writes, the next may use) and run in order.

A shell block that cannot run here (it needs a cluster, an image builder, another machine, or it is
the test suite itself) is marked ``<!-- not run: WHY -->`` instead, and its text says so: every shell
block carries one of the two marks. TorchServe's fixed ports in a block (8085, 8082) become free
127.0.0.1 ports, and its gRPC and worker ports, its pid file and its sockets (TEMP) are the test's own,
so the block reads as a reader types it and two runs never meet."""

import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = r"<!-- (readme-test: ([\w-]+)|not run: [^>]+) -->\n"
SHELL = re.compile(r"^(%s)?```(sh|bash|shell|console)\n(.*?)^```" % MARK, re.S | re.M)
FIXED_PORTS = ("8085", "8082")  # TorchServe's addresses in config.properties, as a reader types them
FIXED_PORTS += ("9100", "9101", "6100", "6101")  # docs/seldon.md's Core 1 units, run locally (HTTP, metrics)
FIXED_PORTS += ("8090", "8091")  # docs/golden.md's shadow block: the current server and the candidate


def shell_blocks() -> list:
    """(document, mark, name, text) of every shell block of the documents; mark None when unmarked."""
    found = []
    for doc in DOCUMENTS:
        for mark, _, name, _, text in SHELL.findall(doc.read_text()):
            found.append((doc.relative_to(ROOT), mark or None, name or None, text))
    return found


def blocks() -> dict:
    """The marked blocks by name, each name once across all documents."""
    named = [(name, text) for _, _, name, text in shell_blocks() if name]
    assert len({name for name, _ in named}) == len(named), f"a block name is used twice: {sorted(n for n, _ in named)}"
    return dict(named)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_blocks(tmp_path: Path, *names: str, timeout: int = 600) -> str:
    """Run the blocks NAMES in order, each in its own bash starting in ``tmp_path`` (a stand-in
    repository root); stop every server they started, whatever happened. Returns their stdout."""
    found = blocks()
    ports = {port: str(free_port()) for port in FIXED_PORTS}
    if not (tmp_path / ".venv").exists():  # a test may run its blocks in two calls, the same directory
        (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    if (ROOT / ".runtimes").exists() and not (tmp_path / ".runtimes").exists():
        (tmp_path / ".runtimes").symlink_to((ROOT / ".runtimes").resolve())
    temp = Path(tempfile.mkdtemp(prefix="rd-", dir="/tmp"))  # short: TorchServe's unix sockets live in TEMP
    path = os.pathsep.join([str(tmp_path / ".venv" / "bin"), os.environ["PATH"]])
    env = {
        **os.environ,
        "PATH": path,
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        "TEMP": str(temp),
        "TMPDIR": str(temp),
        "TS_GRPC_INFERENCE_PORT": str(free_port()),
        "TS_GRPC_MANAGEMENT_PORT": str(free_port()),
        "TS_INITIAL_WORKER_PORT": str(random.randrange(20000, 60000, 100)),
    }
    out = []
    try:
        for name in names:
            script = re.sub(r"\b(%s)\b" % "|".join(FIXED_PORTS), lambda m: ports[m.group(1)], found[name])
            done = subprocess.run(
                ["bash", "-c", "set -euo pipefail\n" + script],
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            out.append(done.stdout)
            assert done.returncode == 0, f"block {name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert_written_files_are_ignored(tmp_path)
    finally:
        for home in tmp_path.rglob(".tsctl"):  # stopped by the test that started it, by its own state
            subprocess.run(
                [sys.executable, "-m", "archiver.cli", "stop", "--home", str(home)],
                cwd=ROOT,
                capture_output=True,
                timeout=120,
            )
        if (temp / ".model_server.pid").exists():  # a plain `torchserve --start` the block did not stop
            subprocess.run(["torchserve", "--stop"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)
    return "".join(out)


def assert_written_files_are_ignored(root: Path):
    """Every file the blocks wrote in the stand-in root is one the repository's .gitignore ignores: a
    reader who runs them in a checkout gets no untracked files in ``git status``."""
    linked = {".venv", ".runtimes", "serving"}  # the test's links to this checkout
    written = []
    for directory, subdirectories, files in os.walk(root):
        if Path(directory) == root:
            subdirectories[:] = [d for d in subdirectories if d not in linked]
        written += [str((Path(directory) / f).relative_to(root)) for f in files if f not in linked]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=ROOT,
        input="\n".join(written),
        capture_output=True,
        text=True,
        timeout=60,
    )
    missed = sorted(set(written) - set(ignored.stdout.splitlines()))
    assert not missed, f"files the documentation's blocks write that .gitignore does not ignore: {missed[:20]}"


def test_every_shell_block_is_run_or_says_why_not():
    unmarked = [f"{doc}: {text.splitlines()[0]}" for doc, mark, _, text in shell_blocks() if mark is None]
    assert not unmarked, "shell blocks marked neither readme-test nor 'not run':\n" + "\n".join(unmarked)


IMAGE_BLOCKS = ("kserve-image-base", "kserve-image-settings", "kserve-image", "kserve-image-stop")  # test_kserve_image


def test_every_marked_block_is_run_by_a_test():
    assert set(blocks()) == {
        "flow",
        "curl",
        "torchserve",
        "engine",
        "kserve-export",
        "golden",
        "golden-shadow",
        "own-handler",
        "minilm",
        "signing",
        "kserve-engine-export",
        "kserve-oci-export",
        "seldon-export",
        "seldon-core1-export",
        "seldon-core1-local",
        "mlserver",
        "ts-grpc-stubs",
        *IMAGE_BLOCKS,
    }


def test_the_flow_runs_as_written(tmp_path):
    out = run_blocks(tmp_path, "flow", "curl", "torchserve", "engine", "kserve-export")
    assert len(re.findall(r"kitten\.jpg: 200 ", out)) == 3, out  # on TorchServe, by tsctl run and on tsctl's engine
    assert len(re.findall(r'"class_\d+": ', out)) >= 2, out  # curl's answers, through tsctl serve and plain TorchServe
    assert re.search(r"^DEPLOY\.md$", out, re.M) and re.search(r"^inferenceservice\.yaml$", out, re.M), out


def test_the_grpc_stubs_generate_as_written(tmp_path):
    """docs/engines.md's protoc command writes its stubs into ts-grpc-stubs/ alone: nothing in the root, where
    a google/rpc/ would come first in every Python's google.rpc started there."""
    (tmp_path / "serving").symlink_to(ROOT / "serving")  # the checkout's serving/engine/protos, as in the root
    out = run_blocks(tmp_path, "ts-grpc-stubs")
    assert out.splitlines()[-1] == "stubs ok", out
    assert {p.name for p in tmp_path.iterdir()} - {".venv", ".runtimes"} == {"serving", "ts-grpc-stubs"}
    assert (tmp_path / "ts-grpc-stubs" / "google" / "rpc" / "status_pb2.py").is_file()
    ignored = subprocess.run(["git", "check-ignore", "-q", "ts-grpc-stubs/inference_pb2.py"], cwd=ROOT, timeout=30)
    assert ignored.returncode == 0, "ts-grpc-stubs/ is not in .gitignore"


@pytest.mark.matrix  # tests/cli/test_golden.py and tests/export/ run the same commands in make test
def test_golden_answers_run_as_written(tmp_path):
    out = run_blocks(tmp_path, "golden", "golden-shadow")
    assert "2 of 2 golden answers match (in-process" in out, out
    assert re.search(r"2 of 2 golden answers match \(http://127\.0\.0\.1:\d+", out), out
    assert len(re.findall(r"^agree ", out, re.M)) == 2 and "FAIL" not in out, out  # shadow: the same archive twice


@pytest.mark.matrix  # these three in make matrix; make test runs the flow, golden, own-handler and export blocks
def test_signing_runs_as_written(tmp_path):
    out = run_blocks(tmp_path, "signing")
    assert re.search(r"signed by key sha256:[0-9a-f]", out), out
    assert re.search(r"kitten\.jpg: 200 ", out), out


@pytest.mark.matrix  # out of make test for its time (issue #32's tests took its room); make matrix runs it
@pytest.mark.timeout(900)
def test_writing_your_own_handler_runs_as_written(tmp_path):
    out = run_blocks(tmp_path, "own-handler")
    assert re.search(r"passed", out), out
    assert re.search(r"text\.txt: 200 .*(negative|neutral|positive)", out), out


@pytest.mark.matrix
def test_the_sentence_embedder_runs_as_written(tmp_path):
    out = run_blocks(tmp_path, "minilm")
    assert re.search(r"^\[-?[0-9]", out, re.M), out  # the embedding, a list of floats


@pytest.mark.matrix  # tests/cli/test_golden.py and tests/export/ run the same commands in make test
def test_the_exports_run_as_written(tmp_path):
    out = run_blocks(tmp_path, "kserve-engine-export", "kserve-oci-export", "seldon-export", "seldon-core1-export")
    assert (tmp_path / "deploy-engine" / "servingruntime.yaml").is_file()
    pinned = r"storageUri: oci\+native://registry\.example\.com/models/vision:1@sha256:[0-9a-f]{64}$"
    assert re.search(pinned, out, re.M), out
    assert (tmp_path / "deploy-image" / "model-image" / "index.json").is_file()
    assert (tmp_path / "deploy-engine" / "predictor-image" / "Dockerfile").is_file()
    assert (tmp_path / "seldon" / "experiment.yaml").is_file()
    assert (tmp_path / "seldon" / "models" / "vision-a" / "model-settings.json").is_file()
    assert (tmp_path / "seldon-core1" / "seldondeployment.yaml").is_file()
    assert (tmp_path / "seldon-core1" / "models" / "transformer" / "vision.mar").is_file()


@pytest.mark.matrix  # about a minute: two units load under the real wrapper
@pytest.mark.timeout(900)
def test_the_core1_units_run_locally_as_written(tmp_path):
    """docs/seldon.md's local run of the Core 1 graph: the transformer and a model under seldon-core-microservice,
    called as the executor calls them, answer the image archive's top classes; the block stops its units."""
    out = run_blocks(tmp_path, "seldon-core1-export", "seldon-core1-local")  # the block builds its venv first
    assert re.search(r"^\[\{'class_\d+': [0-9.e-]+", out.splitlines()[-1]), out
    deadline = time.monotonic() + 60  # the units stop on the block's SIGTERM, in a few seconds
    while running_in(tmp_path / "seldon-core1") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert running_in(tmp_path / "seldon-core1") == [], "the block left units (or their workers) running"


def running_in(directory: Path) -> list:
    """The pids of processes whose working directory is ``directory`` (the units the block started there)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == directory.resolve():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.matrix
@pytest.mark.timeout(900)
def test_mlserver_runs_as_written(tmp_path):
    out = run_blocks(tmp_path, "mlserver")  # the block builds MLServer's venv first
    assert re.search(r"kitten\.jpg: 200 ", out), out


# A reader's path (issue #47): the README's blocks, then each page's, in the order the README points to them.
# docs/kserve.md's image blocks need root, podman and a Debian root: tests/export/test_kserve_image.py.
READING_ORDER = (
    "flow",
    "curl",
    "torchserve",
    "engine",
    "kserve-export",  # README.md
    "minilm",
    "own-handler",  # docs/handlers.md
    "golden",
    "golden-shadow",  # docs/golden.md
    "signing",  # docs/signing.md
    "kserve-engine-export",
    "kserve-oci-export",  # docs/kserve.md
    "seldon-export",
    "seldon-core1-export",
    "seldon-core1-local",  # docs/seldon.md
    "ts-grpc-stubs",
    "mlserver",  # docs/engines.md
)


@pytest.mark.matrix  # every page in one run: about 20 minutes
@pytest.mark.timeout(3600)
def test_the_pages_run_in_order_in_one_directory(tmp_path):
    """Each test above runs its blocks in a fresh directory; a reader runs them all in one checkout, each block
    after what the blocks before it left there (model-store/ and config/ with every page's archives, a server
    stopped or not). The same blocks, in the reading order, in one directory."""
    assert set(READING_ORDER) == set(blocks()) - set(IMAGE_BLOCKS)
    (tmp_path / "serving").symlink_to(ROOT / "serving")  # ts-grpc-stubs: the checkout's serving/engine/protos
    out = run_blocks(tmp_path, *READING_ORDER, timeout=1200)
    assert len(re.findall(r"kitten\.jpg: 200 ", out)) >= 6, out  # the README's three, signing's two, MLServer's
