"""``tsctl export kserve --engine tsctl``: the same PVC tree served by the tsctl engine, no TorchServe.

The engine (``python -m serving.engine``, serving/engine/app.py) reads what KServe's TorchServe runtime
reads: ``/mnt/models/model-store`` and ``/mnt/models/config/config.properties`` (its model_snapshot:
workers, batching, timeouts, versions). So the export declares it as a runtime of its own and the
InferenceService changes only its runtime, not its storage:

    OUT/servingruntime.yaml   a ClusterServingRuntime (default) or ServingRuntime (--runtime-kind) for
                              the engine's image, laid out as KServe's kserve-torchserve: modelFormat
                              pytorch, protocols v1, v2, grpc-v2, TS_SERVICE_ENVELOPE, the server-type
                              annotation that gives it TorchServe's defaults. Without --auto-select only
                              InferenceServices naming it use it; with it, KServe picks it for those that
                              name only modelFormat pytorch, in the order --priority sets (``selection_text``)
    inferenceservice.yaml     predictor.model: modelFormat pytorch, the same storageUri; runtime NAME
                              unless --auto-select (then it is the TorchServe export's, unchanged)
    OUT/predictor-image/      the image's build context:
        Dockerfile            FROM BASE_IMAGE (a build argument, python:X.Y-slim by default), uid 1000,
                              the requirements in a venv, handlers/; ENTRYPOINT the engine
                              (templates/tsctl-image.Dockerfile)
        requirements.txt      torch, torchvision, torchserve (its Python worker only), the engine's server
                              packages, and every archive's own requirements, pinned to the versions tsctl
                              was tested with here (the engine installs nothing per model)
        handlers/, serving/   the toolkit's handlers package (each archive runs its own copy) and the
                              serving package (the engine)

DEPLOY.md's step 0 is templates/kserve-tsctl-image.md.
"""

from pathlib import Path
from typing import Dict, List, Optional

from ...choices import RUNTIME_KINDS
from ...errors import UserError
from ..archive_facts import ArchiveFacts
from ..core import render
from ..images import PYTHON, pins, torch_index, with_archive_lines, write_context

IMAGE_DIR = "predictor-image"
RUNTIME_FILE = "servingruntime.yaml"
HTTP_PORT = 8080
GRPC_PORT = 8081
DEFAULT_RUNTIME_KIND = RUNTIME_KINDS[0]
MODEL_STORE = "/mnt/models/model-store"
TS_CONFIG = "/mnt/models/config/config.properties"
UID = 1000  # as KServe's TorchServe runtime runs: the files the copy pod wrote are its own
# KServe's own TorchServe runtime (kserve-torchserve, ../shared/kserve/kserve-torchserve-runtime.yaml): its
# priority for modelFormat pytorch, its server type (KServe >= 0.17 applies TorchServe's defaults to an
# InferenceService whose runtime carries it: the serviceEnvelope label TS_SERVICE_ENVELOPE reads, and
# PROTOCOL_VERSION), and the envelope it passes TorchServe, which the engine reads as TorchServe does
# (enable_envvars_config=true, serving/config_properties.py).
KSERVE_TORCHSERVE_PRIORITY = 2
DEFAULT_PRIORITY = 1  # below kserve-torchserve's: KServe's TorchServe stays the pick while it is installed
MAX_PRIORITY = 2**31 - 1  # the CRD's int32
SERVER_TYPE = {"serving.kserve.io/server-type": "torchserve"}
ENVELOPE_ENV = {"name": "TS_SERVICE_ENVELOPE", "value": "{{.Labels.serviceEnvelope}}"}
# What the engine and the workers it starts import (serving/engine/, serving/worker/: the HTTP and gRPC servers,
# /metrics, TorchServe's worker), pinned to the versions installed here; then each archive's own requirements.
BASE_PACKAGES = (
    "torch",
    "torchvision",
    "torchserve",
    "numpy",
    "Pillow",
    "PyYAML",
    "starlette",
    "uvicorn",
    "prometheus-client",
    "grpcio",
    "protobuf",
    "kserve",  # the v2 gRPC service's generated code (serving/engine/kserve_grpc.py)
    "javaproperties",  # config.properties, read as TorchServe reads it (serving/config_properties.py)
    "nvidia-ml-py",  # the GPUs the workers are placed on and /metrics' GPU gauges (serving/gpus.py)
)


