"""Cold start and restart after kill -9: the tsctl engine (workers forked from its fork server, and
spawned as new processes) against TorchServe 0.12, whole processes on the same cores (issue #32, item 6):

    .venv/bin/python benchmarks/cold_start.py

One model store, resnet18 (toolkit image_classifier) and all-MiniLM-L6-v2 (toolkit text_embedder),
one worker each (benchmarks/engine_goals.py's tree):

1. cold start: the server launched to every model READY (``engines.start`` returns then), three rounds,
   the three sides alternating;
2. restart: with the server up and idle (settled: ``fork_server.SETTLE`` s and a few more after the cold
   start, every side alike), each model's worker killed with SIGKILL, and the time until
   the describe API shows a new worker READY and the model answers a request, per model, three rounds
   per side (TorchServe and the engine retry a dead worker at once: BACKOFF's first step is 0 on both).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import median, write_section
from engine_goals import tree

from archiver import engines, server  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import image_model  # noqa: E402
from serving.worker import fork_server  # noqa: E402

SIDES = {  # side: (engine, TSCTL_FORK_SERVER)
    "TorchServe 0.12": ("torchserve", "1"),
    "engine, forked": ("tsctl", "1"),
    "engine, spawned": ("tsctl", "0"),
}
INPUTS = {"resnet18": (image_model.sample_jpeg(1, (640, 480)), "image/jpeg"), "minilm": (b"A sentence.", "text/plain")}


def start(side: str, root: Path):
    engine, fork = SIDES[side]
    os.environ["TSCTL_FORK_SERVER"] = fork  # read by the engine's process, which inherits it
    began = time.monotonic()
    srv = engines.ENGINES[engine].start(
        root / "model-store", root / "config" / "config.properties", short_tmp("cs-"), timeout=300
    )
    return srv, time.monotonic() - began


def worker_pid(srv, model: str):
    status, body = server.request(f"{srv.management}/models/{model}", timeout=10, headers=srv.headers("management"))
    workers = body[0]["workers"] if status == 200 else []
    ready = [w for w in workers if w.get("status") == "READY"]
    return ready[0]["pid"] if len(ready) == 1 else None


def answers(srv, model: str) -> bool:
    body, kind = INPUTS[model]
    status, _ = server.request(engines.predict_url(srv, model), body, "POST", {"Content-Type": kind}, 60)
    return status == 200


def restart(srv, model: str) -> float:
    """SIGKILL to the model's one worker; seconds until a new one is READY and the model answers."""
    assert answers(srv, model)
    old = worker_pid(srv, model)
    os.kill(old, signal.SIGKILL)
    began = time.monotonic()
    while time.monotonic() - began < 120:
        pid = worker_pid(srv, model)
        if pid not in (None, old) and answers(srv, model):
            return time.monotonic() - began
        time.sleep(0.05)
    raise AssertionError(f"{model}: no worker back within 120 s")


# The floor: what the engine's fork server and its two workers must do, with no server around them. One
# process imports torch, then forks two children started together: one imports torchvision and loads
# resnet18's weights, one imports sentence-transformers and loads MiniLM (what the models' handlers import).
FLOOR = """
import os, sys, torch
root = sys.argv[1]
children = {
    "resnet18": "import torchvision; m = torchvision.models.resnet18(); "
    "m.load_state_dict(torch.load(root + '/image/resnet18.pt')); m.eval()",
    "minilm": "from sentence_transformers import SentenceTransformer; SentenceTransformer(root + '/text/minilm', device='cpu')",
}
pids = []
for code in children.values():
    pid = os.fork()
    if pid == 0:
        exec(code)
        os._exit(0)
    pids.append(pid)
sys.exit(max(os.waitpid(pid, 0)[1] for pid in pids))
"""


def floor(root: Path) -> float:
    """Seconds from launching the FLOOR process to both its children having ended."""
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", FLOOR, str(root)], check=True, timeout=300)
    return time.monotonic() - began


