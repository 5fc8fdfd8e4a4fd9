"""One replica measured as the pod runs it, for ``tsctl bench MODEL --capacity`` (the sweep itself and the
result's format: archiver/capacity/sweep.py).

Either the server ``tsctl serve`` started (``measure_running``: its settings read from its management API),
or a server started here as the pod would start it (``measure_started``): the engine on the model store
and config the pod mounts, the workers and batching the snapshot (or the archive's model-config.yaml)
gives, inside a cgroup with the pod's CPU and memory limits where this machine lets one be made
(archiver/capacity/cgroup_limits.py), stopped once measured. The result's text (``table``) and plot (``plot``).
"""

import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

from .. import engines
from ..errors import ServerFailure, UserError
from ..output import quiet
from . import sweep as capacity

if TYPE_CHECKING:  # pragma: no cover
    from ..server import Server

STOPPED = {
    "flat": f"throughput flat: {capacity.FLAT_STEPS} steps in a row adding under {capacity.GROWTH:.0%}",
    "p99": f"p99 past {capacity.P99_STOP}x the target",
    "errors": "a step had errors",
    "bound": "the largest concurrency was reached (the knee may lie beyond: raise --max-concurrency)",
}


@dataclass
class LoadSteps:
    """What to send and how far to go: the input files, the largest concurrency, each step's bounds
    (requests and seconds), the p99 target in ms (None: none)."""

    inputs: Sequence[str]
    max_concurrency: int = 64
    requests: int = 500
    seconds: float = 10.0
    p99_ms: Optional[float] = None


def settings_of(spec, limits=None) -> dict:
    """The result's ``server``: a model version's workers and batching, the limits applied (null: none)."""
    return {
        "workers": spec.min_workers if spec else None,
        "max_workers": spec.max_workers if spec else None,
        "batch_size": spec.batch_size if spec else None,
        "max_batch_delay_ms": spec.max_batch_delay if spec else None,
        "cpu": limits.cpu if limits is not None else None,
        "memory_bytes": limits.memory if limits is not None else None,
    }


def store_spec(engine: str, model: str, model_store: str, config: Optional[str]):
    """``model``'s default version as the server will serve it from the store and config (the snapshot's
    entry, else the archive's model-config.yaml); a UserError when it will not serve ``model``."""
    from ..engines.tsctl import served

    chosen = engines.named(engine)
    if config is None and (chosen.needs_config or Path(engines.DEFAULT_CONFIG).exists()):
        config = engines.DEFAULT_CONFIG  # as engines.serve picks it
    store = Path(model_store)
    if not store.is_dir():
        raise UserError(f"--model-store {model_store} is not a directory")
    if config is not None and not Path(config).is_file():
        raise UserError(f"--config {config} does not exist")
    specs = served(store.resolve(), Path(config).resolve() if config else None)[0]
    mine = [spec for spec in specs if spec.name == model]
    if not mine:
        names = ", ".join(dict.fromkeys(spec.name for spec in specs)) or "no model"
        where = f"{config}'s model_snapshot" if config else f"the model store {model_store}"
        raise UserError(f"{where} serves no model {model!r}: it serves {names}")
    return next((spec for spec in mine if spec.default), mine[0])


GPU_ID = re.compile(r"^gpuId::(\d+) ")


def gpus_used(described: Optional["Described"]) -> List[dict]:
    """The GPUs a measured model's workers ran on (``capacity.document``'s ``gpus``): each one's id, name and
    memory, as NVML reads this machine's (serving/gpus.py); [] on the CPU or where the server does not say."""
    if described is None or not described.gpu_ids:
        return []
    from serving import gpus

    samples = gpus.sample_devices()
    return [
        {"id": i, "name": samples[i].name, "memory_mib": samples[i].memory_total_mib}
        for i in described.gpu_ids
        if i in samples
    ]


class Described:
    """A model's settings as a running server's management API describes them (as a ModelSpec)."""

    def __init__(self, entry: dict):
        self.min_workers = entry.get("minWorkers")
        self.max_workers = entry.get("maxWorkers")
        self.batch_size = entry.get("batchSize")
        self.max_batch_delay = entry.get("maxBatchDelay")
        # the GPUs its workers run on, from their gpuUsage ("gpuId::N ..." as TorchServe and the engine write it)
        usages = [w.get("gpuUsage") for w in entry.get("workers") or [] if isinstance(w, dict) and w.get("gpu")]
        self.gpu_ids = sorted({int(m.group(1)) for u in usages if isinstance(u, str) for m in [GPU_ID.match(u)] if m})


