"""The ``tsctl`` command line: thin click commands over plain functions.

Each command parses its flags, calls one function, prints, and exits 0 on success, 2 for a user
mistake (one sentence, no traceback), 1 when the server or model fails. Each imports the module it
calls when it runs, so ``tsctl --help`` loads click and little else, and no command but ``run``,
``verify`` and ``package --golden`` (which run the model) loads torch.
"""

import base64
import json
import logging
import sys
from contextlib import contextmanager
from pathlib import Path

import click

from . import choices, engines, runtimes, scaffold
from .errors import ServerError, UserError
from .output import Progress, json_option, print_json, print_json_error

# TorchServe's BaseHandler logs optional-backend notices (OpenVINO, ONNX, TensorRT) on import.
logging.getLogger("ts.torch_handler.base_handler").setLevel(logging.ERROR)


class Command(click.Command):
    """Runs the command and turns our errors into one line on stderr and an honest exit code; with
    ``--json``, the error is also a JSON document on stdout (``print_json_error``), for our errors and
    for click's own (a bad flag or value: click prints its usage lines on stderr and exits 2)."""

    def parse_args(self, ctx, args):
        as_json = "--json" in args  # before parsing, which consumes the list
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:
            if as_json:
                print_json_error(error.format_message(), error.exit_code)
            raise

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except our_errors() as error:
            if ctx.params.get("as_json"):
                print_json_error(str(error), error.exit_code)
            click.secho(f"error: {error}", fg="red", err=True)
            ctx.exit(error.exit_code)


def our_errors() -> tuple:
    """The errors a command reports in one line (tsctl's own, and the archive readers'); imported when
    asked, so that --help loads no handlers."""
    from handlers.archives import ArchiveError
    from handlers.signing import SignatureError

    return (UserError, ServerError, ArchiveError, SignatureError)


@contextmanager
def handler_errors(archive):
    """Around an archive's handler run in-process: our errors pass as they are, any other (the handler's
    own, failing to load or to answer) becomes one line naming ``archive`` (``handler_failure``)."""
    try:
        yield
    except our_errors():
        raise
    except Exception as exc:
        raise handler_failure(archive, exc) from None


SERVER_HOME = "The server's state directory: what 'tsctl serve --home' was given."


def home_option(help_text: str = SERVER_HOME):
    """``--home DIR``: the state directory of the server 'tsctl serve' starts (default .tsctl)."""
    return click.option("--home", default=".tsctl", show_default=True, help=help_text)


def timeout_option(default: float, help_text: str):
    """``--timeout SECONDS``, above 0."""
    return click.option(
        "--timeout", type=click.FloatRange(0, min_open=True), default=default, show_default=True, help=help_text
    )


def engine_option(help_text: str):
    """``--engine NAME``: which engine runs the archives, one of archiver.engines.ENGINES."""
    lines = " ".join(engine.help for engine in engines.ENGINES.values())
    return click.option(
        "--engine",
        type=click.Choice(list(engines.ENGINES)),
        default="torchserve",
        show_default=True,
        help=f"{help_text} {lines}",
    )


def runtime_option(help_text: str):
    """``--runtime IMAGE``: which of KServe's TorchServe images the files are for."""
    return click.option(
        "--runtime",
        type=click.Choice(list(runtimes.RUNTIMES)),
        default=runtimes.DEFAULT,
        show_default=True,
        help=help_text,
    )


def expect_options(command):
    """``--expect-name`` and ``--expect-version``: what a signed archive must be signed as (with --public-key)."""
    command = click.option(
        "--expect-version", help="With --public-key: the model version ARCHIVE must be signed as (else any)."
    )(command)
    return click.option(
        "--expect-name", help="With --public-key: the model name ARCHIVE must be signed as (default: its file name)."
    )(command)


def check_expectations(public_key, expect_name, expect_version):
    if (expect_name or expect_version) and not public_key:
        raise UserError("--expect-name and --expect-version check what ARCHIVE is signed as: give --public-key too")


def emit(report: dict, as_text, as_json: bool):
    """Print a command's report: as one JSON document (--json), else the lines ``as_text`` makes of it."""
    if as_json:
        print_json(report)
        return
    for line in as_text(report):
        click.echo(line)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tsctl")
def main():
    """Package, configure, serve and test PyTorch models on TorchServe and KServe."""


