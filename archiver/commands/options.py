"""The options several commands share (``--home``, ``--timeout``, ``--engine``, ``--runtime``, what a
signed archive must be signed as, the content type files are sent with). Each reads only light modules:
a command's options are built when ``tsctl`` starts."""

import click

from .. import engines, kserve_images
from ..errors import UserError

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
    """``--engine NAME``: which runtime runs the archives, one of archiver.engines.ENGINES or an alias of one
    (``kserve``: the tsctl engine's older name, noted once on stderr)."""
    lines = " ".join(engine.help for engine in engines.ENGINES.values())
    return click.option(
        "--engine",
        type=click.Choice(list(engines.ENGINES) + list(engines.ALIASES)),
        default="torchserve",
        show_default=True,
        callback=resolve_alias,
        help=f"{help_text} {lines}",
    )


def resolve_alias(ctx, param, value):
    """The runtime's own name for ``--engine ALIAS``, with a note on stderr (stdout stays the answer)."""
    if value in engines.ALIASES:
        click.echo(f"note: --engine {value} is an alias of --engine {engines.ALIASES[value]}", err=True)
        return engines.ALIASES[value]
    return value


def runtime_option(help_text: str):
    """``--runtime IMAGE``: which of KServe's TorchServe images the files are for."""
    return click.option(
        "--runtime",
        type=click.Choice(list(kserve_images.RUNTIMES)),
        default=kserve_images.DEFAULT,
        show_default=True,
        help=help_text,
    )


def storage_options(help_text: str):
    """``--storage pvc|oci`` and ``--image-ref``: where the served tree goes, a claim or a model image."""

    def add(command):
        command = click.option("--image-ref", help="--storage oci: REGISTRY/NAME:TAG the model image is pushed to.")(
            command
        )
        return click.option(
            "--storage", type=click.Choice(("pvc", "oci")), default="pvc", show_default=True, help=help_text
        )(command)

    return add


def pod_options(cpu_help: str, memory_help: str, gpus_help: str):
    """``--cpu``, ``--memory`` and ``--gpus``: what each container of an export asks for (``help`` says which)."""

    def add(command):
        command = click.option("--gpus", type=int, default=0, show_default=True, help=gpus_help)(command)
        command = click.option("--memory", default="2Gi", show_default=True, help=memory_help)(command)
        return click.option("--cpu", default="1", show_default=True, help=cpu_help)(command)

    return add


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


METRICS_CONFIG = (
    "TorchServe's metrics.yaml (its metrics_config) for the handler's context.metrics: the metrics the handler "
    "gets from it must be declared there (default: the config's metrics_config, else TorchServe's own)."
)


def metrics_options(command):
    """``--metrics-config FILE`` and ``--config FILE``: the metrics.yaml of an archive run in-process
    (``archiver.inprocess.metrics_config``)."""
    command = click.option(
        "--config",
        "config_path",
        type=click.Path(),
        help=f"The config.properties the archive is served with, for its metrics_config (default "
        f"{engines.DEFAULT_CONFIG} when it exists, as for 'tsctl serve').",
    )(command)
    return click.option("--metrics-config", type=click.Path(), help=METRICS_CONFIG)(command)


CONTENT_TYPE = (
    "Send each {what} as this type, not the one its suffix says (.json application/json, .txt text/plain, .jpg "
    "image/jpeg...; else application/octet-stream); '' sends it without a Content-Type, as curl -T does. What a "
    "handler that is not the toolkit's receives, as TorchServe's worker decodes it: application/json -> the "
    "decoded JSON (a dict, a list...); text/... -> a str; any other type, or none -> the bytes (bytes too for JSON "
    "or text it cannot decode). Toolkit handlers get the bytes and read the type themselves."
)


def content_type_option(flag: str = "--content-type", what: str = "INPUT", more: str = ""):
    """``--content-type TYPE`` (or ``flag``): the type each file (``what``) is sent with instead of its
    suffix's; '' for none (``media_type``). The value is None when the option is not given."""
    help_text = CONTENT_TYPE.format(what=what) + (f" {more}" if more else "")
    return click.option(flag, "kind", metavar="TYPE", callback=media_type, help=help_text)


def media_type(ctx, param, value):
    """A ``--content-type``: a media type, ``type/subtype`` (parameters such as ``; charset=utf-8`` kept),
    or '' (no Content-Type)."""
    from handlers.golden import header_text
    from serving.runtimes.v2_requests import MEDIA_TYPE

    if value and not (header_text(value) and MEDIA_TYPE.match(value.split(";", 1)[0].strip())):
        raise click.BadParameter(
            f"{value[:80]!r} is not a media type (printable ASCII, at most 1024 characters): give one such as "
            "application/json, text/plain or application/octet-stream, or '' for none"
        )
    return value


GPU_HELP = (
    "Where the handler's worker runs: a GPU's id among the visible ones (CUDA_VISIBLE_DEVICES), 'cpu', or 'auto' "
    "(as TorchServe places a model's first worker: a GPU when there is one, unless the archive's "
    "model-config.yaml says deviceType: cpu)."
)


def gpu_option(default: str = "auto", help_text: str = GPU_HELP, flag: str = "--gpu"):
    """``--gpu ID|cpu|auto``: the load command's gpu for an in-process worker (archiver/inprocess.py: worker_gpu)."""
    return click.option(flag, default=default, show_default=True, metavar="ID|cpu|auto", help=help_text)
