"""Workers forked from the fork server vs new processes (serving/worker/fork_server.py; TSCTL_FORK_SERVER=0).

    .venv/bin/python benchmarks/fork_server.py

Three figures, each side alternating with the other, three rounds, medians:
(a) the tsctl engine's cold start, `engine.start` to every worker READY, for a store of resnet18
    (toolkit image_classifier) and a torch-model-archiver echo handler with minWorkers 2 each;
(b) LocalModel opened and answering once, six times in one process (what the test suite and
    `package --golden` for several archives do);
(c) `tsctl run resnet18.mar kitten.jpg` as a whole process (one worker: nothing to share).
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import alternate, median, write_section

from archiver import engines, mar, properties  # noqa: E402
from helpers.engine_limits import archive_handler  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import image_model  # noqa: E402

ECHO = "def handle(data, context):\n    return None if data is None else [str(len(data))] * len(data)\n"
TSCTL = str(Path(sys.executable).parent / "tsctl")


def store_of(tmp: Path) -> Path:
    store = tmp / "model-store"
    store.mkdir()
    sample = image_model.build(tmp / "sample")
    mar.package(
        mar.PackageOptions(
            model_name="resnet18",
            handler="image_classifier",
            serialized_file=str(sample / "resnet18.pt"),
            model_file=str(sample / "model.py"),
            extra_files=[str(sample / "index_to_name.json")],
            config_file=str(sample / "model-config.yaml"),
            export_path=str(store),
        )
    )
    (tmp / "echo.py").write_text(ECHO)
    archive_handler(tmp / "echo.py", ["echo"], store)
    return store


def with_fork_server(on: bool):
    os.environ["TSCTL_FORK_SERVER"] = "1" if on else "0"


def engine_start(store: Path, on: bool):
    def run():
        with_fork_server(on)
        home = short_tmp("fs-")
        config = properties.write_config(store, home / "config.properties", {"minWorkers": 2, "maxWorkers": 2})
        start = time.perf_counter()
        server = engines.named("tsctl").start(store, config=str(config), home=str(home))
        elapsed = time.perf_counter() - start
        engines.named("tsctl").stop(server)
        return round(elapsed, 2)

    return run


def local_models(archive: Path, image: bytes, on: bool):
    def run():
        with_fork_server(on)
        code = (
            "import sys, time; from serving.local_model import LocalModel; start = time.perf_counter()\n"
            f"for _ in range(6):\n    with LocalModel({str(archive)!r}) as m: assert m.predict([{image!r}])[0].status == 200\n"
            "print(time.perf_counter() - start)"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
        return round(float(done.stdout.split()[-1]), 2)

    return run


def tsctl_run(archive: Path, image: Path, on: bool):
    def run():
        with_fork_server(on)
        start = time.perf_counter()
        subprocess.run([TSCTL, "run", str(archive), str(image)], check=True, capture_output=True, env=os.environ)
        return round(time.perf_counter() - start, 2)

    return run


def main():
    tmp = Path(tempfile.mkdtemp(prefix="fork-server-"))
    store = store_of(tmp)
    archive, image = store / "resnet18.mar", tmp / "sample" / "kitten.jpg"
    figures = {}
    for label, make in (
        ("engine cold start, 2 models x 2 workers", lambda on: engine_start(store, on)),
        ("LocalModel x6 in one process", lambda on: local_models(archive, image.read_bytes(), on)),
        ("tsctl run, one image (whole process)", lambda on: tsctl_run(archive, image, on)),
    ):
        results = alternate({"forked": make(True), "new process": make(False)})
        figures[label] = (median(results["forked"]), median(results["new process"]), results)
    rows = "\n".join(
        f"| {label} | {f:.2f} | {n:.2f} | {n / f:.2f}x | {r['forked']} / {r['new process']} |"
        for label, (f, n, r) in figures.items()
    )
    write_section(
        "FORK",
        f"""
## Fork server: workers forked vs new processes

`benchmarks/fork_server.py`: each side alternating, three rounds, medians in seconds (lower is better).
A worker forked from the fork server has torch and TorchServe's worker modules imported already.

| what | forked (s) | new process (s) | speed-up | rounds (forked / new) |
|---|---|---|---|---|
{rows}
""",
    )


if __name__ == "__main__":
    main()
