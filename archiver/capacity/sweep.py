"""One replica's capacity: ``tsctl bench MODEL --capacity`` (docs/capacity.md).

A concurrency sweep (1, 2, 4, 8, ... up to ``max_concurrency``), each step a bounded load run
(``bench.run_load``: at most ``requests`` requests and ``seconds`` seconds) with the engine's queue
depth sampled from its ``/metrics`` every ``SAMPLE_SECONDS`` meanwhile. The sweep stops at the first of:
a step with errors; a p99 above ``P99_STOP`` times the target; ``FLAT_STEPS`` steps in a row that each
add less than ``GROWTH`` to the best throughput before them; the largest concurrency. Then:

- the **knee**: the smallest concurrency whose throughput is at least ``KNEE_SHARE`` of the best
  throughput of the steps without errors (more clients past it add queueing, not answers);
- **within p99**: the largest concurrency without errors whose p99 is at most the target, drawn from at
  least ``MIN_P99_REQUESTS`` answers (a p99 of fewer is their slowest one or two, not a percentile: such a
  step is kept, marked in the result's notes, and not used).

The machine's load is recorded with it: its CPUs and 1-minute load average before the sweep (``machine``),
and each step's at its end, so that a sweep on a busy machine says so.

The result is one JSON document, ``FORMAT`` (docs/capacity.md has the contract); ``load`` reads and
checks one for the code that builds on it (the autoscaling export, the simulator).
"""

import json
import os
import re
import statistics
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import UserError
from ..output import quiet

FORMAT = "tsctl-capacity/1"
GROWTH = 0.05  # a step adding less than 5% to the best throughput before it is flat
FLAT_STEPS = 2  # that many flat steps in a row end the sweep
KNEE_SHARE = 0.95  # the knee: the first concurrency reaching 95% of the best throughput
P99_STOP = 2  # a p99 past twice the target ends the sweep
SAMPLE_SECONDS = 0.1  # how often the queue-depth gauge is read during a step
QUEUE_GAUGE = "ts_queue_size"
MAX_BYTES = 16 << 20  # a result file's size at most: 256 steps are under 200 KiB
MIN_P99_REQUESTS = 100  # the answers a step's p99 must be drawn from to be used (within_p99)
BUSY_LOAD = 0.5  # a 1-minute load average above this share of the CPUs before the sweep: the machine was busy


def concurrencies(largest: int) -> List[int]:
    """1, 2, 4, ... below ``largest``, then ``largest``."""
    steps, value = [], 1
    while value < largest:
        steps.append(value)
        value *= 2
    return steps + [largest]


def clean(steps: Sequence[dict]) -> List[dict]:
    """The steps that answered every request."""
    return [s for s in steps if s["errors"] == 0 and s["requests"] > 0]


def knee(steps: Sequence[dict]) -> Optional[dict]:
    """The smallest concurrency reaching ``KNEE_SHARE`` of the best throughput of the clean steps; None
    without any."""
    good = clean(steps)
    if not good:
        return None
    best = max(s["throughput_rps"] for s in good)
    first = min((s for s in good if s["throughput_rps"] >= KNEE_SHARE * best), key=lambda s: s["concurrency"])
    return point(first)


def within_p99(steps: Sequence[dict], target_ms: Optional[float]) -> Optional[dict]:
    """The largest concurrency of the clean steps whose p99 is at most ``target_ms``; None without a
    target or when none holds it."""
    if target_ms is None:
        return None
    held = [s for s in clean(steps) if s["p99_ms"] is not None and s["p99_ms"] <= target_ms and p99_counts(s)]
    return point(max(held, key=lambda s: s["concurrency"])) if held else None


def p99_counts(step: dict) -> bool:
    """Whether the step's p99 is drawn from enough answers (``MIN_P99_REQUESTS``) to be a percentile."""
    return step["requests"] - step["errors"] >= MIN_P99_REQUESTS


def few_notes(steps: Sequence[dict]) -> List[str]:
    """One note naming the steps whose p99 is drawn from too few answers to be used, or none."""
    few = [s for s in steps if s["p99_ms"] is not None and not p99_counts(s)]
    if not few:
        return []
    counts = ", ".join(f"{s['requests'] - s['errors']} at concurrency {s['concurrency']}" for s in few)
    return [
        f"p99 from too few answers ({counts}; under {MIN_P99_REQUESTS}): not a percentile, not used for "
        f"within_p99; measure with --requests {MIN_P99_REQUESTS} or more and a --duration long enough for "
        "them"
    ]


