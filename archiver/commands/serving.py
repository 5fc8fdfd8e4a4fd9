"""Commands for the server ``tsctl serve`` starts in the background: ``serve``, ``stop``, ``predict``
(send files, print the answers) and ``bench`` (drive it, report throughput and latency)."""

import base64
import json
import sys
from pathlib import Path

import click

from .. import choices, engines
from ..errors import ServerFailure, UserError
from ..output import Progress, json_option, print_json
from .common import Command, input_file, running_server
from .options import content_type_option, engine_option, home_option, resolve_alias, timeout_option


@click.command(cls=Command)
@click.option(
    "--config",
    "config_path",
    help=f"config.properties (default {engines.DEFAULT_CONFIG}; the tsctl engine serves every archive in the "
    "store without one).",
)
@click.option("--model-store", default="model-store", show_default=True, help="The directory of archives to serve.")
@home_option("State directory: logs, pid lock, server.json.")
@timeout_option(180.0, "Seconds to wait while no model makes progress (a state, a log line) before giving up.")
@click.option(
    "--install-deps",
    is_flag=True,
    help="--engine torchserve: pip-install each archive's requirements.txt "
    "first, as KServe does (the tsctl engine runs archives in its own Python: install them there).",
)
@click.option(
    "--enable-model-api", is_flag=True, help="Allow (re)registering models, e.g. for 'tsctl bench --sweep-batch'."
)
@click.option(
    "--disable-token-auth",
    is_flag=True,
    help="Turn TorchServe's token authorization off, whatever the config says (torchserve's flag of that name).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="The address every listener binds (0.0.0.0: every address of this machine).",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    help="The inference API's port (default: a free one; the others are free ones, printed once it is ready).",
)
@click.option(
    "--last-snapshot",
    is_flag=True,
    help="Serve what the last server of --home served as it ended: "
    "its newest config snapshot (HOME/logs/config), with the models registered, scaled or unregistered "
    "through the management API; as 'torchserve --start' without --ts-config.",
)
@click.option("--python", type=click.Path(), help="The Python that runs the engine (default: this one).")
@click.option(
    "--public-key",
    type=click.Path(),
    help="Serve only archives signed with this key's private half: the tsctl engine checks every archive before "
    "its code runs; on TorchServe and MLServer toolkit handlers check themselves (TSCTL_PUBLIC_KEY).",
)
@engine_option("What serves the store.")
@json_option
def serve(
    config_path,
    model_store,
    home,
    timeout,
    install_deps,
    enable_model_api,
    disable_token_auth,
    host,
    port,
    last_snapshot,
    python,
    public_key,
    engine,
    as_json,
):
    """Start a server in the background (on 127.0.0.1 unless --host) and wait until every model is ready."""
    env = None
    if public_key:  # checked here, in one line, before anything starts
        from handlers.signing import ENVIRONMENT, read_key

        read_key(public_key)
        env = {ENVIRONMENT: str(Path(public_key).resolve())}

    notes = []

    def note(line: str):  # on stderr as it is found, before the wait (stdout keeps the answer alone)
        notes.append(line)
        click.echo(f"note: {line}", err=True)

    srv = engines.serve(
        engine,
        config_path,
        model_store,
        home,
        timeout,
        progress=Progress.for_command(as_json),
        notes=note,
        last_snapshot=last_snapshot,
        install_deps=install_deps,
        enable_model_api=enable_model_api,
        disable_token_auth=disable_token_auth,
        python=python,
        env=env,
        host=host,
        port=port,
    )
    chosen = engines.engine_of(srv)
    key_file = chosen.key_file(srv)
    if as_json:
        addresses = dict(chosen.addresses(srv))
        if srv.grpc:  # the former key, for scripts that read it (docs/json-output.md)
            addresses["grpc"] = srv.grpc
        report = {"engine": chosen.name, "pid": srv.pid, "home": srv.home, "models": srv.models}
        key = str(key_file) if key_file else None
        print_json({**report, "addresses": addresses, "key_file": key, "notes": notes})
        return
    click.echo(f"{chosen.title} ready (pid {srv.pid}): {', '.join(srv.models)}")
    for label, address in chosen.addresses(srv):
        click.echo(f"  {label:<18} {address}")
    if key_file:
        click.echo(
            f"token authorization is on: the keys are in {key_file} (predict, bench and verify --served send "
            "them; others send 'Authorization: Bearer KEY')"
        )


