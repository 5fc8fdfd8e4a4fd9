"""A new user's slips on a fresh clone (issue #47): each answered in one sentence (``error: ...`` on stderr,
exit 2; under ``--json`` the same sentence in the JSON error) naming the file, key or flag and the fix, or
doing what a KServe or TorchServe user expects."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from archiver import mar, properties
from archiver.cli import main
from helpers.hostile import scripted
from helpers.models import stand_in_torchscript
from helpers.paths import ROOT
from helpers.processes import kill, session_members

BASE_HANDLER = "from ts.torch_handler.base_handler import BaseHandler\n\n\nclass Mine(BaseHandler):\n    pass\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """model-store/ with tensor.mar (TorchScript), img.mar (image_classifier), txt.mar (text_classifier),
    mine.mar (a handler of the user's own) and config/config.properties naming them; the weights beside."""
    root = tmp_path_factory.mktemp("slips")
    store = root / "model-store"
    scripted(root / "tensor.pt", torch.nn.Linear(4, 2))
    stand_in_torchscript(root / "img.pt")
    text = root / "text"
    text.mkdir()
    (text / "config.json").write_text('{"model_type": "bert", "architectures": ["BertForSequenceClassification"]}')
    (text / "tokenizer.json").write_text("{}")
    (text / "model.safetensors").write_bytes(b"x")
    (root / "mine.py").write_text(BASE_HANDLER)
    for name, handler, weights in (
        ("tensor", "tensor", "tensor.pt"),
        ("img", "image_classifier", "img.pt"),
        ("txt", "text_classifier", "text"),
        ("mine", "mine.py", "tensor.pt"),
    ):
        options = mar.PackageOptions(
            model_name=name,
            handler=str(root / handler) if handler.endswith(".py") else handler,
            serialized_file=str(root / weights),
            export_path=str(store),
        )
        mar.package(options)
    properties.write_config(store, root / "config" / "config.properties")
    torch.save(torch.nn.Linear(4, 2).state_dict(), root / "state_dict.pt")
    (root / "inputs").mkdir()
    (root / "inputs" / "row.json").write_text("[[1, 2, 3, 4]]")
    return root


def tsctl(cwd, *args):
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, [str(a) for a in args])
    finally:
        os.chdir(previous)


def one_line(done, *words, code=2) -> str:
    """The command's one error line (exit ``code``), holding each of ``words``; the same under --json."""
    lines = done.stderr.strip().splitlines()
    assert done.exit_code == code and len(lines) == 1 and lines[0].startswith("error: "), done.output
    assert "Traceback" not in done.output and all(w in lines[0] for w in words), (words, lines)
    return lines[0]


def same_under_json(cwd, args, line: str, code=2):
    done = tsctl(cwd, *args, "--json")
    assert done.exit_code == code, done.output
    assert f"error: {json.loads(done.stdout)['error']['message']}" == line, (done.stdout, line)


# ---- 1: export kserve --min-replicas without --autoscale ---------------------------------------------------
KSERVE = ["export", "kserve", "--name", "demo", "--storage-uri", "pvc://models/demo"]


@pytest.mark.parametrize("replicas", [0, 2])
def test_min_replicas_without_autoscale_is_the_predictor_s_min_replicas(project, tmp_path, replicas):
    """--min-replicas 2 without --autoscale exited 0 and wrote no minReplicas: KServe's predictor takes it
    alone (its default is 1), so it is written, and checked against the CRD as every manifest is."""
    out = tmp_path / "out"
    done = tsctl(project, *KSERVE, out, "--min-replicas", replicas)
    assert done.exit_code == 0, done.output
    isvc = yaml.safe_load((out / "inferenceservice.yaml").read_text())
    assert isvc["spec"]["predictor"]["minReplicas"] == replicas, isvc
    assert "maxReplicas" not in isvc["spec"]["predictor"] and "annotations" not in isvc["metadata"], isvc