def machine() -> dict:
    """This machine's CPUs and 1-minute load average now (null where the system gives none)."""
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"cpus": os.cpu_count(), "load_average": load}


def busy_notes(measured: Optional[dict]) -> List[str]:
    """One note when the machine was busy before the sweep (``BUSY_LOAD``), or none."""
    load, cpus = (measured or {}).get("load_average"), (measured or {}).get("cpus")
    if load is None or not cpus or load <= BUSY_LOAD * cpus:
        return []
    return [
        f"the machine was busy before the sweep (1-minute load average {load:g} on {cpus} CPUs): other work "
        "shared its CPUs, so the throughput and p99 are lower bounds; measure on a quiet machine"
    ]


def point(step: dict) -> dict:
    return {key: step[key] for key in ("concurrency", "throughput_rps", "p99_ms")}


def stop_reason(steps: Sequence[dict], target_ms: Optional[float]) -> Optional[str]:
    """Why the sweep ends after the last of ``steps`` (None: it goes on): ``errors``, ``p99`` (past
    ``P99_STOP`` times the target) or ``flat`` (``FLAT_STEPS`` steps each adding under ``GROWTH``)."""
    last = steps[-1]
    if last["errors"] or not last["requests"]:
        return "errors"
    if target_ms is not None and last["p99_ms"] is not None and last["p99_ms"] > P99_STOP * target_ms:
        return "p99"
    if len(steps) > FLAT_STEPS:
        rates = [s["throughput_rps"] for s in steps]
        flat = [rates[i] < (1 + GROWTH) * max(rates[:i]) for i in range(len(rates) - FLAT_STEPS, len(rates))]
        if all(flat):
            return "flat"
    return None


# -- the queue-depth gauge ------------------------------------------------------------------------

SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def queue_depth(exposition: str, model: str) -> Optional[float]:
    """``model``'s ``ts_queue_size`` in a Prometheus exposition, summed over its versions; None when the
    text has none for it."""
    total, found = 0.0, False
    for line in exposition.splitlines():
        match = SAMPLE.match(line)
        if not match or match.group(1) != QUEUE_GAUGE:
            continue
        if dict(LABEL.findall(match.group(2))).get("model_name") == model:
            total, found = total + float(match.group(3)), True
    return total if found else None


def read_gauge(metrics_url: Optional[str], model: str) -> Optional[float]:
    """The gauge now, from the server's /metrics (no key: TorchServe's and the engine's are open)."""
    from ..server import request

    if not metrics_url:
        return None
    try:
        status, body = request(metrics_url, timeout=2)
    except OSError:
        return None
    return queue_depth(body, model) if status == 200 and isinstance(body, str) else None


class QueueSampler:
    """Reads the gauge every ``SAMPLE_SECONDS`` from a thread of its own until ``stop()``; ``summary()``:
    ``{"mean", "max", "samples"}``, None when no read found the gauge."""

    def __init__(self, metrics_url: Optional[str], model: str):
        self.values: List[float] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(metrics_url, model), daemon=True)
        if metrics_url:
            self.thread.start()

    def _run(self, metrics_url: str, model: str):
        while not self.done.is_set():
            value = read_gauge(metrics_url, model)
            if value is not None:
                self.values.append(value)
            self.done.wait(SAMPLE_SECONDS)

    def stop(self) -> Optional[dict]:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(5)
        if not self.values:
            return None
        return {"mean": round(statistics.fmean(self.values), 2), "max": max(self.values), "samples": len(self.values)}


# -- the sweep ------------------------------------------------------------------------------------


def step(
    url: str, inputs, concurrency: int, requests: int, seconds: float, headers=None, metrics_url=None, model: str = ""
) -> dict:
    """One load run at ``concurrency`` bounded by ``requests`` and ``seconds``, with the queue sampled
    (``metrics_url`` None: not sampled, ``queue_depth`` null)."""
    from .bench import run_load

    sampler = QueueSampler(metrics_url, model)
    try:
        result = run_load(url, inputs, concurrency, requests=requests, duration=seconds, headers=headers)
    finally:
        queue = sampler.stop()
    summary = result.summary()
    lat = summary["latency_ms"]
    number = lambda v: None if v != v else v  # noqa: E731 (NaN: nothing answered 200)
    return {
        "concurrency": concurrency,
        "requests": summary["requests"],
        "seconds": summary["seconds"],
        "throughput_rps": summary["throughput_rps"],
        "p50_ms": number(lat["p50"]),
        "p90_ms": number(lat["p90"]),
        "p99_ms": number(lat["p99"]),
        "errors": summary["errors"],
        "statuses": summary["statuses"],
        "queue_depth": queue,
        "load_average": machine()["load_average"],
    }