@click.command(cls=Command)
@home_option()
@json_option
def stop(home, as_json):
    """Stop the server started by 'tsctl serve'."""
    from .. import server

    srv = server.recorded_in(home)
    chosen = engines.engine_of(srv) if srv is not None else None
    stopped = chosen.stop(srv) if chosen is not None else False
    if as_json:
        print_json(
            {
                "stopped": stopped,
                "engine": chosen.name if chosen else None,
                "pid": srv.pid if srv else None,
                "home": str(Path(home).resolve()),
            }
        )
    elif srv is None:
        click.echo(f"no server is running from {server.where(home)}: nothing to stop (or {server.elsewhere(home)})")
    elif stopped:
        click.echo(f"{chosen.title} stopped")
    else:
        click.echo(f"the server started from {server.where(home)} (pid {srv.pid}) had already exited")


@click.command(cls=Command)
@click.argument("model")
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@home_option()
@timeout_option(60.0, "Seconds each answer may take, whole: from the request to its last byte.")
@content_type_option(
    more="On MLServer the file is one BYTES element of a v2 request, this type its content_type (without "
    "--content-type a .json file is sent as the v2 request itself)."
)
@json_option
def predict(model, inputs, home, timeout, kind, as_json):
    """Send each INPUT file to MODEL on the running server (where its engine takes one request:
    /predictions/MODEL) and print the answers."""
    from ..http_client import AnswerError

    paths = [input_file(p) for p in inputs]
    srv = running_server(home, model)
    results = []
    for path in paths:
        try:
            status, body = engines.predict(srv, model, Path(path), timeout, kind)
        except TimeoutError:  # the whole call's deadline (http_client.Late)
            url = engines.predict_url(srv, model)
            late = f"{path}: {url}: no answer from {model} within {timeout:g} s: raise --timeout"
            raise ServerFailure(late) from None
        except AnswerError as exc:  # past tsctl's other bounds on an answer (http_client.py): it names the URL
            raise ServerFailure(f"{path}: {exc}") from None
        except OSError as exc:
            raise ServerFailure(f"could not reach {srv.inference}: {exc}") from None
        binary = isinstance(body, bytes)  # not UTF-8: an image, a tensor file
        shown = base64.b64encode(body).decode("ascii") if binary else body
        results.append({"path": str(path), "status": status, "body": shown, "base64": binary})
        if not as_json:
            click.echo(f"{path}: {status} " + (f"<{len(body):,} bytes>" if binary else json.dumps(body)))
    if as_json:
        print_json({"model": model, "url": engines.predict_url(srv, model), "results": results})
    sys.exit(1 if any(r["status"] != 200 for r in results) else 0)


