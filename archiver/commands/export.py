"""``tsctl export kserve`` and ``tsctl export seldon``: a model store and its config, written out for a
serving platform; ``tsctl export check``: an exported tree against the digest its InferenceService pins."""

import sys

import click

from .. import choices
from ..errors import UserError
from ..output import Progress, json_option
from .common import Command, emit
from .options import engine_option, pod_options, runtime_option, storage_options


@click.group()
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
@storage_options(
    "Where the pod finds the tree: copied onto a claim (--storage-uri), or a model image (--image-ref) KServe 0.20 "
    "mounts as an image volume."
)
@click.option("--storage-uri", help="--storage pvc: pvc://CLAIM/PATH the tree is copied to.")
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
@pod_options(
    "CPU request and limit of the predictor's container.",
    "Memory request and limit of the predictor's container.",
    "NVIDIA GPUs of the predictor (nvidia.com/gpu): number_of_gpu in the tree's config, a CUDA image.",
)
@runtime_option("The TorchServe image KServe runs: each archive's requirements are resolved and pinned for it.")
@click.option("--offline", is_flag=True, help="Bundle each archive's wheels: its per-model install needs no index.")
@engine_option("What serves the tree in the pod; tsctl writes a serving runtime for the engine's image (--image).")
@click.option("--image", help="The tsctl engine's image (--engine tsctl), built from OUT/predictor-image.")
@click.option(
    "--runtime-kind",
    type=click.Choice(choices.RUNTIME_KINDS),
    help="--engine tsctl: the runtime's kind (default ClusterServingRuntime; ServingRuntime: in --namespace).",
)
@click.option(
    "--auto-select",
    is_flag=True,
    help="--engine tsctl: KServe picks the runtime for InferenceServices naming only modelFormat pytorch "
    "(the InferenceService then names no runtime).",
)
@click.option(
    "--priority",
    type=int,
    help="With --auto-select: its priority for pytorch (default 1, below kserve-torchserve's 2, which stays the "
    "pick while installed; 3 or more: this runtime first).",
)
@click.option(
    "--autoscale",
    type=click.Choice(choices.AUTOSCALE_MODES),
    help="Write the autoscaling: Knative's KPA, KEDA on the engine's in-flight gauge, or the HPA on CPU; with a "
    "PodDisruptionBudget, Prometheus annotations and a PodMonitor/ServiceMonitor.",
)
@click.option(
    "--from-bench", help="The capacity result 'tsctl bench --capacity --out' wrote: the numbers come from it."
)
@click.option("--target", type=int, help="One replica's concurrency by hand (at most the measured knee).")
@click.option(
    "--scale-metric",
    type=click.Choice(("concurrency", "rps")),
    default="concurrency",
    show_default=True,
    help="--autoscale knative: what the KPA scales on.",
)
@click.option(
    "--min-replicas",
    type=int,
    default=1,
    show_default=True,
    help="The fewest replicas (KServe's minReplicas; also without --autoscale).",
)
@click.option("--max-replicas", type=int, help="--autoscale: the most replicas (default 10, or from --peak-rps).")
@click.option("--peak-rps", type=float, help="--autoscale: the peak load; maxReplicas = peak / one replica's rps.")
@click.option(
    "--scale-down-delay",
    default="300s",
    show_default=True,
    help="--autoscale: how long load must stay low before replicas go (Ns, Nm, Nh; at most 1h).",
)
@click.option(
    "--prometheus-url",
    default="http://prometheus-operated.monitoring.svc:9090",
    show_default=True,
    help="--autoscale keda: the Prometheus server KEDA queries.",
)
@click.option(
    "--monitor",
    type=click.Choice(("podmonitor", "servicemonitor")),
    help="--autoscale: how the Prometheus Operator scrapes the pods (default: a PodMonitor where the pod declares "
    "its metrics port, the tsctl engine's; else a Service and a ServiceMonitor, TorchServe's 8082).",
)
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@json_option
def export_kserve(out, config_path, split, as_json, **options):
    """Write OUT/{config,model-store} for a PVC, the InferenceService and the deploy commands."""
    from .. import reports
    from ..export.kserve import export as kserve
    from ..export.kserve import targets

    progress = Progress.for_command(as_json)  # resolving and downloading requirements takes seconds per archive
    export_options = kserve.ExportOptions(out=out, config=config_path, split=parse_split(split), **options)
    export_options.progress = progress
    notice = targets.named(export_options.engine).export_notice(export_options.target_flags)
    if notice:
        progress(notice)
    result = kserve.export(export_options)
    emit(reports.export_report(out, result), reports.export_text, as_json)


@export.command("check", cls=Command)
@click.argument("tree", type=click.Path())
@click.option("--digest", help="The tree's digest, sha256:HEX (default: the one TREE/inferenceservice.yaml pins).")
@json_option
def export_check(tree, digest, as_json):
    """Check an exported TREE (OUT, its copy on a claim, an unpacked model image) as the pod does before a
    worker loads: every file of config/, model-store/ and transformer/ as the export wrote it, no more and no
    fewer, its listing the digest the InferenceService pins. Exit 1 naming the first file that differs."""
    from pathlib import Path

    from .. import reports
    from ..export import tree_check

    report = tree_check.check(Path(tree), digest)
    emit(report, reports.tree_check_text, as_json)
    sys.exit(1 if report["problem"] else 0)