@main.command(cls=Command)
@click.argument("name")
@click.option(
    "--from",
    "kind",
    required=True,
    type=click.Choice(list(scaffold.KINDS)),
    help="The toolkit handler to subclass; blank: ToolkitHandler with every hook written out.",
)
@json_option
def init(name, kind, as_json):
    """Write NAME/: a handler of your own (handler.py), its model-config.yaml and a test."""
    from . import reports

    written = scaffold.init(name, kind)
    base = scaffold.KINDS[kind]
    report = reports.init_report(written, kind, f"{base.module}.{base.handler}")
    emit(report, reports.init_text, as_json)


@main.command(cls=Command)
@click.option("--model-name", required=True, help="Model name (the URL path /predictions/NAME).")
@click.option("--version", "version", default="1.0", show_default=True, help="Model version.")
@click.option(
    "--serialized-file",
    help="Weights: state_dict .pt/.pth, TorchScript, .pt2, .safetensors, .onnx, or a Hugging Face model directory.",
)
@click.option("--model-file", help="Python file defining the model class (eager and safetensors weights).")
@click.option("--handler", required=True, help="A toolkit handler (image_classifier) or your handler .py file.")
@click.option("--extra-files", default="", help="Comma-separated files or directories to add.")
@click.option("--requirements-file", help="requirements.txt installed per model by TorchServe.")
@click.option("--config-file", help="model-config.yaml (workers, batching, handler: settings).")
@click.option("--export-path", default="model-store", show_default=True, help="Directory to write the archive to.")
@click.option(
    "--archive-format",
    type=click.Choice(list(choices.ARCHIVE_FORMATS)),
    default="default",
    show_default=True,
    help="default/zip-store: .mar; tgz: .tar.gz; no-archive: a directory.",
)
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing archive.")
@click.option("--follow-symlinks", is_flag=True, help="Package what symbolic links among the inputs point to.")
@click.option(
    "--golden",
    type=click.Path(),
    help="Inputs (a directory, or a JSON list of request bodies) whose answers the archive keeps, for 'tsctl verify'.",
)
@click.option(
    "--golden-allow-errors",
    is_flag=True,
    help="With --golden: record the handler failing (5xx) as a golden answer too, instead of refusing.",
)
@click.option(
    "--sign-key",
    type=click.Path(),
    help="Sign every file with this PEM EC private key (OpenSSF model-signing, MAR-INF/model.sig).",
)
@json_option
def package(golden, golden_allow_errors, as_json, **flags):
    """Build model-store/NAME.mar (torch-model-archiver's flags)."""
    from . import mar, reports

    extra = [p.strip() for p in flags.pop("extra_files").split(",") if p.strip()]
    options = mar.PackageOptions(extra_files=extra, **flags)
    if golden_allow_errors and not golden:
        raise UserError("--golden-allow-errors goes with --golden DIR: give the inputs whose answers to record")
    if golden:
        from . import golden as golden_answers  # runs the archive in-process: imports torch
        from . import inprocess

        progress = Progress.for_command(as_json)
        # its handler failing on the golden run: nothing written, one line (its log kept off the terminal)
        with inprocess.quiet_logs(), handler_errors(options.model_name):
            path, planned, recorded = golden_answers.package(options, golden, progress, golden_allow_errors)
    else:
        path, planned = mar.build(options)
        recorded = None
    from handlers.signing import signature_of

    size = path.stat().st_size if path.is_file() else sum(s for _, s in mar.list_entries(path))
    emit(reports.package_report(path, size, planned, recorded, signature_of(path)), reports.package_text, as_json)


@main.command(cls=Command)
@click.argument("archive", type=click.Path())
@json_option
def inspect(archive, as_json):
    """Print an archive's manifest, files and sizes, and whether it is signed and by which key."""
    from handlers import golden, signing  # no torch: the golden.json and signature formats

    from . import mar, reports

    manifest = mar.read_manifest(archive)
    signature = signing.signature_of(archive)
    report = reports.inspect_report(manifest, mar.list_entries(archive), golden.read(archive), signature)
    emit(report, reports.inspect_text, as_json)