def main():
    roots = {workers: tree(Path(short_tmp("cold-")), workers) for workers in (1, 2)}
    cold = {(side, workers): [] for side in [*SIDES, "floor"] for workers in roots}  # the floor's at 2 stays empty
    back = {(side, model): [] for side in SIDES for model in INPUTS}
    names = [*SIDES, "floor"]
    for number in range(3):
        for side in names[number:] + names[:number]:
            for workers, root in roots.items():
                if side == "floor":
                    if workers == 1:
                        cold[(side, workers)].append(round(floor(root), 2))
                    continue
                srv, seconds = start(side, root)
                try:
                    cold[(side, workers)].append(round(seconds, 2))
                    if workers == 1:  # "up and idle": the engine's fork server imports its extras once settled
                        time.sleep(fork_server.SETTLE + 8)
                    for model in INPUTS if workers == 1 else ():
                        back[(side, model)].append(round(restart(srv, model), 2))
                finally:
                    server.stop(srv)
            print(
                f"round {number + 1} {side}: cold {[cold[(side, w)][-1] for w in roots if cold[(side, w)]]}s, restarts "
                f"{[back[(side, m)][-1] for m in INPUTS if side in SIDES]}",
                flush=True,
            )
    write_section("COLD", report(cold, back))


def report(cold: dict, back: dict) -> str:
    rows = [
        "| side | cold start, 1 worker each (s) | vs TorchServe | cold start, 2 workers each (s) | vs TorchServe "
        "| resnet18 back (s) | MiniLM back (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    reference = {workers: median(cold[("TorchServe 0.12", workers)]) for workers in (1, 2)}
    for side in [*SIDES, "floor"]:
        one = median(cold[(side, 1)])
        restarts = [f"{median(back[(side, m)]):.2f}" if side in SIDES else "-" for m in INPUTS]
        twos = "- | -"  # the floor is not measured at 2 workers: a server sharing imports goes below 4 processes
        if side in SIDES:
            two = median(cold[(side, 2)])
            twos = f"{two:.2f} {cold[(side, 2)]} | {two / reference[2]:.2f}x"
        rows.append(
            f"| {side} | {one:.2f} {cold[(side, 1)]} | {one / reference[1]:.2f}x | {twos} | {' | '.join(restarts)} |"
        )
    return (
        "## Cold start and restart after kill -9 (issue #32)\n\n`benchmarks/cold_start.py`: resnet18 and "
        "all-MiniLM-L6-v2; cold start is launch to every model READY (1 and 2 workers per model), restart is "
        "SIGKILL to an idle worker until a new one is READY and answers (1 worker each); medians of three "
        "alternating rounds, each round's figure in brackets. **floor** is no server at all: one process imports "
        "torch, then forks two children at once, one importing torchvision and loading resnet18's weights, one "
        "importing sentence-transformers and loading MiniLM (what the engine's fork server and its two workers do, "
        "with no frontend; not measured at 2 workers).\n\n" + "\n".join(rows) + "\n\n" + READING
    )


READING = """Reading it: no server starts these two models in half TorchServe's time. The floor's own time is
nearly all imports every server's workers pay (torch, then torchvision for resnet18 and sentence-transformers,
which imports scikit-learn and scipy, for MiniLM); the engine's frontend starts while its fork server imports
torch, so the forked engine is within noise of the floor. The fork server pays where a worker starts again:
after kill -9 a resnet18 worker is back in a small fraction of TorchServe's time, a MiniLM worker in under half
(it still imports sentence-transformers itself, which the fork server's idle imports do not include). The
restarts are of a settled server: the fork server imports those extras once no worker has started for 30 s
(`fork_server.SETTLE`), and the benchmark waits that long after each cold start; a worker killed sooner imports
them itself, as a cold start's do."""


if __name__ == "__main__":
    main()
