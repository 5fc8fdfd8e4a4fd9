"""What every benchmark script shares: the machine it ran on, alternating rounds, BENCHMARKS.md sections."""

import collections
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
PLOTS = ROOT / "benchmarks" / "plots"


def machine() -> str:
    packages = ", ".join(f"{p} {version(p)}" for p in ("torch", "torchvision", "torchserve", "transformers"))
    return f"{os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}, {packages}"


def alternate(sides: dict, rounds: int = 3) -> dict:
    """Run each side's function once per round, in turn, each round starting one side later
    (A B C, B C A, C A B): drift in the machine's speed falls on every side alike.
    Returns {side: [result per round]}."""
    results = {name: [] for name in sides}
    names = list(sides)
    for round_number in range(rounds):
        order = names[round_number % len(names) :] + names[: round_number % len(names)]
        for name in order:
            run = sides[name]
            value = run()
            results[name].append(value)
            print(f"round {round_number + 1} {name}: {value}", flush=True)
    return results


def served_side(srv, model: str, inputs, concurrency: int, requests: int):
    """A benchmark side against a running server: a short warm-up, then ``requests`` requests.
    Returns throughput (requests/s); ``.latency`` keeps each round's latency percentiles."""
    from archiver import engines
    from archiver.capacity import bench

    def run():
        url = engines.predict_url(srv, model)
        bench.run_load(url, inputs, concurrency, requests=32)
        result = bench.run_load(url, inputs, concurrency, requests=requests)
        assert result.errors == 0, result.statuses
        run.latency.append(result.summary()["latency_ms"])
        return round(result.throughput, 2)

    run.latency = []
    return run


def median(values):
    return statistics.median(values)


def write_section(key: str, markdown: str):
    """Replace the section between <!-- KEY --> markers in BENCHMARKS.md (appending it if new)."""
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else "# Benchmarks\n"
    block = (
        f"<!-- {key} -->\n{markdown.strip()}\n\n_Measured {time.strftime('%Y-%m-%d')} on {machine()}._\n<!-- /{key} -->"
    )
    pattern = re.compile(rf"<!-- {key} -->.*?<!-- /{key} -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    BENCHMARKS_MD.write_text(text)
    print(block)


def bar_plot(name: str, title: str, labels, values, ylabel: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    PLOTS.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    ax.bar(labels, values, color=["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"] * 2)
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.1f}", ha="center", va="bottom")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    path = PLOTS / f"{name}.png"
    fig.savefig(path)
    plt.close(fig)
    return f"![{title}](benchmarks/plots/{name}.png)"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile_worker(srv, model: str, inputs, concurrency: int, buckets, seconds: int = 10):
    """Under load, py-spy the model's (first) TorchServe worker and count each process's CPU.

    Returns (throughput, {bucket: share of the worker's samples}, {process: cores used})."""
    from archiver import server

    url = f"{srv.inference}/predictions/{model}"
    workers = [w["pid"] for w in server.request(f"{srv.management}/models/{model}")[1][0]["workers"]]
    java = [p for p in server.group_members(srv.pid) if b"java" in Path(f"/proc/{p}/cmdline").read_bytes()]
    label = "worker (Python)" if len(workers) == 1 else f"{len(workers)} workers (Python), together"
    return profile_process(url, inputs, concurrency, buckets, workers[0], {label: workers, "frontend (Java)": java})


def profile_process(url: str, inputs, concurrency: int, buckets, spied: int, processes: dict, seconds: int = 10):
    """Under load on ``url``, py-spy process ``spied`` and count the CPU of each of ``processes``
    ({label: pids}; the load generator is added).

    Returns (throughput, {bucket: share of the spied process's samples}, {process: cores used})."""
    from archiver.capacity import bench

    bench.run_load(url, inputs, concurrency, requests=64)
    processes = dict(processes, **{"load generator": [os.getpid()]})
    before = {name: sum(cpu_seconds(p) for p in pids) for name, pids in processes.items()}
    result = {}
    load = threading.Thread(
        target=lambda: result.update(bench.run_load(url, inputs, concurrency, duration=seconds + 2).summary())
    )
    started = time.monotonic()
    load.start()
    time.sleep(1)
    raw = Path(tempfile.mkdtemp()) / "worker.txt"
    subprocess.run(
        [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "-p",
            str(spied),
            "-d",
            str(seconds),
            "-f",
            "raw",
            "-o",
            str(raw),
            "--nonblocking",
        ],
        check=True,
        capture_output=True,
    )
    load.join()
    wall = time.monotonic() - started
    cores = {name: (sum(cpu_seconds(p) for p in pids) - before[name]) / wall for name, pids in processes.items()}
    samples, total = collections.Counter(), 0
    for line in raw.read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        total += int(count)
        frames = stack.split(";")
        bucket = next((name for name, match in buckets if any(match(f) for f in frames)), "other")
        samples[bucket] += int(count)
    shares = {name: samples[name] / total for name, _ in list(buckets) + [("other", None)]}
    return result["throughput_rps"], shares, cores


def profile_tables(shares: dict, cores: dict) -> str:
    rows = "\n".join(f"| {name} | {share * 100:.1f} % |" for name, share in shares.items())
    cpu_rows = "\n".join(f"| {name} | {value:.2f} |" for name, value in cores.items())
    return (
        f"| where the worker's CPU samples are | share |\n|---|---|\n{rows}\n\n"
        f"| process | cores used (of {os.cpu_count()}) |\n|---|---|\n{cpu_rows}"
    )


def percentile(values, share: float) -> float:
    """The value at ``share`` (0.9: the 90th percentile) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]
