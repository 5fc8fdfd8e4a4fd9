"""LocalModel is a worker: TorchServe's worker process, running the handlers/ copy the archive carries,
apart from the installed package and from other LocalModels, one handler instance per LocalModel,
nothing left behind when the load fails. Real archives, real imports: nothing is mocked."""

import base64
import concurrent.futures
import json
import re
import shutil
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from ts.torch_handler.request_envelope.base import BaseEnvelope

import handlers.image
import handlers.loading
import handlers.settings
from archiver import mar
from archiver.cli import main
from helpers.archive_reading import unpack
from samples.image_model import sample_jpeg
from serving.local_model import LoadError, LocalModel

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "batchSize: 4\nhandler:\n  resize: 40\n  crop: 32\n  top_k: 3\n  jpeg_draft: false\n"
IMAGE = sample_jpeg(5, (64, 48))
READY = re.compile(r"tsctl (\w+) ready on ")

# Appended to the bundled copies in an unpacked archive: answers and errors then say which copy ran.
# The import inside _marked runs at call time, so it also checks that the archive's modules are the
# ones `handlers.*` names resolve to while a batch runs.
IMAGE_MARKER = """

MARKER = "edited image.py"
_unmarked = ImageClassifier.postprocess


def _marked(self, output):
    from handlers.protocol import EDITED

    return [dict(answer, copy=MARKER, protocol=EDITED) for answer in _unmarked(self, output)]


ImageClassifier.postprocess = _marked
"""
PROTOCOL_MARKER = """

EDITED = "edited protocol.py"
_body = ClientError.body
ClientError.body = lambda self: dict(_body(self), copy=EDITED)
"""

USER_HANDLER = """\
from handlers.base import entry_point
from handlers.image import ImageClassifier


class Mine(ImageClassifier):
    def postprocess(self, output):
        return [dict(answer, mine=True) for answer in super().postprocess(output)]


handle = entry_point(Mine)
"""
USER_CLASS_HANDLER = """\
from handlers.image import ImageClassifier


class Mine(ImageClassifier):
    pass
"""


def scripted(path: Path, outputs: int = 10) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, outputs),
    ).eval()
    torch.jit.trace(model, torch.randn(1, 3, 32, 32)).save(str(path))
    return path


def package(tmp_path: Path, name: str, handler="image_classifier", config=CONFIG, fmt="default", **extra) -> Path:
    work = tmp_path / f"{name}-src"
    work.mkdir(exist_ok=True)
    (work / "model-config.yaml").write_text(config)
    weights = extra.pop("serialized_file", None) or scripted(work / "tiny.pt")
    return mar.package(
        mar.PackageOptions(
            model_name=name,
            handler=handler,
            serialized_file=str(weights),
            config_file=str(work / "model-config.yaml"),
            export_path=str(tmp_path / "store"),
            archive_format=fmt,
            force=True,
            **extra,
        )
    )


def edit_bundled_copy(model_dir: Path):
    for name, marker in (("image.py", IMAGE_MARKER), ("protocol.py", PROTOCOL_MARKER)):
        path = model_dir / "handlers" / name
        path.write_text(path.read_text() + marker)


def rewritten(archive: Path, out: Path, replace: dict) -> Path:
    """A copy of ``archive`` with some members' bytes replaced (what packaging would refuse to build)."""
    with zipfile.ZipFile(archive) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            target.writestr(info, replace.get(info.filename, source.read(info.filename)))
    return out


def without_marks(answer: dict) -> dict:
    return {k: v for k, v in answer.items() if k not in ("copy", "protocol", "mine")}


class ProcessState:
    """sys.modules, sys.path, the path importer cache and TorchServe's envelope patch, to compare: a
    LocalModel changes none of them (its archive runs in a process of its own)."""

    def __init__(self):
        self.modules = dict(sys.modules)
        self.path = list(sys.path)
        self.envelope = BaseEnvelope.handle

    def assert_unchanged(self, owned=("handlers", "tiny", "mine"), under: Path = None):
        changed = [name for name, module in self.modules.items() if sys.modules.get(name) is not module]
        assert not changed, f"modules replaced or removed: {changed[:10]}"
        added = [name for name in set(sys.modules) - set(self.modules) if name.partition(".")[0] in owned]
        assert not added, f"an archive's modules stayed in sys.modules: {sorted(added)}"
        assert sys.path == self.path
        assert BaseEnvelope.handle is self.envelope
        if under is not None:
            assert not [p for p in sys.path_importer_cache if p.startswith(str(under))]