def check_runtime_kind(kind: Optional[str]):
    if kind is not None and kind not in RUNTIME_KINDS:
        raise UserError(f"--runtime-kind {kind!r} must be {' or '.join(RUNTIME_KINDS)}")


def check_selection(flags):
    """--priority goes with --auto-select, and is a priority KServe's CRD takes (1 to 2**31-1)."""
    if flags.priority is None:
        return
    if not flags.auto_select:
        raise UserError("--priority goes with --auto-select: a runtime KServe does not pick by itself has no priority")
    if not 1 <= flags.priority <= MAX_PRIORITY:
        raise UserError(
            f"--priority {flags.priority} must be from 1 to {MAX_PRIORITY} (KServe's CRD: an int32, at least 1)"
        )


def priority(flags) -> int:
    return DEFAULT_PRIORITY if flags.priority is None else flags.priority


def selection_notes(flags) -> List[str]:
    """A note when --priority is kserve-torchserve's own: KServe's webhook refuses a second runtime that
    auto-selects the same format and version at the same priority while that one is installed and enabled."""
    if flags.auto_select and priority(flags) == KSERVE_TORCHSERVE_PRIORITY:
        return [
            f"--priority {KSERVE_TORCHSERVE_PRIORITY} is kserve-torchserve's own: KServe's webhook refuses "
            f"{RUNTIME_FILE} while that runtime is installed and enabled (same format, version and priority); "
            f"give 1 to let it keep pytorch, 3 or more to take pytorch over"
        ]
    return []


def runtime_kind(flags) -> str:
    return flags.runtime_kind or DEFAULT_RUNTIME_KIND


def runtime_name(flags) -> str:
    """The runtime's name: one per export, as its image holds this export's archives' requirements. A
    ClusterServingRuntime is cluster-wide, so its name carries the namespace too."""
    if runtime_kind(flags) == "ClusterServingRuntime":
        return f"tsctl-{flags.service.namespace}-{flags.service.name}"
    return f"tsctl-{flags.service.name}"


def container_args() -> List[str]:
    return [
        f"--model_store={MODEL_STORE}",
        f"--ts_config={TS_CONFIG}",
        f"--http_port={HTTP_PORT}",
        f"--grpc_port={GRPC_PORT}",
    ]


def check_ports(properties: Dict[str, str], path: Path):
    """The engine's listeners under the runtime's arguments (``container_args``: KServe's 8080 and 8081) and
    the exported config's addresses, as the engine will bind them (serving/engine/listeners.py): a UserError in one
    line when two take one port (management_address on 8081, a typical TorchServe config's), before the
    runtime is written to crash-loop on it."""
    from argparse import Namespace

    from serving import config_properties, frontend_settings
    from serving.engine import listeners

    try:
        frontend = frontend_settings.frontend_of(config_properties.with_environment(properties, {}), path)
        listeners.plan(frontend, Namespace(http_port=HTTP_PORT, grpc_port=GRPC_PORT), path)
    except config_properties.ConfigError as exc:
        raise UserError(
            f"{exc} (the runtime runs the engine with --http_port={HTTP_PORT} --grpc_port={GRPC_PORT}, KServe's "
            "ports: change the config)"
        ) from None


def model_format(flags) -> dict:
    """``supportedModelFormats``' one entry: pytorch, version 1 as kserve-torchserve's; with --auto-select
    picked by KServe for InferenceServices that name no runtime, at --priority."""
    if not flags.auto_select:
        return {"name": "pytorch", "version": "1", "autoSelect": False}
    return {"name": "pytorch", "version": "1", "autoSelect": True, "priority": priority(flags)}


def serving_runtime(flags, resources: dict) -> dict:
    """The (Cluster)ServingRuntime for the engine's image, laid out as KServe's own TorchServe runtime
    (kserve-torchserve: the same keys, server type, envelope, security context and uid, resources,
    Prometheus annotations)."""
    kind = runtime_kind(flags)
    metadata_ = {"name": runtime_name(flags)}
    if kind == "ServingRuntime":
        metadata_["namespace"] = flags.service.namespace
    metadata_["annotations"] = dict(SERVER_TYPE)
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": kind,
        "metadata": metadata_,
        "spec": {
            "annotations": {"prometheus.kserve.io/port": str(HTTP_PORT), "prometheus.kserve.io/path": "/metrics"},
            "supportedModelFormats": [model_format(flags)],
            "protocolVersions": ["v1", "v2", "grpc-v2"],
            "containers": [
                {
                    "name": "kserve-container",
                    "image": flags.image,
                    "args": container_args(),
                    "env": [dict(ENVELOPE_ENV)],
                    # One port, as Knative allows and KServe's runtimes use: HTTP (TorchServe's inference
                    # API, v1, v2, /metrics). gRPC listens on GRPC_PORT; DEPLOY.md says how to expose it.
                    "ports": [{"containerPort": HTTP_PORT, "protocol": "TCP"}],
                    "securityContext": {
                        "runAsUser": UID,
                        "allowPrivilegeEscalation": False,
                        "privileged": False,
                        "runAsNonRoot": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "resources": resources,
                }
            ],
        },
    }