def finite(value):
    """``value`` with null for each NaN (a latency of no answer): JSON has no NaN."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return None if isinstance(value, float) and value != value else value


def int_list(value: str):
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{value!r} must be comma-separated whole numbers, e.g. 1,4,8") from None


CAPACITY_FLAGS = {
    "max_concurrency": "--max-concurrency",
    "p99_ms": "--p99-ms",
    "model_store": "--model-store",
    "config_path": "--config",
    "engine": "--engine",
    "python": "--python",
    "cpu": "--cpu",
    "memory": "--memory",
    "timeout": "--timeout",
    "out": "--out",
    "plot": "--plot",
}
STARTING_FLAGS = ("config_path", "engine", "python", "cpu", "memory", "timeout")  # only with --model-store


def capacity_options(command):
    """``--capacity`` and the options only it takes (docs/capacity.md)."""
    options = [
        click.option(
            "--capacity",
            is_flag=True,
            help="Find one replica's capacity: a concurrency sweep 1, 2, 4, ... "
            "up to the knee (docs/capacity.md); --requests/--duration bound each step (default 500, 10 s).",
        ),
        click.option("--max-concurrency", type=int, help="With --capacity: the most clients tried (default 64)."),
        click.option(
            "--p99-ms",
            type=float,
            help="With --capacity: report the most clients that hold p99 <= this; the sweep stops past twice it.",
        ),
        click.option(
            "--model-store",
            help="With --capacity: start the server on this store as the pod would (its "
            "snapshot's workers and batching), instead of measuring the one --home names.",
        ),
        click.option(
            "--config",
            "config_path",
            help="With --model-store: the config.properties the pod mounts "
            f"(default {engines.DEFAULT_CONFIG}; the tsctl engine and MLServer serve the store without one).",
        ),
        click.option(
            "--engine",
            callback=resolve_alias,
            help=f"With --model-store: what serves it, one of {', '.join(engines.ENGINES)} (default torchserve).",
        ),
        click.option(
            "--python",
            type=click.Path(),
            help="With --model-store: the Python that runs the server (MLServer's own venv).",
        ),
        click.option(
            "--cpu",
            type=float,
            help="With --model-store: the pod's CPU limit in cores (e.g. 1.5), as a "
            "cgroup CPU quota around the server and its workers where this machine can make one.",
        ),
        click.option(
            "--memory",
            help="With --model-store: the pod's memory limit (4Gi, 512Mi, 4G), as a cgroup "
            "memory limit where this machine can make one.",
        ),
        click.option(
            "--timeout",
            type=float,
            help="With --model-store: seconds the server may show no progress while starting (default 300).",
        ),
        click.option("--out", type=click.Path(), help="With --capacity: write the result file (docs/capacity.md)."),
        click.option(
            "--plot",
            type=click.Path(),
            help="With --capacity: a PNG of throughput and p99 against "
            "concurrency (needs matplotlib: the bench extra).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def positive(flag: str, value, whole: bool = False):
    """A one-line refusal of a value that is not a finite number above 0 (NaN and inf pass click's types)."""
    if value is not None and not (0 < value < float("inf")):
        examples = {"--cpu": "--cpu 1.5", "--p99-ms": "--p99-ms 500", "--timeout": "--timeout 300"}
        example = examples.get(flag, f"{flag} 8")
        raise UserError(f"{flag} {value:g} must be a {'whole ' if whole else ''}number above 0, e.g. {example}")
    return value


def writable(flag: str, path):
    """Refuse, before a long run, a file that cannot be written where it is asked for."""
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise UserError(f"{flag} {path}: its directory does not exist")


def print_sweep(rows, model: str, as_json: bool):
    """``bench --sweep-batch``'s answer: a row per batchSize and maxBatchDelay, the recommended one marked."""
    if as_json:
        print_json(finite(rows))
        return
    click.echo(f"{'batch':>5} {'delay':>5} {'req/s':>8} {'p50':>8} {'p90':>8} {'p99':>8} {'errors':>6}")
    for r in rows:
        lat = r["latency_ms"]
        mark = "  <- recommended" if r["recommended"] else ""
        click.echo(
            f"{r['batchSize']:>5} {r['maxBatchDelay']:>5} {r['throughput_rps']:>8.1f} {lat['p50']:>8.1f} "
            f"{lat['p90']:>8.1f} {lat['p99']:>8.1f} {r['errors']:>6}{mark}"
        )
    best = next((r for r in rows if r["recommended"]), None)
    if best:
        click.echo(
            f"{model} now runs with batchSize {best['batchSize']}, maxBatchDelay {best['maxBatchDelay']}: "
            "put them in its model-config.yaml to keep them"
        )


def bench_capacity(model, inputs, count, duration, as_json, home, options):
    """``bench --capacity``: measure, print the table (or the JSON), write --out and --plot."""
    from ..capacity import replica
    from ..capacity.cgroup_limits import parse_memory

    for flag in ("--max-concurrency", "--p99-ms", "--cpu", "--timeout"):
        positive(flag, options[flag.lstrip("-").replace("-", "_")], flag == "--max-concurrency")
    if options["max_concurrency"] is not None and options["max_concurrency"] > 256:
        raise UserError(f"--max-concurrency {options['max_concurrency']} is above 256: one thread a client")
    if duration is not None and duration != duration:
        raise UserError("--duration must be a number of seconds, e.g. --duration 10")
    writable("--out", options["out"])
    writable("--plot", options["plot"])
    plan = replica.LoadSteps(
        list(inputs), options["max_concurrency"] or 64, count or 500, duration or 10.0, options["p99_ms"]
    )
    progress = Progress.for_command(as_json)
    if options["model_store"] is None:
        doc = replica.measure_running(running_server(home, model), model, plan, progress)
    else:
        memory = parse_memory(options["memory"]) if options["memory"] is not None else None
        engine = engines.named(options["engine"] or "torchserve").name
        doc = replica.measure_started(
            engine,
            model,
            options["model_store"],
            plan,
            options["config_path"],
            options["python"],
            options["cpu"],
            memory,
            options["timeout"] or 300,
            progress,
            lambda line: click.echo(f"note: {line}", err=True),
        )
    if options["out"]:
        from ..capacity.sweep import write

        write(doc, options["out"])
    if options["plot"]:
        replica.plot(doc, options["plot"])
    if as_json:
        print_json(doc)
    else:
        for line in replica.table(doc):
            click.echo(line)
    sys.exit(0 if doc["knee"] else 1)


@click.command(cls=Command)
@click.argument("model")
@click.option("--input", "inputs", multiple=True, required=True, help="A file to send; repeat for several.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    help="Requests in flight at once (one connection each; default 8).",
)
@click.option(
    "--requests", "count", type=click.IntRange(1), help="Stop after this many requests (with --capacity: per step)."
)
@click.option(
    "--duration",
    type=click.FloatRange(0, choices.MAX_BENCH_SECONDS, min_open=True),
    help="Stop after seconds (with --capacity: per step).",
)
@click.option("--sweep-batch", help="Sweep batchSize over these values, e.g. 1,4,8 (needs --enable-model-api).")
@click.option("--sweep-delay", default="5,50", show_default=True, help="maxBatchDelay values (ms) for the sweep.")
@capacity_options
@json_option
@home_option()
def bench(model, inputs, concurrency, count, duration, sweep_batch, sweep_delay, as_json, home, capacity, **options):
    """Drive MODEL on the running server and report throughput, p50/p90/p99 latency and errors; with
    --capacity, find one replica's capacity (on the running server, or one started with --model-store)."""
    given = [CAPACITY_FLAGS[key] for key, value in options.items() if value is not None]
    if capacity:
        if concurrency is not None or sweep_batch:
            raise UserError(
                "--capacity sweeps the concurrency itself: drop --concurrency and --sweep-batch "
                "(--max-concurrency bounds it)"
            )
        starting = [CAPACITY_FLAGS[key] for key in STARTING_FLAGS if options[key] is not None]
        if starting and options["model_store"] is None:
            raise UserError(f"{starting[0]} is for the server bench starts: give --model-store too")
        return bench_capacity(model, inputs, count, duration, as_json, home, options)
    if given:
        raise UserError(f"{given[0]} is an option of --capacity: add --capacity, or drop {given[0]}")
    concurrency = concurrency or 8
    from ..capacity import bench as load

    srv = running_server(home, model)
    progress = Progress.for_command(as_json)
    files = load.read_inputs(inputs)
    if count is None and duration is None:
        raise UserError("give --requests N or --duration SECONDS: a benchmark must be bounded")
    if duration is not None and duration != duration:  # nan passes click's range
        raise UserError("--duration must be a number of seconds, e.g. --duration 30")
    headers = srv.headers("inference")
    chosen = engines.engine_of(srv)
    if sweep_batch and not chosen.model_api:
        able = [engine.name for engine in engines.ENGINES.values() if engine.model_api]
        raise UserError(
            f"--sweep-batch re-registers models through a management API, which the {chosen.title} does not "
            f"offer: serve with --engine {able[0]}"
        )
    if sweep_batch:
        rows = load.sweep(
            srv.inference,
            srv.management,
            model,
            files,
            concurrency,
            int_list(sweep_batch),
            int_list(sweep_delay),
            count,
            duration,
            headers,
            progress,
            srv.headers("management"),
        )
        print_sweep(rows, model, as_json)
        return
    files = [chosen.request_body(data, content_type) for data, content_type in files]
    bound = f"{count} requests" if count is not None else f"{duration:g} s"
    progress(f"{model}: {concurrency} clients, {bound}")
    result = load.run_load(engines.predict_url(srv, model), files, concurrency, count, duration, headers)
    summary = result.summary()
    if as_json:
        print_json(finite(summary))
    else:
        click.echo(load.summary_line(summary))
    for problem, times in result.problems.items():  # answers past a bound: each cause once, on stderr
        click.echo(f"{times} of {result.requests} requests: {problem}", err=True)
    for why, times in result.cut.items():
        click.echo(f"{times} requests cut, not counted: {why}", err=True)
    sys.exit(1 if summary["errors"] or not summary["requests"] else 0)  # none answered: nothing measured