@main.command(cls=Command)
@click.option(
    "--model-store",
    default="model-store",
    show_default=True,
    help="The directory of archives: each one gets a model_snapshot entry.",
)
@click.option("--output", default="config/config.properties", show_default=True, help="Where to write the config.")
@click.option(
    "--min-workers",
    type=click.IntRange(1),
    help="Workers each model starts with, for every model (else its model-config.yaml's minWorkers, else 1).",
)
@click.option(
    "--max-workers",
    type=click.IntRange(1),
    help="Most workers per model, for every model (else its model-config.yaml's maxWorkers, else 1).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1),
    help="Most requests per handler call, for every model (else its model-config.yaml's batchSize, else 1).",
)
@click.option(
    "--max-batch-delay",
    type=click.IntRange(0),
    help="Milliseconds to wait to fill a batch, for every model (else its model-config.yaml's, else 100).",
)
@click.option(
    "--response-timeout",
    type=click.IntRange(1),
    help="Seconds a batch may take before its worker is restarted, for every model (else its "
    "model-config.yaml's, else 120).",
)
@runtime_option(
    "The TorchServe image KServe runs: archives whose requirements it lacks are named (nothing is resolved)."
)
@json_option
def config(
    model_store, output, min_workers, max_workers, batch_size, max_batch_delay, response_timeout, runtime, as_json
):
    """Write config/config.properties with a model_snapshot of every archive in the store.

    The per-model pip install is off: torchserve runs in an environment that has the archives'
    packages. Each archive whose requirements KServe's image lacks is named, with what to run instead."""
    from . import properties, reports

    overrides = {
        "minWorkers": min_workers,
        "maxWorkers": max_workers,
        "batchSize": batch_size,
        "maxBatchDelay": max_batch_delay,
        "responseTimeout": response_timeout,
    }
    path = properties.write_config(model_store, output, overrides)
    snapshot = properties.snapshot_of(properties.read_properties(path), path)
    report = reports.config_report(path, snapshot, properties.kserve_gaps(model_store, runtime))
    emit(report, reports.config_text, as_json)


@main.command(cls=Command)
@click.option(
    "--config",
    "config_path",
    help=f"config.properties (default {engines.DEFAULT_CONFIG}; the kserve engine serves every archive in the "
    "store without one).",
)
@click.option("--model-store", default="model-store", show_default=True, help="The directory of archives to serve.")
@home_option("State directory: logs, pid lock, server.json.")
@timeout_option(180.0, "Seconds to wait for every model to be READY.")
@click.option("--install-deps", is_flag=True, help="pip-install each archive's requirements.txt first, as KServe does.")
@click.option(
    "--enable-model-api", is_flag=True, help="Allow (re)registering models, e.g. for 'tsctl bench --sweep-batch'."
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
def serve(config_path, model_store, home, timeout, install_deps, enable_model_api, python, public_key, engine, as_json):
    """Start a server in the background on 127.0.0.1 and wait until every model is ready."""
    from .output import Progress

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
        install_deps=install_deps,
        enable_model_api=enable_model_api,
        python=python,
        env=env,
    )
    chosen = engines.engine_of(srv)
    if as_json:
        addresses = dict(chosen.addresses(srv))
        report = {"engine": chosen.name, "pid": srv.pid, "home": srv.home, "models": srv.models}
        print_json({**report, "addresses": addresses, "notes": notes})
        return
    click.echo(f"{chosen.title} ready (pid {srv.pid}): {', '.join(srv.models)}")
    for label, address in chosen.addresses(srv):
        click.echo(f"  {label:<10} {address}")


@main.command(cls=Command)
@home_option()
@json_option
def stop(home, as_json):
    """Stop the server started by 'tsctl serve'."""
    from . import server

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


@main.command(cls=Command)
@click.argument("model")
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@home_option()
@timeout_option(60.0, "Seconds to wait for each answer.")
@json_option
def predict(model, inputs, home, timeout, as_json):
    """Send each INPUT file to MODEL on the running server (where its engine takes one request:
    /predictions/MODEL) and print the answers."""
    from . import server

    paths = [input_file(p) for p in inputs]
    srv = running_server(home, model)
    results = []
    for path in paths:
        try:
            status, body = server.predict(srv, model, Path(path), timeout)
        except TimeoutError:
            raise ServerError(f"{path}: no answer from {model} within {timeout:g} s: raise --timeout") from None
        except OSError as exc:
            raise ServerError(f"could not reach {srv.inference}: {exc}") from None
        binary = isinstance(body, bytes)  # not UTF-8: an image, a tensor file
        shown = base64.b64encode(body).decode("ascii") if binary else body
        results.append({"path": str(path), "status": status, "body": shown, "base64": binary})
        if not as_json:
            click.echo(f"{path}: {status} " + (f"<{len(body):,} bytes>" if binary else json.dumps(body)))
    if as_json:
        print_json({"model": model, "url": srv.predict_url(model), "results": results})
    sys.exit(1 if any(r["status"] != 200 for r in results) else 0)


