"""Where P5's text requests spend the machine: the CPU each process takes on each path, and a py-spy
profile of the KServe engine's process, under P5's MiniLM load.

    .venv/bin/python benchmarks/p5_profile.py
"""

from pathlib import Path

from common import profile_process, profile_tables, write_section
from p5_kserve_path import CONCURRENCY, bodies, three_paths

from archiver import server  # noqa: E402

BUCKETS = (
    ("model forward", lambda f: "forward" in f and "modeling" in f),
    ("tokenizer", lambda f: "tokeniz" in f.lower()),
    ("the handler's own work (parse, batch, answer)", lambda f: "handlers/" in f and "engine" not in f),
    (
        "HTTP and KServe (uvicorn, FastAPI, kserve, JSON)",
        lambda f: any(k in f for k in ("uvicorn", "fastapi", "starlette", "kserve", "orjson", "pydantic")),
    ),
)


def java_of(srv):
    return [p for p in server.group_members(srv.pid) if b"java" in Path(f"/proc/{p}/cmdline").read_bytes()]


def torchserve_processes(srv) -> dict:
    worker = server.request(f"{srv.management}/models/minilm")[1][0]["workers"][0]["pid"]
    return {"TorchServe worker (Python)": [worker], "TorchServe frontend (Java)": java_of(srv)}


def main():
    inputs = bodies("minilm")
    path = "/v1/models/minilm:predict"
    with three_paths() as (stack, engine):
        ts = torchserve_processes(stack.torchserve)
        direct = profile_process(
            stack.torchserve.inference + path, inputs, CONCURRENCY, BUCKETS, ts["TorchServe worker (Python)"][0], ts
        )
        wrapped = profile_process(
            stack.url + path,
            inputs,
            CONCURRENCY,
            BUCKETS,
            stack.wrapper.pid,
            dict(ts, **{"kserve_wrapper (Python)": server.group_members(stack.wrapper.pid)}),
        )
        engine_pids = server.group_members(engine.pid)
        own = profile_process(
            engine.inference + path, inputs, CONCURRENCY, BUCKETS, engine.pid, {"KServe engine (Python)": engine_pids}
        )
    write_section(
        "P5-PROFILE",
        f"""
### Where P5's text requests go (profile)

**Whole process**: each path under P5's MiniLM load, the CPU each process takes (cores, of the
machine's), with a py-spy profile of one process.

(a) TorchServe direct ({direct[0]:.0f} requests/s during the profile); py-spy on the worker:

{profile_tables(direct[1], direct[2])}

(b) through kserve_wrapper ({wrapped[0]:.0f} requests/s); py-spy on the wrapper:

{profile_tables(wrapped[1], wrapped[2])}

(c) `--engine tsctl` ({own[0]:.0f} requests/s); py-spy on the engine's process:

{profile_tables(own[1], own[2])}

A MiniLM request is a few milliseconds of model: what each path adds per request decides its rate.
The wrapper is a second Python HTTP server in front of TorchServe: its own parsing and its client
call to TorchServe take CPU from the same cores the model needs, which is why it halves TorchServe's
text throughput, while for resnet18 (P5 above) the forward pass dominates and it costs ~15 %.

The engine does the work of the wrapper and of TorchServe's frontend in one Python process: no second
hop, but its HTTP and KServe handling and the handler's own per-request work share that process (and
its GIL) with the archive's one model thread, where TorchServe's frontend parses HTTP in Java beside
the worker. It leaves part of the 2 cores idle (compare its cores with TorchServe's worker and
frontend together): while the model thread runs a batch, the next cannot start. Several model
threads per archive (TorchServe's workers) would use them; the engine has one, because LocalModel
runs one archive's batches one at a time (its module swap is process-wide).

Reproduce: `.venv/bin/python benchmarks/p5_profile.py`
""",
    )


if __name__ == "__main__":
    main()