def installed_file(module) -> Path:
    return Path(module.__file__).resolve()


def ready_lines(model: LocalModel) -> int:
    """How many times the worker initialised a toolkit handler (its ``tsctl CLASS ready on`` line)."""
    return sum(1 for line in model.log if READY.search(line))


def ready_class(model: LocalModel) -> str:
    """The handler class the worker initialised, as its ready line names it."""
    [name] = {READY.search(line).group(1) for line in model.log if READY.search(line)}
    return name


# ---- the archive's copy runs ----------------------------------------------------------------------
def test_the_archives_handlers_copy_runs_and_archives_do_not_mix(tmp_path):
    archive = package(tmp_path, "tiny")
    edited = unpack(archive, tmp_path / "edited")
    edit_bundled_copy(edited)
    state = ProcessState()

    with LocalModel(edited) as mine, LocalModel(archive) as plain:
        [good, bad] = mine.predict([IMAGE, b"not an image"])
        [plain_good, plain_bad] = plain.predict([IMAGE, b"not an image"])
        # each its own worker process, in its own model directory
        assert mine.pid != plain.pid and plain.model_dir != edited
        assert installed_file(handlers.image) == ROOT / "handlers" / "image.py"

        # both open at once, used from two threads, interleaved: every answer from its own copy
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda m: m.predict([IMAGE])[0].json(), [mine, plain] * 6))

    assert good.status == 200 and good.json()["copy"] == "edited image.py"
    assert good.json()["protocol"] == "edited protocol.py"  # imported at call time: the archive's too
    assert bad.status == 400 and bad.json()["copy"] == "edited protocol.py"  # base.py -> .protocol
    assert plain_good.status == 200 and "copy" not in plain_good.json()  # the installed code's answer
    assert plain_bad.json() == {k: v for k, v in bad.json().items() if k != "copy"}
    assert without_marks(good.json()) == plain_good.json()
    assert [("copy" in a) for a in answers] == [True, False] * 6
    assert all(without_marks(a) == plain_good.json() for a in answers)

    # the installed package was never touched, and the process is as it was
    assert (
        not hasattr(handlers.image, "MARKER") and handlers.image.ImageClassifier.postprocess.__name__ == "postprocess"
    )
    assert sys.modules["handlers.image"] is handlers.image
    state.assert_unchanged(under=edited)
    assert not list(edited.rglob("__pycache__")), "LocalModel wrote bytecode into the model directory"


def test_a_users_handler_importing_handlers_gets_the_bundled_copy(tmp_path):
    (tmp_path / "mine.py").write_text(USER_HANDLER)
    archive = package(tmp_path, "mine", handler=str(tmp_path / "mine.py"))
    assert "handlers/image.py" in zipfile.ZipFile(archive).namelist()
    edited = unpack(archive, tmp_path / "edited")
    edit_bundled_copy(edited)
    state = ProcessState()
    with LocalModel(edited) as local:
        [answer] = local.predict([IMAGE])
    assert answer.status == 200
    assert answer.json()["mine"] is True and answer.json()["copy"] == "edited image.py"
    state.assert_unchanged(under=edited)


def test_a_handler_class_in_a_kserve_envelope_from_the_bundled_copy(tmp_path):
    """A handler file defining only a ToolkitHandler subclass: TorchServe instantiates it itself; the
    KServe envelope steps aside for it (each request of the batch answered), and the global envelope
    patch the archive's copy made on import does not outlive the load."""
    (tmp_path / "mine_class.py").write_text(USER_CLASS_HANDLER)
    archive = package(tmp_path, "mineclass", handler=str(tmp_path / "mine_class.py"))
    state = ProcessState()
    body = {"instances": [{"data": base64.b64encode(IMAGE).decode()}] * 2}
    with LocalModel(archive, envelope="kserve") as local:
        responses = local.predict([body, body])
        assert ready_class(local) == "Mine"
    assert [r.status for r in responses] == [200, 200]
    assert [len(r.json()["predictions"]) for r in responses] == [2, 2]
    state.assert_unchanged(owned=("handlers", "mine_class"))


