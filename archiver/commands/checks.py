"""Commands that check an archive or this machine: ``verify`` (replay its golden answers, check its
signature), ``shadow`` (a candidate server's answers against the current one's), ``run`` (its handler
in-process on files), ``doctor`` (what each engine needs) and ``simulate`` (what an export's autoscaling
would do with load, on a measured capacity)."""

import sys
from pathlib import Path
from typing import Optional

import click

from .. import choices
from ..errors import ServerFailure, UserError
from ..output import json_option, print_json
from .common import Command, handler_errors, input_file, running_server
from .options import (
    GPU_HELP,
    check_expectations,
    content_type_option,
    expect_options,
    gpu_option,
    home_option,
    metrics_options,
    timeout_option,
)


@click.command(cls=Command)
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
@click.option(
    "--token",
    help="With --url: the server's inference key (TorchServe's key_file.json), sent as 'Authorization: Bearer'. "
    "--served reads it from the server's own key file.",
)
@click.option("--atol", type=click.FloatRange(0), default=1e-4, show_default=True, help="How far a number may move.")
@timeout_option(60.0, "With a server: seconds each answer may take, whole (from the request to its last byte).")
@click.option("--golden-from", type=click.Path(), help="Use another archive's golden answers (an export's original).")
@json_option
@click.option("--public-key", type=click.Path(), help="Check ARCHIVE's signature (package --sign-key) with this key.")
@expect_options
@metrics_options
@gpu_option(help_text="In-process: " + GPU_HELP[0].lower() + GPU_HELP[1:])
def verify(
    archive,
    url,
    served,
    home,
    protocol,
    model,
    token,
    atol,
    timeout,
    golden_from,
    as_json,
    public_key,
    expect_name,
    expect_version,
    metrics_config,
    config_path,
    gpu,
):
    """Replay ARCHIVE's golden requests (package --golden) and compare each answer with the recorded one;
    with --public-key, check its signature first (and stop there when it has no golden answers)."""
    from handlers import golden as golden_format
    from handlers.archives import opened

    from .. import golden
    from ..http_client import AnswerError

    check_expectations(public_key, expect_name, expect_version)
    check_where_flags(url, served, token, gpu, metrics_config or config_path)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if public_key:
        from handlers.signing import read_key

        read_key(public_key)  # a wrong key file is named before the archive is read
    with opened(archive) as found:  # read once: its signature, golden answers, manifest and files
        signature = verified_signature(found, archive, public_key, expect_name, expect_version, as_json)
        if signature and not served and not url and golden_format.read(found) is None:
            if as_json:
                print_json({"where": None, "checked": 0, "problems": [], "versions": [], "signature": signature})
            return
        if served:
            if url:
                raise UserError("--served and --url both name a server: give one")
            from .. import engines

            srv = running_server(home, model or found.model_name)
            url, headers = srv.inference, srv.headers("inference")
            protocol = protocol or engines.engine_of(srv).protocol  # MLServer speaks v2 only
        protocol = protocol or "ts"
        from ..output import Progress

        progress = Progress.for_command(as_json)
        if url is None:  # in-process: the handler's log kept off the terminal, its failure one line
            from .. import inprocess

            metrics = inprocess.metrics_config(metrics_config, config_path)
            with inprocess.quiet_logs(), handler_errors(archive):
                report = golden.verify(
                    found, url, protocol, atol, model, timeout, golden_from, progress, metrics, gpu=gpu
                )
        else:
            try:
                report = golden.verify(
                    found, url, protocol, atol, model, timeout, golden_from, progress, headers=headers
                )
            except AnswerError as exc:  # past tsctl's bounds on an answer (http_client.py): it names the URL
                hint = ": raise --timeout" if isinstance(exc, TimeoutError) else ""
                raise ServerFailure(f"{exc}{hint}") from None
            except OSError as exc:
                raise ServerFailure(f"could not reach {url}: {exc}") from None
    print_report(report, signature, as_json)
    sys.exit(1 if report.problems else 0)


def check_where_flags(url, served, token, gpu, in_process_config):
    """``verify``'s flags that belong to one place the answers come from: a server, or the in-process run."""
    if (url or served) and in_process_config:
        raise UserError("--metrics-config and --config are for the in-process run: a server reads its own config")
    if token and not url:
        raise UserError("--token is for --url: --served reads the server's key file, and in-process needs no key")
    if (url or served) and gpu != "auto":
        raise UserError("--gpu is for the in-process run: a server places its own workers (number_of_gpu)")


