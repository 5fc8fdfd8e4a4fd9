"""Cold start and restart after kill -9: the tsctl engine (workers forked from its fork server, and
spawned as new processes) against TorchServe 0.12, whole processes on the same cores (issue #32, item 6):

    .venv/bin/python benchmarks/cold_start.py

One model store, resnet18 (toolkit image_classifier) and all-MiniLM-L6-v2 (toolkit text_embedder),
one worker each (benchmarks/engine_goals.py's tree):

1. cold start: the server launched to every model READY (``engines.start`` returns then), three rounds,
   the three sides alternating;
2. restart: with the server up and idle, each model's worker killed with SIGKILL, and the time until
   the describe API shows a new worker READY and the model answers a request, per model, three rounds
   per side (TorchServe and the engine retry a dead worker at once: BACKOFF's first step is 0 on both).
"""

import os
import signal
import time
from pathlib import Path

from common import median, write_section
from engine_goals import tree

from archiver import engines, server  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import image_model  # noqa: E402

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


def main():
    root = tree(Path(short_tmp("cold-")), 1)
    cold = {side: [] for side in SIDES}
    back = {(side, model): [] for side in SIDES for model in INPUTS}
    names = list(SIDES)
    for number in range(3):
        for side in names[number:] + names[:number]:
            srv, seconds = start(side, root)
            try:
                cold[side].append(round(seconds, 2))
                for model in INPUTS:
                    back[(side, model)].append(round(restart(srv, model), 2))
            finally:
                server.stop(srv)
            print(f"round {number + 1} {side}: cold {seconds:.2f}s, restarts "
                  f"{[back[(side, m)][-1] for m in INPUTS]}", flush=True)  # fmt: skip
    reference = median(cold["TorchServe 0.12"])
    rows = ["| side | cold start (s) | vs TorchServe | resnet18 back (s) | MiniLM back (s) | rounds (cold) |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for side in SIDES:
        rows.append(
            f"| {side} | {median(cold[side]):.2f} | {median(cold[side]) / reference:.2f}x | "
            f"{median(back[(side, 'resnet18')]):.2f} | {median(back[(side, 'minilm')]):.2f} | {cold[side]} |"
        )
    write_section(
        "COLD",
        "## Cold start and restart after kill -9 (issue #32)\n\n`benchmarks/cold_start.py`: resnet18 and "
        "all-MiniLM-L6-v2, one worker each; cold start is launch to every model READY, restart is SIGKILL "
        "to an idle worker until a new one is READY and answers; medians of three alternating rounds.\n\n"
        + "\n".join(rows),
    )


if __name__ == "__main__":
    main()