def test_tsctl_run_runs_the_archives_copy(tmp_path):
    edited = unpack(package(tmp_path, "tiny"), tmp_path / "edited")
    edit_bundled_copy(edited)
    (tmp_path / "a.jpg").write_bytes(IMAGE)
    result = CliRunner().invoke(main, ["run", str(edited), str(tmp_path / "a.jpg")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.split(": 200 ", 1)[1])["copy"] == "edited image.py"


@pytest.mark.matrix  # 16 s; make test: test_the_archives_handlers_copy_runs_and_archives_do_not_mix
def test_model_files_of_the_same_name_in_two_archives_do_not_mix(tmp_path):
    """Two archives whose model file is net.py, each with its own class: both open at once."""
    archives = []
    for name, outputs in (("ten", 10), ("four", 4)):
        src = tmp_path / f"{name}-net"
        src.mkdir()
        source = (
            "import torch\n\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"        self.fc = torch.nn.Linear(3, {outputs})\n\n"
            "    def forward(self, x):\n        return self.fc(x.mean(dim=(2, 3)))\n"
        )
        (src / "net.py").write_text(source)
        namespace = {}
        exec(compile(source, str(src / "net.py"), "exec"), namespace)
        torch.save(namespace["Net"]().state_dict(), src / "net.pt")
        config = CONFIG.replace("top_k: 3", "top_k: 10")
        archives.append(
            package(tmp_path, name, config=config, serialized_file=src / "net.pt", model_file=str(src / "net.py"))
        )
    state = ProcessState()
    with LocalModel(archives[0]) as ten, LocalModel(archives[1]) as four:
        for _ in range(2):
            assert len(ten.predict([IMAGE])[0].json()) == 10
            assert len(four.predict([IMAGE])[0].json()) == 4
    state.assert_unchanged(owned=("handlers", "net"))


# ---- one handler instance per LocalModel ----------------------------------------------------------
@pytest.mark.parametrize(
    "bundled", [True, pytest.param(False, marks=pytest.mark.matrix)], ids=["bundled-handlers", "installed-handlers"]
)
def test_settings_are_read_again_when_an_edited_directory_is_opened_again(tmp_path, bundled):
    model_dir = package(tmp_path, "tiny", fmt="no-archive")
    if not bundled:  # handlers.image:handle then comes from the installed package, one module for all
        shutil.rmtree(model_dir / "handlers")
    config = model_dir / "model-config.yaml"

    with LocalModel(model_dir) as first:  # TorchServe's initialize call creates the handler, then kept: one per worker
        assert len(first.predict([IMAGE])[0].json()) == 3
        assert len(first.predict([IMAGE])[0].json()) == 3
        assert ready_class(first) == "ImageClassifier" and ready_lines(first) == 1
        worker = first.pid
    assert first.pid is None

    config.write_text(CONFIG.replace("top_k: 3", "top_k: 2"))
    with LocalModel(model_dir) as second:
        assert second.pid != worker
        assert len(second.predict([IMAGE])[0].json()) == 2
        config.write_text(CONFIG.replace("top_k: 3", "top_k: 1"))
        with LocalModel(model_dir) as third:  # the same directory open twice: two instances
            assert len(third.predict([IMAGE])[0].json()) == 1
            assert len(second.predict([IMAGE])[0].json()) == 2
    with pytest.raises(RuntimeError, match="is closed"):
        second.predict([IMAGE])


# ---- a failing load leaves nothing behind --------------------------------------------------------
def broken_archives(tmp_path: Path) -> dict:
    good = package(tmp_path, "tiny")
    (tmp_path / "mine.py").write_text(USER_HANDLER)
    mine = package(tmp_path, "mine", handler=str(tmp_path / "mine.py"))
    broken = (USER_HANDLER + "\nraise ValueError('mine.py is broken on purpose')\n").encode()
    return {
        "bad weights": (
            rewritten(good, tmp_path / "weights.mar", {"tiny.pt": b"not a model at all"}),
            handlers.loading.ModelLoadError,
            "tiny.pt is not TorchScript",
        ),
        "bad settings": (
            rewritten(good, tmp_path / "settings.mar", {"model-config.yaml": b"handler:\n  topk: 3\n"}),
            handlers.settings.SettingsError,
            "unknown key 'handler.topk'",
        ),
        "handler raises on import": (
            rewritten(mine, tmp_path / "broken.mar", {"mine.py": broken}),  # packaging would refuse it
            ValueError,
            "mine.py is broken on purpose",
        ),
    }


def test_a_failing_load_removes_everything_and_raises_the_handlers_own_error(tmp_path, monkeypatch):
    archives = broken_archives(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr("tempfile.tempdir", None)
    for what, (archive, error, words) in archives.items():
        state = ProcessState()
        with pytest.raises(LoadError) as caught:
            LocalModel(archive)
        exc = caught.value  # raised in the worker: LoadError names it
        assert exc.error_type.rpartition(".")[2] == error.__name__ and words in str(exc), (what, repr(exc))
        if error is not ValueError:  # raised by the archive's own copy of handlers/
            assert exc.error_type == f"{error.__module__}.{error.__name__}", what
        assert not list(scratch.iterdir()), f"{what}: the unpacked archive was left behind"
        state.assert_unchanged(under=scratch)


def test_tsctl_run_of_an_archive_with_bad_settings_is_a_user_mistake(tmp_path):
    archive = rewritten(
        package(tmp_path, "tiny"), tmp_path / "settings.mar", {"model-config.yaml": b"handler:\n  topk: 3\n"}
    )
    (tmp_path / "a.jpg").write_bytes(IMAGE)
    result = CliRunner().invoke(main, ["run", str(archive), str(tmp_path / "a.jpg")])
    assert "unknown key 'handler.topk'; did you mean 'top_k'?" in result.output
    assert result.exit_code == 2, result.output


@pytest.mark.matrix  # 30 s of TorchServe; make test serves the toolkit's handlers on it in test_bundling, the README
def test_a_real_worker_keeps_one_handler_instance_for_its_life(tmp_path):
    """Served by TorchServe: each worker process initialises its handler once, however many batches."""
    from helpers.servers import RunningServer, post_concurrently

    config = "minWorkers: 2\nmaxWorkers: 2\nbatchSize: 4\nmaxBatchDelay: 50\n" + CONFIG.split("\n", 1)[1]
    package(tmp_path, "tiny", config=config)
    with RunningServer(tmp_path / "store") as srv:
        for _ in range(3):
            results = post_concurrently(srv, "tiny", [IMAGE] * 8, "image/jpeg")
            assert [status for status, _ in results] == [200] * 8
        worker = re.compile(r"\bW-\d+-tiny_")  # a worker's stdout lines carry its id
        deadline = time.monotonic() + 30  # TorchServe's log4j writes model_log.log a while after (a busy machine)
        while True:
            lines = (srv.logs / "model_log.log").read_text(errors="replace").splitlines()
            batches = Counter(worker.search(line).group() for line in lines if "tsctl batch size=" in line)
            if sum(batches.values()) >= 6 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    ready = Counter(worker.search(line).group() for line in lines if "tsctl ImageClassifier ready on" in line)
    assert sum(batches.values()) >= 6 and set(batches) <= set(ready), (ready, batches)
    assert set(ready.values()) == {1}, f"a worker initialised its handler more than once: {ready}"


def test_workers_share_the_cores_unless_told_otherwise(monkeypatch):
    """Intra-op threads: torch's default divided among minWorkers, the torch_threads setting when given,
    OMP_NUM_THREADS as the user set it."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        default = handlers.loading.DEFAULT_THREADS
        assert handlers.loading.pick_threads(0, 1) == default == torch.get_num_threads()
        assert handlers.loading.pick_threads(0, 2) == max(1, default // 2) == torch.get_num_threads()
        assert handlers.loading.pick_threads(0, 64) == 1
        assert handlers.loading.pick_threads(3, 2) == 3 == torch.get_num_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)
        assert handlers.loading.pick_threads(0, 4) == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(handlers.settings.SettingsError, match="torch_threads"):
        handlers.settings.read_settings(handlers.settings.Settings, {"torch_threads": -1})
    for too_many in (1025, 2**31, 10**20):  # torch overflowed, or hung allocating a million threads
        with pytest.raises(handlers.settings.SettingsError, match="torch_threads"):
            handlers.settings.read_settings(handlers.settings.Settings, {"torch_threads": too_many})