def running_spec(srv: "Server", model: str) -> Optional[Described]:
    """What the running server says of ``model`` (None where it has no management API: MLServer)."""
    from ..server import request

    if not srv.management:
        return None
    try:
        status, body = request(f"{srv.management}/models/{model}", headers=srv.headers("management"), timeout=10)
    except OSError:
        return None
    if status != 200 or not isinstance(body, list) or not body or not isinstance(body[0], dict):
        return None
    return Described(body[0])


def measure(srv: "Server", model: str, plan: LoadSteps, settings: dict, progress=quiet, notes: Sequence[str] = ()):
    """The sweep against ``srv`` (archiver/capacity/sweep.py) and its result document."""
    from .bench import read_inputs

    chosen = engines.engine_of(srv)
    files = read_inputs(plan.inputs)
    bodies = [chosen.request_body(data, kind) for data, kind in files]
    notes = list(notes)
    metrics = srv.metrics_url if srv.metrics else None
    if capacity.read_gauge(metrics, model) is None:
        notes.append(f"the {chosen.title} exports no {capacity.QUEUE_GAUGE} gauge for {model}: queue depth is null")
        metrics = None
    measured_on = capacity.machine()  # before the sweep loads it
    steps, stopped = capacity.sweep(
        engines.predict_url(srv, model),
        bodies,
        model,
        plan.max_concurrency,
        plan.requests,
        plan.seconds,
        plan.p99_ms,
        srv.headers("inference"),
        metrics,
        progress,
    )
    named = [(Path(p).name, len(data)) for p, (data, _) in zip(plan.inputs, files)]
    used = gpus_used(running_spec(srv, model))
    return capacity.document(model, chosen.name, settings, named, plan.p99_ms, steps, stopped, notes, used, measured_on)


def measure_running(srv: "Server", model: str, plan: LoadSteps, progress=quiet) -> dict:
    """The server 'tsctl serve' started, as it runs (no limits applied here)."""
    return measure(srv, model, plan, settings_of(running_spec(srv, model)), progress)


def measure_started(
    engine: str,
    model: str,
    model_store: str,
    plan: LoadSteps,
    config: Optional[str] = None,
    python: Optional[str] = None,
    cpu: Optional[float] = None,
    memory: Optional[int] = None,
    timeout: float = 300,
    progress: Callable[[str], None] = quiet,
    note: Callable[[str], None] = quiet,
) -> dict:
    """Start ``engine`` on the store as the pod would (module docstring), inside ``cpu``/``memory``
    limits where a cgroup can be made (the result's notes say which, or why not), measure it, stop it.
    ``note`` hears of the store's archives the config leaves out, as 'tsctl serve' notes them."""
    from .cgroup_limits import PodLimits

    spec = store_spec(engine, model, model_store, config)
    limits = PodLimits.make(cpu, memory)
    notes: List[str] = []
    if cpu is not None or memory is not None:
        notes.append(limits.describe())
    threads = threads_note(limits.cpu, engine)
    if threads:
        notes.append(threads)
    home = tempfile.mkdtemp(prefix="tsctl-cap-")  # short: the servers' sockets live below it
    try:
        with limits.joined():
            try:
                srv = engines.serve(engine, config, model_store, home, timeout, progress, note, python=python)
            except ServerFailure as exc:
                if memory is not None and "-9" in str(exc):  # SIGKILL: what the memory cgroup's OOM killer sends
                    raise ServerFailure(
                        f"{exc} (-9: killed; --memory {memory:,} bytes may be less than the server "
                        "and its workers need, as a pod's limit would be)"
                    ) from None
                raise
        try:
            if limits.groups and not limits.holds(srv.pid):
                raise UserError(f"the {engine} server did not start inside its cgroup: drop --cpu/--memory")
            return measure(srv, model, plan, settings_of(spec, limits), progress, notes)
        finally:
            engines.engine_of(srv).stop(srv)
    finally:
        limits.release()
        shutil.rmtree(home, ignore_errors=True)


def threads_note(cpu: Optional[float], engine: str = "torchserve") -> Optional[str]:
    """A quota below the cores TorchServe sees, with no OMP_NUM_THREADS: the toolkit's handlers size their
    torch threads from the quota, any other handler from the cores, which the quota then throttles
    (docs/capacity.md, "On a pod's CPU limit"). The tsctl engine and MLServer's runtime set each worker's
    OMP_NUM_THREADS from the quota themselves (serving/engine/workers.py)."""
    import os

    from handlers import cpu_limit

    visible = cpu_limit.visible()
    if engine != "torchserve" or cpu is None or cpu >= visible or os.environ.get("OMP_NUM_THREADS"):
        return None
    return (
        f"TorchServe sees {visible} cores under a {cpu:g} CPU quota and OMP_NUM_THREADS is not set: a handler that "
        "is not the toolkit's sizes its torch threads from the cores; measure with the OMP_NUM_THREADS the pod will set"
    )