@main.command(cls=Command)
@click.argument("archive", type=click.Path())
@click.option(
    "--url",
    help="A running server (TorchServe, KServe, a transformer): http://HOST:PORT, or HOST:PORT; default: in-process.",
)
@click.option("--served", is_flag=True, help="Against the server 'tsctl serve' started from --home (either engine).")
@home_option("With --served: the server's state directory.")
@click.option(
    "--protocol",
    type=click.Choice(["ts", "v1", "v2"]),
    help="How requests are sent: ts (TorchServe's /predictions/MODEL), v1 or v2 (KServe). Default: with --served "
    "the engine's own (MLServer: v2), else ts.",
)
@click.option("--model", help="The model's name on the server (default: the archive's).")
@click.option("--atol", type=click.FloatRange(0), default=1e-4, show_default=True, help="How far a number may move.")
@timeout_option(60.0, "With a server: seconds to wait for each answer.")
@click.option("--golden-from", type=click.Path(), help="Use another archive's golden answers (an export's original).")
@json_option
@click.option("--public-key", type=click.Path(), help="Check ARCHIVE's signature (package --sign-key) with this key.")
@expect_options
def verify(
    archive, url, served, home, protocol, model, atol, timeout, golden_from, as_json, public_key, expect_name,
    expect_version
):  # fmt: skip
    """Replay ARCHIVE's golden requests (package --golden) and compare each answer with the recorded one;
    with --public-key, check its signature first (and stop there when it has no golden answers)."""
    from handlers import golden as golden_format

    from . import golden

    check_expectations(public_key, expect_name, expect_version)
    signature = None
    if public_key:
        from . import signing

        name, version, key = signing.verify_archive(archive, public_key, expect_name, expect_version)
        signature = {"signed": True, "verified": True, "name": name, "version": version, "key_fingerprint": key}
        click.echo(  # --json: stdout is JSON
            f"{archive}: signature verified: every file is as signed, as {name} version {version} by key {key}",
            err=as_json,
        )
        if not served and not url and golden_format.read(archive) is None:
            if as_json:
                print_json({"where": None, "checked": 0, "problems": [], "versions": [], "signature": signature})
            return

    if served:
        if url:
            raise UserError("--served and --url both name a server: give one")
        from . import mar

        srv = running_server(home, model or mar.read_manifest(archive)["model"]["modelName"])
        url = srv.inference
        protocol = protocol or engines.engine_of(srv).protocol  # MLServer speaks v2 only
    protocol = protocol or "ts"
    from .output import Progress

    progress = Progress.for_command(as_json)
    if url is None:  # in-process: the handler's log kept off the terminal, its failure one line
        from . import inprocess

        with inprocess.quiet_logs(), handler_errors(archive):
            report = golden.verify(archive, url, protocol, atol, model, timeout, golden_from, progress)
    else:
        try:
            report = golden.verify(archive, url, protocol, atol, model, timeout, golden_from, progress)
        except OSError as exc:
            raise ServerError(f"could not reach {url}: {exc}") from None
    if as_json:
        print_json({**report.as_json(), "signature": signature})
    else:
        for line in report.problems:
            click.echo(f"mismatch: {line}")
        matched = report.checked - len(report.problems)
        click.echo(f"{matched} of {report.checked} golden answers match ({report.where})")
        for line in report.versions:
            click.echo(f"  note: {line}")
    sys.exit(1 if report.problems else 0)


@main.command(cls=Command)
@click.argument("archive", type=click.Path())
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--public-key", type=click.Path(), help="Run ARCHIVE only if it is signed with this key's private half.")
@expect_options
@json_option
def run(archive, inputs, public_key, expect_name, expect_version, as_json):
    """Run ARCHIVE's handler in-process (no server) on each INPUT file, answering as 'tsctl predict' does."""
    from . import inprocess, mar
    from .output import Progress

    paths = [input_file(p) for p in inputs]
    check_expectations(public_key, expect_name, expect_version)
    mar.read_manifest(archive)  # a missing, foreign or unsafe archive is refused before torch loads
    expected = (None, None)
    if public_key:  # the key file and the expected name checked before torch loads
        from handlers.signing import read_key

        from .signing import stem

        read_key(public_key)
        expected = (expect_name or stem(Path(archive)), expect_version)
    with handler_errors(archive):
        answered = inprocess.run(archive, paths, public_key, Progress.for_command(as_json), expected)
    if as_json:
        print_json({"archive": str(archive), "results": [inprocess.as_json(p, r) for p, r in answered]})
    else:
        for path, response in answered:
            click.echo(inprocess.line(path, response))
    sys.exit(0 if all(r.status == 200 for _, r in answered) else 1)