def print_report(report, signature, as_json: bool):
    """``verify``'s answer: each mismatch, the count matched and the versions' notes, or one JSON object."""
    if as_json:
        print_json({**report.as_json(), "signature": signature})
        return
    for line in report.problems:
        click.echo(f"mismatch: {line}")
    matched = report.checked - len(report.problems)
    click.echo(f"{matched} of {report.checked} golden answers match ({report.where})")
    for line in report.versions:
        click.echo(f"  note: {line}")


@click.command(cls=Command)
@click.argument("archive", type=click.Path())
@click.option("--current", required=True, help="The server answering now: http://HOST:PORT, or HOST:PORT.")
@click.option("--candidate", required=True, help="The server of the version to roll out (same forms).")
@click.option(
    "--protocol",
    type=click.Choice(["ts", "v1", "v2"]),
    default="ts",
    show_default=True,
    help="How requests are sent: ts (TorchServe's /predictions/MODEL), v1 or v2 (KServe).",
)
@click.option(
    "--protocol-candidate",
    type=click.Choice(["ts", "v1", "v2"]),
    help="The candidate's protocol when it differs (MLServer speaks v2 only). Default: --protocol.",
)
@click.option("--model", help="The model's name on the servers (default: the archive's).")
@click.option("--model-candidate", help="The candidate's model name if other (a Seldon Model). Default: --model.")
@click.option(
    "--inputs",
    type=click.Path(),
    help="Request bodies to send (a directory, one file each; or a JSON list) instead of the archive's golden inputs.",
)
@click.option("--token-current", help="The current server's inference key, sent as 'Authorization: Bearer'.")
@click.option("--token-candidate", help="The candidate server's inference key.")
@click.option("--atol", type=click.FloatRange(0), default=1e-4, show_default=True, help="How far a number may move.")
@click.option(
    "--max-disagree",
    default="0",
    show_default=True,
    help="How many inputs may disagree before the check fails: a number, or a percentage (5%).",
)
@timeout_option(60.0, "Seconds each answer may take, whole: from the request to its last byte.")
@json_option
def shadow(
    archive,
    current,
    candidate,
    protocol,
    protocol_candidate,
    model,
    model_candidate,
    inputs,
    token_current,
    token_candidate,
    atol,
    max_disagree,
    timeout,
    as_json,
):
    """Send the same inputs (ARCHIVE's golden inputs, or --inputs) to the current and the candidate server
    and report per input whether their answers agree; exit 1 when more than --max-disagree disagree: the
    gate to run before raising canaryTrafficPercent or promoting a mirrored model."""
    from .. import shadow as check
    from ..output import Progress

    sides = (
        check.Side("current", current, protocol, model, token_current),
        check.Side("candidate", candidate, protocol_candidate or protocol, model_candidate or model, token_candidate),
    )
    report = check.shadow(archive, *sides, inputs, atol, max_disagree, timeout, Progress.for_command(as_json))
    if as_json:
        print_json(report.as_json())
    else:
        for compared in report.inputs:
            click.echo(check.line(compared))
        click.echo(check.summary(report))
    sys.exit(0 if report.passed else 1)


@click.command(cls=Command)
@click.argument("result", type=click.Path())
@click.option(
    "--autoscale",
    "modes",
    multiple=True,
    type=click.Choice(choices.AUTOSCALE_MODES),
    help="The mode to simulate, as 'tsctl export kserve --autoscale MODE --from-bench RESULT' writes it; "
    "repeat for several (default: all three).",
)
@click.option(
    "--trace",
    "traces",
    multiple=True,
    type=click.Choice(choices.SIMULATED_TRACES),
    help="ramp (to --peak over 10 minutes, held 5, down in 5), spike (5x to --peak for a minute) or diurnal "
    "(a day in 2 hours, 2x to --peak); repeat for several (default: all three).",
)
@click.option("--peak", type=float, help="The traces' peak, x one replica's best throughput (default 50, spike 30).")
@click.option(
    "--start-seconds",
    type=float,
    default=choices.ENGINE_COLD_START_S,
    show_default=True,
    help="How long a new replica takes to be ready (default: the tsctl engine's measured cold start; add your "
    "cluster's scheduling and image pull).",
)
@click.option("--max-replicas", type=int, help="maxReplicas (default: what --peak-rps gives for the trace's peak).")
@click.option("--plot", type=click.Path(), help="Replicas, p99 and requests waiting over time, as a PNG.")
@json_option
def simulate(result, modes, traces, peak, start_seconds, max_replicas, plot, as_json):
    """What an export's autoscaling would do with load, simulated on RESULT (tsctl bench --capacity --out)."""
    from ..autoscaling import simulate as simulation
    from ..output import Progress

    for flag, value in (("--peak", peak), ("--start-seconds", start_seconds)):
        if value is not None and value != value:
            raise UserError(f"{flag} must be a number, e.g. {flag} 30")
    if plot is not None and not Path(plot).resolve().parent.is_dir():
        raise UserError(f"--plot {plot}: its directory does not exist")
    doc = simulation.load(result)
    modes, traces = list(modes or choices.AUTOSCALE_MODES), list(traces or choices.SIMULATED_TRACES)
    done = simulation.run(doc, modes, traces, peak, start_seconds, max_replicas, Progress.for_command(as_json))
    if plot:
        simulation.plot(doc, done["runs"], traces, modes, plot)
    if as_json:
        print_json(done["result"])
    else:
        for line in simulation.table(done["result"]):
            click.echo(line)