def requirements(archives: List[ArchiveFacts]) -> str:
    """The image's requirements: the serving stack at the versions installed here, then each archive's
    own requirement lines (the engine installs nothing per model), each checked (images.with_archive_lines)."""
    return "\n".join(with_archive_lines(pins(BASE_PACKAGES), archives)) + "\n"


def write_image_context(out: Path, image: str, archives: List[ArchiveFacts], gpus: int = 0) -> List[Path]:
    """OUT/predictor-image/: Dockerfile (templates/tsctl-image.Dockerfile), requirements.txt, the handlers and
    serving packages."""
    dockerfile = render(
        "tsctl-image.Dockerfile",
        image=image,
        python=PYTHON,
        torch_index=torch_index(gpus),
        uid=UID,
        http_port=HTTP_PORT,
        grpc_port=GRPC_PORT,
        args=", ".join(f'"{arg}"' for arg in container_args()),
    )
    return write_context(out / IMAGE_DIR, dockerfile, requirements(archives))


def selection_text(flags) -> str:
    """DEPLOY.md's words on which InferenceServices KServe runs on this runtime (KServe's rules: the runtimes
    of the InferenceService's namespace first, then the cluster's, each by priority, highest first)."""
    if not flags.auto_select:
        return (
            f"The InferenceService names it (`runtime: {runtime_name(flags)}`); for InferenceServices that name "
            "only `modelFormat: pytorch` KServe keeps picking its own TorchServe runtime."
        )
    others = "The other InferenceServices it is picked for need their archives' requirements in its image too."
    if runtime_kind(flags) == "ServingRuntime":
        return (
            f"KServe picks it for every InferenceService in `{flags.service.namespace}` that names only `modelFormat: "
            "pytorch` (this one names no runtime), before any ClusterServingRuntime whatever its priority: KServe "
            f"tries the namespace's runtimes first. {others}"
        )
    ours = priority(flags)
    if ours > KSERVE_TORCHSERVE_PRIORITY:
        when = (
            f"before KServe's own kserve-torchserve (priority {KSERVE_TORCHSERVE_PRIORITY}; this one's: {ours}): "
            "new InferenceServices at once, existing ones at their next reconcile (an edit, or the KServe "
            "controller's restart)"
        )
    else:
        when = (
            f"once KServe's own kserve-torchserve (priority {KSERVE_TORCHSERVE_PRIORITY}; this one's: {ours}) is "
            "removed or disabled; while it is installed and enabled it stays the pick. Disabling it moves the "
            "InferenceServices it runs onto this runtime (KServe reconciles them): `kubectl patch "
            'clusterservingruntime kserve-torchserve --type merge -p \'{"spec":{"disabled":true}}\'`'
        )
    return (
        "KServe picks it for every InferenceService that names only `modelFormat: pytorch` (this one names no "
        f"runtime) {when}. {others}"
    )


def build_steps(flags) -> str:
    """DEPLOY.md's step 0 for the engine: build and push its image."""
    return render(
        "kserve-tsctl-image",
        selection=selection_text(flags),
        kind=runtime_kind(flags),
        runtime=runtime_name(flags),
        runtime_file=RUNTIME_FILE,
        python=PYTHON,
        image_dir=IMAGE_DIR,
        image=flags.image,
        grpc_port=GRPC_PORT,
    )


def apply_lines(flags) -> List[str]:
    """Step 3's commands before the InferenceService: the runtime it names."""
    if runtime_kind(flags) == "ClusterServingRuntime":
        return [
            f"kubectl apply -f {RUNTIME_FILE}   # a ClusterServingRuntime: needs rights on cluster-wide resources",
        ]
    return [f"kubectl apply -n {flags.service.namespace} -f {RUNTIME_FILE}"]