def step_line(s: dict) -> str:
    """One step as the progress lines and the table's notes say it."""
    p99 = "-" if s["p99_ms"] is None else f"{s['p99_ms']:.1f} ms"
    return f"concurrency {s['concurrency']}: {s['throughput_rps']:.1f} req/s, p99 {p99}, {s['errors']} errors"


def sweep(
    url: str,
    inputs,
    model: str,
    max_concurrency: int,
    requests: int,
    seconds: float,
    p99_ms: Optional[float] = None,
    headers=None,
    metrics_url: Optional[str] = None,
    progress: Callable[[str], None] = quiet,
) -> Tuple[List[dict], str]:
    """The steps up to the knee (module docstring) and why it stopped: errors, p99, flat or bound (the
    largest concurrency was reached). A short warm-up first, not counted."""
    from .bench import run_load

    progress(f"{model}: warming up")
    run_load(url, inputs, min(2, max_concurrency), requests=16, duration=seconds, headers=headers)
    steps: List[dict] = []
    for concurrency in concurrencies(max_concurrency):
        progress(f"{model}: concurrency {concurrency}")
        steps.append(step(url, inputs, concurrency, requests, seconds, headers, metrics_url, model))
        progress(step_line(steps[-1]))
        reason = stop_reason(steps, p99_ms)
        if reason:
            return steps, reason
    return steps, "bound"


# -- the result file ------------------------------------------------------------------------------