def verified_signature(archive, shown: str, public_key, expect_name, expect_version, as_json) -> Optional[dict]:
    """With ``public_key``: ``archive``'s signature checked (exit 1 otherwise), said on the terminal
    (stderr with --json, whose stdout is JSON) under the name the user gave it (``shown``), and
    reported; None without a key."""
    if not public_key:
        return None
    from .. import signing

    name, version, key = signing.verify_archive(archive, public_key, expect_name, expect_version)
    click.echo(
        f"{shown}: signature verified: every file is as signed, as {name} version {version} by key {key}",
        err=as_json,
    )
    return {"signed": True, "verified": True, "name": name, "version": version, "key_fingerprint": key}


@click.command(cls=Command)
@click.argument("archive", type=click.Path())
@click.argument("inputs", nargs=-1, required=True, type=click.Path())
@click.option("--public-key", type=click.Path(), help="Run ARCHIVE only if it is signed with this key's private half.")
@expect_options
@metrics_options
@content_type_option()
@gpu_option()
@json_option
def run(archive, inputs, public_key, expect_name, expect_version, metrics_config, config_path, kind, gpu, as_json):
    """Run ARCHIVE in a TorchServe worker process of its own (no server) on each INPUT file, answering as 'tsctl
    predict' does."""
    from handlers.archives import opened

    from .. import inprocess
    from ..output import Progress

    paths = [input_file(p) for p in inputs]
    check_expectations(public_key, expect_name, expect_version)
    metrics = inprocess.metrics_config(metrics_config, config_path)
    with opened(archive) as found:  # read once, here and by the run
        found.manifest  # a missing, foreign or unsafe archive is refused before torch loads
        expected = (None, None)
        if public_key:  # the key file and the expected name checked before torch loads
            from handlers.signing import read_key

            from ..signing import stem

            read_key(public_key)
            expected = (expect_name or stem(Path(archive)), expect_version)
        for note in inprocess.config_notes(found):  # as the engine logs them at load
            click.echo(f"note: {note}", err=True)
        with handler_errors(archive):
            answered = inprocess.run(
                found, paths, public_key, Progress.for_command(as_json), expected, metrics, kind, gpu
            )
    if as_json:
        print_json({"archive": str(archive), "results": [inprocess.as_json(p, r) for p, r in answered]})
    else:
        for path, response in answered:
            click.echo(inprocess.line(path, response))
    sys.exit(0 if all(r.status == 200 for _, r in answered) else 1)


# The archive's own handlers/ copy raises its own ModelLoadError/SettingsError classes: match by name.
USER_MISTAKES = {("handlers.loading", "ModelLoadError"), ("handlers.settings", "SettingsError")}


@click.command(cls=Command)
@json_option
def doctor(as_json):
    """Check what this machine needs for each engine: one line per check, each problem with its fix.

    Exits 0 when the default engine (TorchServe) has everything it needs (Python, TorchServe and torch,
    Java 17+), 1 when it lacks something; what only other engines and commands need is reported alone."""
    from .. import doctor as checks

    found = checks.run_checks()
    ok = checks.all_ok(found)
    if as_json:
        print_json({"ok": ok, "checks": [check.to_dict() for check in found]})
    else:
        for check in found:
            click.echo(check.line())
    sys.exit(0 if ok else 1)