def test_max_replicas_without_autoscale_is_the_predictor_s_max_replicas(project, tmp_path):
    """--max-replicas without --autoscale was refused ("sizes the autoscaling"): KServe's predictor takes it
    alone, as the bound of its default autoscaler (Knative's, or the HPA of a raw deployment)."""
    out = tmp_path / "out"
    done = tsctl(project, *KSERVE, out, "--min-replicas", 2, "--max-replicas", 5)
    assert done.exit_code == 0, done.output
    predictor = yaml.safe_load((out / "inferenceservice.yaml").read_text())["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 5), predictor
    args = [*KSERVE, tmp_path / "bad", "--min-replicas", 3, "--max-replicas", 2]
    one_line(tsctl(project, *args), "--min-replicas 3 is above --max-replicas 2")
    one_line(tsctl(project, *KSERVE, tmp_path / "bad", "--max-replicas", 0), "--max-replicas 0 must be at least 1")
    assert not (tmp_path / "bad").exists()


def test_min_replicas_below_zero_is_one_line(project, tmp_path):
    args = [*KSERVE, tmp_path / "out", "--min-replicas", "-1"]
    line = one_line(tsctl(project, *args), "--min-replicas -1", "0 or more")
    same_under_json(project, args, line)
    assert not (tmp_path / "out").exists()


# ---- 2: an A/B between models that take different inputs ----------------------------------------------------
def test_an_ab_between_an_image_and_a_text_model_names_both_archives(project, tmp_path):
    """The refusal named the models alone: it names both archives and what each takes."""
    for args in (["--ab", "img=50", "--ab", "txt=50"], ["--ab", "img=50", "--ab", "tensor=50"]):
        command = ["export", "seldon", tmp_path / "out", "--image", "registry.example.com/tsctl:1", *args]
        line = one_line(tsctl(project, *command), "--ab", "model-store/img.mar", "takes image")
        assert "model-store/txt.mar" in line or "model-store/tensor.mar" in line, line
        same_under_json(project, command, line)
    assert not (tmp_path / "out").exists()


def test_an_ab_with_a_handler_of_the_user_s_own_is_accepted_with_a_note(project, tmp_path):
    """A handler of the user's own says nothing of its input: the A/B was accepted without a word."""
    command = [
        "export",
        "seldon",
        tmp_path / "out",
        "--image",
        "registry.example.com/tsctl:1",
        "--ab",
        "tensor=50",
        "--ab",
        "mine=50",
    ]
    done = tsctl(project, *command)
    assert done.exit_code == 0, done.output
    notes = [line for line in done.stdout.splitlines() if line.startswith("note: --ab")]
    assert len(notes) == 1 and "note: --ab: tsctl cannot tell what model-store/mine.mar's handler (" in notes[0], notes
    assert "model-store/tensor.mar" in notes[0], notes


# ---- 3: a state_dict packaged without --model-file ---------------------------------------------------------
def test_a_state_dict_without_model_file_says_so(project, tmp_path):
    """A handler subclassing TorchServe's BaseHandler loads a .pt without a model file as TorchScript: torch
    said "...your checkpoint file is corrupted", exit 1."""
    args = [
        "package",
        "--model-name",
        "sd",
        "--handler",
        "mine.py",
        "--serialized-file",
        "state_dict.pt",
        "--export-path",
        tmp_path / "out",
        "--golden",
        "inputs",
    ]
    line = one_line(tsctl(project, *args), "state_dict.pt is a state_dict", "--model-file", "eager mode")
    assert "corrupted" not in line and not (tmp_path / "out" / "sd.mar").exists(), line
    same_under_json(project, args, line)


# ---- 4: tsctl run on a weights file --------------------------------------------------------------------------
def legacy_pickle(path: Path) -> Path:
    torch.save(torch.nn.Linear(4, 2).state_dict(), path, _use_new_zipfile_serialization=False)
    return path


@pytest.mark.parametrize("weights", ["state_dict.pt", "tensor.pt", "legacy.pt"])
def test_run_on_a_pytorch_file_says_to_package_it(project, weights):
    """tsctl run state_dict.pt spoke of zip data descriptors; a legacy pickle "is not a model archive ... or
    it is truncated"."""
    legacy_pickle(project / "legacy.pt")
    args = ["run", weights, "inputs/row.json"]
    line = one_line(tsctl(project, *args), f"{weights} is a PyTorch file", "not a model archive", "tsctl package")
    assert "data descriptor" not in line and "truncated" not in line, line
    same_under_json(project, args, line)


# ---- 5: serve --model-store naming another store than the config's --------------------------------------------
def test_serve_with_another_model_store_names_it_and_the_fix(project, tmp_path):
    """It said to regenerate the project's config: the config is fine, the store given lacks its archives."""
    (project / "otherdir").mkdir(exist_ok=True)
    args = ["serve", "--model-store", "otherdir", "--home", tmp_path / "home"]
    line = one_line(tsctl(project, *args), "otherdir", "config/config.properties", "--model-store")
    assert "tsctl config --model-store" in line and "regenerate" not in line, line
    same_under_json(project, args, line)


# ---- 6: --config /dev/null ---------------------------------------------------------------------------------
def test_config_dev_null_is_read_as_an_empty_config(project, tmp_path):
    """It said /dev/null does not exist; TorchServe's ConfigManager loads whatever file exists (an empty one:
    no keys), so it is read, and found to name no models."""
    args = ["serve", "--config", "/dev/null", "--home", tmp_path / "home"]
    line = one_line(tsctl(project, *args), "/dev/null", "model_snapshot", "tsctl config")
    assert "does not exist" not in line, line
    same_under_json(project, args, line)
    folder = one_line(tsctl(project, "serve", "--config", "config", "--home", tmp_path / "home"), "config")
    assert "is a directory" in folder, folder


# ---- 7: Ctrl-C during package --golden ---------------------------------------------------------------------
SLOW_HANDLER = (  # says it is computing (MARK: a file it creates), then takes its time
    "import pathlib\nimport time\n\nfrom ts.torch_handler.base_handler import BaseHandler\n\n\n"
    "class Slow(BaseHandler):\n"
    "    def handle(self, data, context):\n        pathlib.Path(MARK).touch()\n        time.sleep(300)\n"
    "        return super().handle(data, context)\n"
)


def test_ctrl_c_during_package_golden_is_one_line_and_leaves_nothing(project, tmp_path):
    """Ctrl-C printed "Aborted!" and the fork server's BrokenPipeError traceback, exit 1. Sent as a terminal
    sends it (to the command's process group) while the handler computes the golden answers (it says so
    with a file, then sleeps: the tensor handler finished first under load, the signal too late; sent once
    a second process ran, the signal once came before the worker and the command outlived 60 s)."""
    temp, mark = tmp_path / "tmp", tmp_path / "handling"
    temp.mkdir()
    (tmp_path / "slow.py").write_text(f"MARK = {str(mark)!r}\n" + SLOW_HANDLER)
    command = [
        sys.executable,
        "-m",
        "archiver.cli",
        "package",
        "--model-name",
        "t",
        "--handler",
        tmp_path / "slow.py",
        "--serialized-file",
        "tensor.pt",
        "--golden",
        "inputs",
        "--export-path",
        tmp_path / "out",
    ]
    process = subprocess.Popen(
        [str(part) for part in command],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(temp)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=as_from_a_terminal,
    )
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert mark.exists(), f"the handler never ran: {process.communicate(timeout=60)}"
        os.killpg(process.pid, signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            still = described(session_members(process.pid))
            raise AssertionError(f"still running 60 s after Ctrl-C: {still}") from None
    finally:
        kill([process.pid] if process.poll() is None else [])
    deadline = time.monotonic() + 10
    while session_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = session_members(process.pid)
    kill(left)
    assert process.returncode == 130 and stderr.strip().splitlines() == ["error: interrupted (Ctrl-C)"], stderr
    assert left == [] and list(temp.iterdir()) == [] and not (tmp_path / "out").exists(), (left, list(temp.iterdir()))


def as_from_a_terminal():
    """SIGINT's default, as a command typed at a terminal has it: a suite started in the background by a
    shell without job control (`make test &` in a script, nohup) ignores SIGINT, and every process below it
    inherits that, so the command would never see the Ctrl-C (seen twice: "still running 60 s after")."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def described(pids) -> list:
    """Each process's pid and command line, to say what still ran."""
    found = []
    for pid in pids:
        try:
            found.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes().replace(bytes(1), b' ').decode()[:200]}")
        except OSError:
            found.append(f"{pid}: (ended)")
    return found


def test_a_relative_python_for_mlserver_is_made_absolute(monkeypatch):
    """The path 'make runtimes' suggests, given relative: MLServer starts in its home, where the relative
    path was not found (a FileNotFoundError traceback before; #44's newcomer)."""
    from archiver import mlserver
    from samples import runtime_env

    python = Path(runtime_env.ensure_mlserver())
    monkeypatch.chdir(python.parent.parent.parent)
    relative = os.path.relpath(python)
    assert not os.path.isabs(relative) and mlserver.find_python(relative) == str(python.parent.parent.parent / relative)
