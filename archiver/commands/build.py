"""Commands that make files from the user's: ``init`` (a handler of one's own), ``package`` (an archive),
``inspect`` (what an archive holds) and ``config`` (config.properties for a store of archives)."""

import click

from handlers import catalogue

from .. import choices, scaffold
from ..engines import DEFAULT_CONFIG
from ..errors import UserError
from ..output import Progress, json_option
from .common import Command, emit, handler_errors
from .options import GPU_HELP, METRICS_CONFIG, content_type_option, gpu_option, runtime_option


def handler_list(names) -> str:
    """--handler's and --from's help: each toolkit handler named and what it does, from the catalogue."""
    return "; ".join(f"{name}: {catalogue.HANDLERS[name].task}" for name in names) + "."


@click.command(cls=Command)
@click.argument("name")
@click.option(
    "--from",
    "start",
    required=True,
    type=click.Choice(list(scaffold.STARTS)),
    help="The toolkit handler to subclass; blank: ToolkitHandler with every hook written out. "
    + handler_list(name for name in scaffold.STARTS if name in catalogue.HANDLERS),
)
@json_option
def init(name, start, as_json):
    """Write NAME/: a handler of your own (handler.py), its model-config.yaml and a test."""
    from .. import reports

    written = scaffold.init(name, start)
    base = scaffold.STARTS[start]
    report = reports.init_report(written, start, f"{base.module}.{base.class_name}")
    emit(report, reports.init_text, as_json)


@click.command(cls=Command)
@click.option("--model-name", required=True, help="Model name (the URL path /predictions/NAME).")
@click.option("-v", "--version", "version", default="1.0", show_default=True, help="Model version.")
@click.option(
    "--serialized-file",
    help="Weights: state_dict .pt/.pth, TorchScript, .pt2, .safetensors, .onnx, or a Hugging Face model directory.",
)
@click.option("--model-file", help="Python file defining the model class (eager and safetensors weights).")
@click.option(
    "--handler",
    required=True,
    help="A toolkit handler or your handler .py file. " + handler_list(catalogue.HANDLERS),
)
@click.option("--extra-files", default="", help="Comma-separated files or directories to add.")
@click.option("-r", "--requirements-file", help="requirements.txt installed per model by TorchServe.")
@click.option("-c", "--config-file", help="model-config.yaml (workers, batching, handler: settings).")
@click.option(
    "--runtime",
    type=click.Choice(list(choices.ARCHIVE_RUNTIMES)),
    default="python",
    show_default=True,
    help="The manifest's runtime, as torch-model-archiver writes it (python and python3 are the same).",
)
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
    "--metrics-config",
    type=click.Path(),
    help=f"With --golden: {METRICS_CONFIG[:-2]}; the config: {DEFAULT_CONFIG} when it exists).",
)
@content_type_option("--golden-content-type", "file of --golden DIR")
@gpu_option(
    "cpu", "With --golden: where the golden run's worker runs: " + GPU_HELP[0].lower() + GPU_HELP[1:], "--golden-gpu"
)  # the reference answers: on the CPU unless asked
@click.option(
    "--sign-key",
    type=click.Path(),
    help="Sign every file with this PEM EC private key (OpenSSF model-signing, MAR-INF/model.sig).",
)
@json_option
def package(golden, golden_allow_errors, metrics_config, kind, golden_gpu, as_json, **flags):
    """Build model-store/NAME.mar (torch-model-archiver's flags)."""
    from .. import mar, reports

    extra = [p.strip() for p in flags.pop("extra_files").split(",") if p.strip()]
    options = mar.PackageOptions(extra_files=extra, **flags)
    given_flags = (
        ("--golden-allow-errors", golden_allow_errors),
        ("--metrics-config", metrics_config),
        ("--golden-content-type", kind is not None),
        ("--golden-gpu", golden_gpu != "cpu"),
    )
    for flag, given in given_flags:
        if given and not golden:
            raise UserError(f"{flag} goes with --golden DIR: give the inputs whose answers to record")
    if golden:
        from .. import golden as golden_answers  # runs the archive in-process: imports torch
        from .. import inprocess

        progress = Progress.for_command(as_json)
        metrics = inprocess.metrics_config(metrics_config)
        # its handler failing on the golden run: nothing written, one line (its log kept off the terminal)
        with inprocess.quiet_logs(), handler_errors(options.model_name):
            path, planned, recorded = golden_answers.package(
                options, golden, progress, golden_allow_errors, metrics, kind, golden_gpu
            )
    else:
        path, planned = mar.build(options)
        recorded = None
    from handlers.signing import signature_of

    from ..opened_archive import opened

    with opened(path) as built:
        size = path.stat().st_size if path.is_file() else sum(s for _, s in built.members)
        report = reports.package_report(path, size, planned, recorded, signature_of(built))
    emit(report, reports.package_text, as_json)


@click.command(cls=Command)
@click.argument("archive", type=click.Path())
@json_option
def inspect(archive, as_json):
    """Print an archive's manifest, files and sizes, and whether it is signed and by which key."""
    from handlers import golden, signing  # no torch: the golden.json and signature formats

    from .. import reports
    from ..opened_archive import opened

    with opened(archive) as found:
        signature = signing.signature_of(found)
        report = reports.inspect_report(found.manifest, found.members, golden.read(found), signature)
    emit(report, reports.inspect_text, as_json)


# tsctl config's flags that set one model-config.yaml key for every model: (flag, key, least value, help)
WORKER_FLAGS = (
    (
        "--min-workers",
        "minWorkers",
        1,
        "Workers each model starts with, for every model (else its model-config.yaml's minWorkers, else 1).",
    ),
    (
        "--max-workers",
        "maxWorkers",
        1,
        "Most workers per model, for every model (else its model-config.yaml's maxWorkers, else 1).",
    ),
    (
        "--batch-size",
        "batchSize",
        1,
        "Most requests per handler call, for every model (else its model-config.yaml's batchSize, else 1).",
    ),
    (
        "--max-batch-delay",
        "maxBatchDelay",
        0,
        "Milliseconds to wait to fill a batch, for every model (else its model-config.yaml's, else 100).",
    ),
    (
        "--response-timeout",
        "responseTimeout",
        1,
        "Seconds a batch may take before its worker is restarted, for every "
        "model (else its model-config.yaml's, else 120).",
    ),
)


def worker_options(command):
    """WORKER_FLAGS as options, in order; each arrives under its model-config.yaml key (None: not given)."""
    for flag, key, least, help_text in reversed(WORKER_FLAGS):
        command = click.option(flag, key, type=click.IntRange(least), help=help_text)(command)
    return command


@click.command(cls=Command)
@click.option(
    "--model-store",
    default="model-store",
    show_default=True,
    help="The directory of archives: each one gets a model_snapshot entry.",
)
@click.option("--output", default="config/config.properties", show_default=True, help="Where to write the config.")
@worker_options
@runtime_option(
    "The TorchServe image KServe runs: archives whose requirements it lacks are named (nothing is resolved)."
)
@json_option
def config(model_store, output, runtime, as_json, **overrides):
    """Write config/config.properties with a model_snapshot of every archive in the store.

    The per-model pip install is off: torchserve runs in an environment that has the archives'
    packages. Each archive whose requirements KServe's image lacks is named, with what to run instead."""
    from .. import properties, reports

    path = properties.write_config(model_store, output, overrides)
    snapshot = properties.snapshot_of(properties.read_properties(path), path)
    report = reports.config_report(path, snapshot, properties.kserve_gaps(model_store, runtime))
    emit(report, reports.config_text, as_json)