@export.command("seldon", cls=Command)
@click.argument("out", type=click.Path())
@click.option(
    "--image",
    required=True,
    help="The image to build (REGISTRY/NAME:TAG): Core 2's server image from OUT/server-image; --core 1: the "
    "units' image from OUT/component-image.",
)
@click.option(
    "--model-store", default="model-store", show_default=True, help="The directory holding the archives to export."
)
@click.option(
    "--config",
    "config_path",
    help="config.properties (default: config/config.properties beside the store when it exists, else each "
    "archive's model-config.yaml).",
)
@click.option(
    "--core",
    type=click.Choice(("1", "2")),
    default="2",
    show_default=True,
    help="Seldon Core 2 (Models on MLServer, an Experiment, a Pipeline) or Seldon Core 1 (a SeldonDeployment: "
    "TRANSFORMER -> ROUTER -> MODELs under seldon-core-microservice; needs --transformer-archive).",
)
@click.option("--name", help="--core 1: the SeldonDeployment's name (default tsctl-graph).")
@click.option("--server", default="tsctl-mlserver", show_default=True, help="The Seldon Server's name.")
@click.option("--claim", default="tsctl-models", show_default=True, help="The PersistentVolumeClaim holding models/.")
@storage_options("Where the Server finds models/: on --claim, or a model image (--image-ref) mounted into its pod.")
@click.option(
    "--namespace",
    help="The namespace Seldon Core 2 runs in (default seldon-mesh): the Server, Models, claim and copy pod go "
    "there; --core 1: the SeldonDeployment's (default seldon).",
)
@pod_options(
    "The mlserver container's CPU (--core 1: each unit's).",
    "Each Model's memory (the server asks for the sum; --core 1: each unit's).",
    "NVIDIA GPUs of the mlserver container (--core 1: each model unit's), and a CUDA torch in the image.",
)
@click.option(
    "--ab",
    multiple=True,
    help="MODEL=WEIGHT, twice or more: an Experiment between models of the store (--core 1: the router's "
    "children, the weights percents adding up to 100).",
)
@click.option(
    "--default",
    "default_model",
    help="The --ab candidate whose own endpoint is split too (default: first); with --mirror, the model it shadows.",
)
@click.option("--experiment", help="The Experiment's name (default: FIRST-ab; with --mirror alone: DEFAULT-mirror).")
@click.option(
    "--mirror",
    help="MODEL[=PERCENT]: an Experiment mirroring PERCENT (default 100) of --default's requests to MODEL, and "
    "experiment-promote.yaml, applied once 'tsctl shadow' passes.",
)
@click.option(
    "--transformer-archive",
    help="A toolkit image .mar run as the Pipeline step before the model (its preprocessing); --core 1 (required): "
    "the graph's TRANSFORMER unit.",
)
@click.option(
    "--transformer-model",
    help="The model (or the --ab experiment) the transformer's Pipeline sends to; --core 1: the one MODEL of a graph "
    "without a router (instead of --ab).",
)
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@json_option
def export_seldon(out, config_path, ab, default_model, mirror, as_json, core, name, **options):
    """Write OUT/models/NAME/ for a PVC, a Seldon Core 2 Server, Models (Experiment, Pipeline) and DEPLOY.md
    (--core 1: a SeldonDeployment, its components' image and DEPLOY.md)."""
    from .. import reports
    from ..export.seldon import export as seldon
    from ..export.seldon import mirror as seldon_mirror

    if options["namespace"] is None:
        del options["namespace"]  # each Core's own default
    if core == "1":
        result = export_core1(out, config_path, seldon.parse_ab(ab), name, options)
        emit(reports.export_report(out, result), reports.export_text, as_json)
        return
    if name is not None:
        raise UserError("--name names a Seldon Core 1 SeldonDeployment: with --core 2, --server names the Server")
    result = seldon.export(
        seldon.SeldonOptions(
            out=out,
            config=config_path,
            ab=seldon.parse_ab(ab),
            default=default_model,
            mirror=seldon_mirror.parse_mirror(mirror),
            **options,
        )
    )
    emit(reports.export_report(out, result), reports.export_text, as_json)


CORE2_ONLY = ("server", "default_model", "experiment", "mirror", "storage", "image_ref")  # Core 2: Server, image


def export_core1(out, config_path, ab, name, options):
    """``tsctl export seldon --core 1``: refuses Seldon Core 2's own flags, then archiver/export/seldon/core1.py."""
    from ..export.seldon import core1

    context = click.get_current_context()
    for parameter in CORE2_ONLY:
        if context.get_parameter_source(parameter) is click.core.ParameterSource.COMMANDLINE:
            flag = "--default" if parameter == "default_model" else f"--{parameter}"
            raise UserError(
                f"{flag} is for Seldon Core 2 (--core 2): a Core 1 graph has no Server nor Experiment, "
                "and its units read the claim"
            )
    for parameter in ("server", "experiment", "storage", "image_ref"):
        options.pop(parameter)
    extra = {"name": name} if name else {}
    return core1.export(core1.SeldonCore1Options(out=out, config=config_path, ab=ab, **options, **extra))