# -- what is printed ------------------------------------------------------------------------------


def headline(doc: dict) -> str:
    server = doc["server"]
    title = engines.named(doc["engine"]).title
    parts = []
    if server.get("workers") is not None:
        parts.append(f"{server['workers']} worker{'s' if server['workers'] != 1 else ''}")
    if server.get("batch_size") is not None:
        parts.append(f"batchSize {server['batch_size']}, maxBatchDelay {server['max_batch_delay_ms']} ms")
    if server.get("cpu") is not None:
        parts.append(f"{server['cpu']:g} CPU")
    if server.get("memory_bytes") is not None:
        parts.append(f"{server['memory_bytes'] / 2**30:.2f} GiB")
    article = "the " if title.islower() else ""  # "the tsctl engine", but "TorchServe"
    return f"{doc['model']} on {article}{title}" + (f" ({'; '.join(parts)})" if parts else "")


def clients(count: int) -> str:
    return f"{count} client{'s' if count != 1 else ''}"


def table(doc: dict) -> List[str]:
    """The result as lines of text: the steps, the knee, the p99 point, why the sweep stopped."""
    head = f"{'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'errors':>6}  queue"
    lines = [headline(doc), head]
    for s in doc["steps"]:
        queue = s["queue_depth"]
        depth = f"{queue['mean']:.1f} mean, {queue['max']:g} max" if queue else "-"
        cells = [f"{s[k]:>8.1f}" if s[k] is not None else f"{'-':>8}" for k in ("p50_ms", "p90_ms", "p99_ms")]
        lines.append(f"{s['concurrency']:>7} {s['throughput_rps']:>8.1f} {' '.join(cells)} {s['errors']:>6}  {depth}")
    knee = doc["knee"]
    if knee:
        lines.append(
            f"knee: {clients(knee['concurrency'])}, {knee['throughput_rps']:.1f} req/s, p99 {knee['p99_ms']:.1f} ms "
            f"(the fewest clients reaching {capacity.KNEE_SHARE:.0%} of the best throughput)"
        )
    else:
        lines.append("knee: none (no step answered every request)")
    target, held = doc["p99_target_ms"], doc["within_p99"]
    if target is not None and held:
        lines.append(
            f"within p99 {target:g} ms: {clients(held['concurrency'])}, {held['throughput_rps']:.1f} req/s, "
            f"p99 {held['p99_ms']:.1f} ms"
        )
    elif target is not None:
        lines.append(f"within p99 {target:g} ms: no step holds it")
    lines.append(f"stopped: {STOPPED.get(doc['stopped'], doc['stopped'])}")
    return lines + [f"note: {line}" for line in doc.get("notes", [])]


def plot(doc: dict, path: str):
    """Throughput and p99 against concurrency, the knee and the p99 target marked, as a PNG."""
    from .plotting import pyplot, save

    plt = pyplot()

    steps = doc["steps"]
    x = [s["concurrency"] for s in steps]
    figure, left = plt.subplots(figsize=(7, 4))
    left.plot(x, [s["throughput_rps"] for s in steps], "o-", color="tab:blue", label="throughput")
    left.set_xscale("log", base=2)
    left.set_xticks(x, [str(c) for c in x])
    left.set_xlabel("concurrent clients")
    left.set_ylabel("requests/s", color="tab:blue")
    left.set_ylim(bottom=0)
    right = left.twinx()
    right.plot(x, [s["p99_ms"] for s in steps], "s--", color="tab:red", label="p99")
    right.set_ylabel("p99 latency (ms)", color="tab:red")
    right.set_ylim(bottom=0)
    if doc["knee"]:
        left.axvline(doc["knee"]["concurrency"], color="gray", linestyle=":", label="knee")
    if doc["p99_target_ms"] is not None:
        right.axhline(doc["p99_target_ms"], color="tab:red", linestyle=":", alpha=0.5)
    handles = [line for axis in (left, right) for line in axis.get_lines() if not line.get_label().startswith("_")]
    left.legend(handles, [line.get_label() for line in handles], loc="upper left", fontsize=8)
    left.set_title(headline(doc), fontsize=9)
    save(figure, path, 100)