# The archive's own handlers/ copy raises these in its worker: matched by name.
USER_MISTAKES = {("handlers.loading", "ModelLoadError"), ("handlers.settings", "SettingsError")}


def handler_failure(archive, exc: Exception) -> Exception:
    """One line for a handler that failed to load or run in-process: the user's mistake (weights,
    settings: exit 2), else the handler's failure (exit 1)."""
    # a LoadError names the exception its worker raised (serving/testing.py)
    module, _, name = getattr(exc, "error_type", f"{type(exc).__module__}.{type(exc).__name__}").rpartition(".")
    if (module, name) in USER_MISTAKES:
        return UserError(f"{archive}: {exc}")
    return ServerError(f"{archive}: the handler failed to load: {name}: {exc}")


def input_file(path: str) -> Path:
    """An input given on the command line: an existing regular file, else one-line UserError."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"input {path} is a directory: give the files in it")
    if not p.is_file():
        raise UserError(f"input {path} does not exist: check the path")
    return p


def running_server(home, model=None):
    """The live server 'tsctl serve' started from ``home`` (serving ``model``, when given), else one
    UserError saying where it looked and about --home (or which models it serves)."""
    from . import server

    srv = server.running(home)
    if model is not None:
        engines.require_model(srv, model)
    return srv


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


@main.command(cls=Command)
@click.argument("model")
@click.option("--input", "inputs", multiple=True, required=True, help="A file to send; repeat for several.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=8,
    show_default=True,
    help="Requests in flight at once (one connection each).",
)
@click.option("--requests", "count", type=click.IntRange(1), help="Stop after this many requests.")
@click.option(
    "--duration", type=click.FloatRange(0, choices.MAX_BENCH_SECONDS, min_open=True), help="Stop after seconds."
)
@click.option("--sweep-batch", help="Sweep batchSize over these values, e.g. 1,4,8 (needs --enable-model-api).")
@click.option("--sweep-delay", default="5,50", show_default=True, help="maxBatchDelay values (ms) for the sweep.")
@json_option
@home_option()
def bench(model, inputs, concurrency, count, duration, sweep_batch, sweep_delay, as_json, home):
    """Drive MODEL on the running server and report throughput, p50/p90/p99 latency and errors."""
    from . import bench as load

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
        )
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
        return
    files = [chosen.request_body(data, kind) for data, kind in files]
    bound = f"{count} requests" if count is not None else f"{duration:g} s"
    progress(f"{model}: {concurrency} clients, {bound}")
    result = load.run_load(srv.predict_url(model), files, concurrency, count, duration, headers)
    summary = result.summary()
    if as_json:
        print_json(finite(summary))
    else:
        click.echo(load.summary_line(summary))
    sys.exit(1 if summary["errors"] else 0)


@main.group()
def export():
    """Export the model store and config for a serving platform."""


def parse_split(values):
    pairs = []
    for value in values:
        model, sep, weight = value.rpartition("=")
        if not sep or not model or not weight.isdigit():
            raise UserError(f"--split {value!r} must look like MODEL=PERCENT, e.g. --split resnet18=90")
        pairs.append((model, int(weight)))
    return pairs


@export.command("kserve", cls=Command)
@click.argument("out", type=click.Path())
@click.option("--name", required=True, help="InferenceService name.")
@click.option("--storage-uri", required=True, help="pvc://CLAIM/PATH the tree is copied to.")
@click.option(
    "--protocol",
    type=click.Choice(choices.KSERVE_PROTOCOLS),
    default="v1",
    show_default=True,
    help="The InferenceService's protocolVersion, which DEPLOY.md's request bodies and curl lines speak.",
)
@click.option(
    "--config",
    "config_path",
    default="config/config.properties",
    show_default=True,
    help="The config to export ('tsctl config' writes it): its model_snapshot names the models.",
)
@click.option(
    "--model-store",
    default="model-store",
    show_default=True,
    help="The directory holding the archives the config names.",
)
@click.option("--canary", type=int, help="Percent of traffic for the new revision (canaryTrafficPercent).")
@click.option("--split", multiple=True, help="MODEL=PERCENT, given twice: an InferenceGraph Splitter (A/B).")
@click.option("--transformer-image", help="Image for a custom transformer running a toolkit handler's pre/post.")
@click.option("--transformer-archive", help="The toolkit .mar whose pre/post the transformer runs.")
@click.option("--transformer-model", help="The predictor model the transformer sends tensors to.")
@click.option(
    "--namespace",
    default="default",
    show_default=True,
    help="The Kubernetes namespace of the InferenceService, the claim and the copy pod.",
)
@click.option("--cpu", default="1", show_default=True, help="CPU request and limit of the predictor's container.")
@click.option(
    "--memory", default="2Gi", show_default=True, help="Memory request and limit of the predictor's container."
)
@runtime_option("The TorchServe image KServe runs: each archive's requirements are resolved and pinned for it.")
@click.option("--offline", is_flag=True, help="Bundle each archive's wheels: its per-model install needs no index.")
@engine_option("What serves the tree in the pod; kserve writes a serving runtime for the engine's image (--image).")
@click.option("--image", help="The tsctl engine's image (--engine kserve), built from OUT/predictor-image.")
@click.option(
    "--runtime-kind",
    type=click.Choice(choices.RUNTIME_KINDS),
    help="--engine kserve: the runtime's kind (default ClusterServingRuntime; ServingRuntime: in --namespace).",
)
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@json_option
def export_kserve(out, config_path, split, as_json, **options):
    """Write OUT/{config,model-store} for a PVC, the InferenceService and the deploy commands."""
    from . import kserve, reports

    progress = Progress.for_command(as_json)  # resolving and downloading requirements takes seconds per archive
    export_options = kserve.ExportOptions(out=out, config=config_path, split=parse_split(split), **options)
    export_options.progress = progress
    notice = engines.named(export_options.engine).export_notice(export_options)
    if notice:
        progress(notice)
    result = kserve.export(export_options)
    emit(reports.export_report(out, result), reports.export_text, as_json)


@export.command("seldon", cls=Command)
@click.argument("out", type=click.Path())
@click.option("--image", required=True, help="The server image to build from OUT/server-image (REGISTRY/NAME:TAG).")
@click.option(
    "--model-store", default="model-store", show_default=True, help="The directory holding the archives to export."
)
@click.option(
    "--config",
    "config_path",
    help="config.properties (default: config/config.properties beside the store when it exists, else each "
    "archive's model-config.yaml).",
)
@click.option("--server", default="tsctl-mlserver", show_default=True, help="The Seldon Server's name.")
@click.option("--claim", default="tsctl-models", show_default=True, help="The PersistentVolumeClaim holding models/.")
@click.option(
    "--namespace",
    default="seldon-mesh",
    show_default=True,
    help="The namespace Seldon Core 2 runs in: the Server, Models, claim and copy pod go there.",
)
@click.option("--cpu", default="1", show_default=True, help="The mlserver container's CPU.")
@click.option("--memory", default="2Gi", show_default=True, help="Each Model's memory (the server asks for the sum).")
@click.option("--ab", multiple=True, help="MODEL=WEIGHT, twice or more: an Experiment between models of the store.")
@click.option("--default", "default_model", help="The --ab candidate whose own endpoint is split too (default: first).")
@click.option("--experiment", help="The Experiment's name (default: FIRST-ab).")
@click.option(
    "--transformer-archive", help="A toolkit .mar run as the Pipeline step before the model (its preprocessing)."
)
@click.option("--transformer-model", help="The model (or the --ab experiment) the transformer's Pipeline sends to.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@json_option
def export_seldon(out, config_path, ab, default_model, as_json, **options):
    """Write OUT/models/NAME/ for a PVC, a Seldon Core 2 Server, Models (Experiment, Pipeline) and DEPLOY.md."""
    from . import reports, seldon

    result = seldon.export(
        seldon.SeldonOptions(out=out, config=config_path, ab=seldon.parse_ab(ab), default=default_model, **options)
    )
    emit(reports.export_report(out, result), reports.export_text, as_json)


@main.command(cls=Command)
@json_option
def doctor(as_json):
    """Check what this machine needs for each engine: one line per check, each problem with its fix.

    Exits 0 when the default engine (TorchServe) has everything it needs (Python, TorchServe and torch,
    Java 17+), 1 when it lacks something; what only other engines and commands need is reported alone."""
    from . import doctor as checks

    found = checks.run_checks()
    ok = checks.all_ok(found)
    if as_json:
        print_json({"ok": ok, "checks": [check.to_dict() for check in found]})
    else:
        for check in found:
            click.echo(check.line())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