def document(
    model: str,
    engine: str,
    server: dict,
    files: Sequence[Tuple[str, int]],
    p99_ms: Optional[float],
    steps: List[dict],
    stopped: str,
    notes: Sequence[str] = (),
    gpus: Sequence[dict] = (),
    measured_on: Optional[dict] = None,
) -> dict:
    """The result (FORMAT): what was measured and how (``gpus``: those the model's workers ran on, by id, name
    and memory; none on the CPU; ``measured_on``: ``machine()`` before the sweep), the steps, the knee and
    the p99 point, with notes on a busy machine and on p99s from too few answers."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        tsctl_version = version("tsctl")
    except PackageNotFoundError:
        tsctl_version = None
    return {
        "format": FORMAT,
        "model": model,
        "engine": engine,
        "server": server,
        "gpus": list(gpus),
        "machine": measured_on,
        "input": {"files": [name for name, _ in files], "bytes": [size for _, size in files]},
        "p99_target_ms": p99_ms,
        "steps": steps,
        "knee": knee(steps),
        "within_p99": within_p99(steps, p99_ms),
        "stopped": stopped,
        "queue_gauge": QUEUE_GAUGE if any(s["queue_depth"] is not None for s in steps) else None,
        "notes": [*notes, *busy_notes(measured_on), *few_notes(steps)],
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "tsctl_version": tsctl_version,
    }


def write(doc: dict, path: str):
    try:
        Path(path).write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as exc:
        raise UserError(f"--out {path}: cannot write it ({exc.strerror})") from None


def _kind(value, kind: str) -> bool:
    if kind == "count":  # a whole number >= 0 (not a bool)
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    if kind == "positive":
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    if kind == "number":  # a finite number >= 0
        return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")
    if kind == "number?":
        return value is None or _kind(value, "number")
    if kind == "str":
        return isinstance(value, str) and value != ""
    raise ValueError(kind)


WORDS = {
    "count": "a whole number",
    "positive": "a whole number above 0",
    "number": "a number >= 0",
    "number?": "a number >= 0 or null",
    "str": "a non-empty string",
}
STEP_KEYS = {
    "concurrency": "positive",
    "requests": "count",
    "seconds": "number",
    "throughput_rps": "number",
    "p50_ms": "number?",
    "p90_ms": "number?",
    "p99_ms": "number?",
    "errors": "count",
}
POINT_KEYS = {"concurrency": "positive", "throughput_rps": "number", "p99_ms": "number?"}
GPU_KEYS = {"id": "count", "name": "str", "memory_mib": "count"}
MAX_GPUS = 64
SERVER_KEYS = {
    "workers": "count",
    "batch_size": "positive",
    "max_batch_delay_ms": "number",
    "cpu": "number",
    "memory_bytes": "positive",
}


def load(path) -> dict:
    """A capacity result file, checked: its format, and each key other code reads with the type it must
    have; a UserError naming the file and the first key that is wrong."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise UserError(
            f"{path}: larger than {MAX_BYTES >> 20} MiB, no result file is: give the file "
            "'tsctl bench --capacity --out' wrote"
        )
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError; RecursionError: nesting
        reason = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise UserError(f"{path}: not JSON ({reason}): give a file 'tsctl bench --capacity --out' wrote") from None

    def bad(key: str, what: str):
        return UserError(f"{path}: key {key!r} must be {what}")

    def check(value, keys: Dict[str, str], where: str, nullable=()):
        if not isinstance(value, dict):
            raise bad(where, "an object")
        for key, kind in keys.items():
            if key not in value or not (_kind(value[key], kind) or (key in nullable and value[key] is None)):
                raise bad(f"{where}.{key}".lstrip("."), WORDS[kind] + (" or null" if key in nullable else ""))

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise bad("format", f"{FORMAT!r} (it is {found!r})")
    check_one_line(doc, path)
    check(doc, {"model": "str", "engine": "str", "p99_target_ms": "number?", "measured_at": "str"}, "")
    check(doc["server"], SERVER_KEYS, "server", nullable=tuple(SERVER_KEYS))
    if not isinstance(doc.get("steps"), list) or not doc["steps"]:
        raise bad("steps", "a list of at least one step")
    for index, entry in enumerate(doc["steps"]):
        check(entry, STEP_KEYS, f"steps[{index}]")
        if entry.get("queue_depth") is not None:
            check(entry["queue_depth"], {"mean": "number", "max": "number"}, f"steps[{index}].queue_depth")
    for key in ("knee", "within_p99"):
        if key not in doc:
            raise bad(key, "an object or null")
        if doc[key] is not None:
            check(doc[key], POINT_KEYS, key)
    if doc.get("machine") is not None:  # absent in a file tsctl wrote before it recorded the machine's load
        check(doc["machine"], {"cpus": "positive", "load_average": "number?"}, "machine", nullable=("cpus",))
    gpus = doc.get("gpus", [])  # absent in a file tsctl wrote before it recorded them: the CPU (left absent)
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
        raise bad("gpus", f"a list of at most {MAX_GPUS} GPUs")
    for index, entry in enumerate(gpus):
        check(entry, GPU_KEYS, f"gpus[{index}]")
    check_words(doc, bad)
    for key, found in (("knee", knee(doc["steps"])), ("within_p99", within_p99(doc["steps"], doc["p99_target_ms"]))):
        if (doc[key] or {}).get("concurrency") != (found or {}).get("concurrency"):
            given = "its steps give none" if found is None else f"its steps give concurrency {found['concurrency']}"
            raise UserError(
                f"{path}: {key} is not what {given}; the file was changed: run 'tsctl bench --capacity' again"
            )
    return doc


CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # line breaks, tabs, escapes: no text field holds one


def check_one_line(doc, path):
    """Every string of the file (DEPLOY.md and the export's notes quote them into Markdown, one line each) is
    one line of printable text: a newline in one (``"measured_at": "...Z\\n## ..."``) reached DEPLOY.md as
    written. Walked without recursion (the file is at most ``MAX_BYTES``)."""
    stack = [("", doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            found = CONTROL.search(value)
            if found:
                raise UserError(
                    f"{path}: key {where!r} holds the control character {found.group()!r}: text fields are "
                    "one line; remove it or run 'tsctl bench --capacity' again"
                )
        elif isinstance(value, dict):
            stack.extend((f"{where}.{key}".lstrip("."), item) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}[{index}]", item) for index, item in enumerate(value))


MEASURED_AT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
ENGINE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


def check_words(doc: dict, bad):
    """The strings other files quote (DEPLOY.md's table, the export's queries): each as tsctl writes it."""
    from ..mar import MODEL_NAME

    for key, pattern, what in (
        ("model", MODEL_NAME, "a model name (letters, digits, '_', '-', '.')"),
        ("engine", ENGINE_NAME, "an engine's name, e.g. 'tsctl'"),
        ("measured_at", MEASURED_AT, "a UTC time as 2026-11-26T14:12:41Z"),
    ):
        if not pattern.match(doc[key]):
            raise bad(key, what)
