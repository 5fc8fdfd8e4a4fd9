"""``tsctl export kserve --engine tsctl``: the same PVC tree served by the tsctl engine, no TorchServe.

The engine (``python -m serving.engine``, serving/engine.py) reads what KServe's TorchServe runtime
reads: ``/mnt/models/model-store`` and ``/mnt/models/config/config.properties`` (its model_snapshot:
workers, batching, timeouts, versions). So the export declares it as a runtime of its own and the
InferenceService changes only its runtime, not its storage:

    OUT/servingruntime.yaml   a ClusterServingRuntime (default) or ServingRuntime (--runtime-kind) for
                              the engine's image: modelFormat pytorch (autoSelect false: only
                              InferenceServices naming it use it), protocols v1, v2, grpc-v2
    inferenceservice.yaml     predictor.model: modelFormat pytorch, runtime NAME, the same storageUri
    OUT/predictor-image/      the image's build context:
        Dockerfile            python:X.Y-slim, uid 1000, the requirements, handlers/; ENTRYPOINT the engine
                              (templates/tsctl-image.Dockerfile)
        requirements.txt      torch, torchvision, torchserve (its Python worker only), the engine's server
                              packages, and every archive's own requirements, pinned to the versions tsctl
                              was tested with here (the engine installs nothing per model)
        handlers/, serving/   the toolkit's handlers package (each archive runs its own copy) and the
                              serving package (the engine)

DEPLOY.md's step 0 is templates/kserve-tsctl-image.md.
"""

from pathlib import Path
from typing import List, Optional

from ..choices import RUNTIME_KINDS
from ..errors import UserError
from .core import render
from .images import CPU_TORCH_INDEX, PYTHON, pins, with_archive_lines, write_context

IMAGE_DIR = "predictor-image"
RUNTIME_FILE = "servingruntime.yaml"
HTTP_PORT = 8080
GRPC_PORT = 8081
DEFAULT_RUNTIME_KIND = RUNTIME_KINDS[0]
MODEL_STORE = "/mnt/models/model-store"
TS_CONFIG = "/mnt/models/config/config.properties"
UID = 1000  # as KServe's TorchServe runtime runs: the files the copy pod wrote are its own
# What the engine and the workers it starts import (serving/engine.py, engine_workers.py, engine_metrics.py,
# the gRPC server), pinned to the versions installed here; then each archive's own requirements.
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
    "kserve",  # the v2 gRPC service's generated code (serving/engine_grpc.py)
    "javaproperties",  # config.properties, read as TorchServe reads it (serving/ts_config.py)
)


def check_runtime_kind(kind: Optional[str]):
    if kind is not None and kind not in RUNTIME_KINDS:
        raise UserError(f"--runtime-kind {kind!r} must be {' or '.join(RUNTIME_KINDS)}")


def runtime_kind(options) -> str:
    return options.runtime_kind or DEFAULT_RUNTIME_KIND


def runtime_name(options) -> str:
    """The runtime's name: one per export, as its image holds this export's archives' requirements. A
    ClusterServingRuntime is cluster-wide, so its name carries the namespace too."""
    if runtime_kind(options) == "ClusterServingRuntime":
        return f"tsctl-{options.namespace}-{options.name}"
    return f"tsctl-{options.name}"


def container_args() -> List[str]:
    return [
        f"--model_store={MODEL_STORE}",
        f"--ts_config={TS_CONFIG}",
        f"--http_port={HTTP_PORT}",
        f"--grpc_port={GRPC_PORT}",
    ]


def serving_runtime(options, resources: dict) -> dict:
    """The (Cluster)ServingRuntime for the engine's image, laid out as KServe's own TorchServe runtime
    (kserve-torchserve: the same keys, security context and uid, resources, Prometheus annotations)."""
    kind = runtime_kind(options)
    metadata_ = {"name": runtime_name(options)}
    if kind == "ServingRuntime":
        metadata_["namespace"] = options.namespace
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": kind,
        "metadata": metadata_,
        "spec": {
            "annotations": {"prometheus.kserve.io/port": str(HTTP_PORT), "prometheus.kserve.io/path": "/metrics"},
            # autoSelect false: KServe's own TorchServe runtime stays the pick for modelFormat pytorch;
            # only InferenceServices that name this runtime use it.
            "supportedModelFormats": [{"name": "pytorch", "version": "1", "autoSelect": False}],
            "protocolVersions": ["v1", "v2", "grpc-v2"],
            "containers": [
                {
                    "name": "kserve-container",
                    "image": options.image,
                    "args": container_args(),
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


def requirements(archives: List[Path]) -> str:
    """The image's requirements: the serving stack at the versions installed here, then each archive's
    own requirement lines (the engine installs nothing per model), each checked (images.with_archive_lines)."""
    return "\n".join(with_archive_lines(pins(BASE_PACKAGES), archives)) + "\n"


def write_image_context(out: Path, image: str, archives: List[Path]) -> List[Path]:
    """OUT/predictor-image/: Dockerfile (templates/tsctl-image.Dockerfile), requirements.txt, the handlers and
    serving packages."""
    dockerfile = render(
        "tsctl-image.Dockerfile",
        image=image,
        python=PYTHON,
        torch_index=CPU_TORCH_INDEX,
        uid=UID,
        http_port=HTTP_PORT,
        grpc_port=GRPC_PORT,
        args=", ".join(f'"{arg}"' for arg in container_args()),
    )
    return write_context(out / IMAGE_DIR, dockerfile, requirements(archives))


def build_steps(options) -> str:
    """DEPLOY.md's step 0 for the engine: build and push its image."""
    return render(
        "kserve-tsctl-image",
        kind=runtime_kind(options),
        runtime=runtime_name(options),
        runtime_file=RUNTIME_FILE,
        image_dir=IMAGE_DIR,
        image=options.image,
        grpc_port=GRPC_PORT,
    )


def apply_lines(options) -> List[str]:
    """Step 3's commands before the InferenceService: the runtime it names."""
    if runtime_kind(options) == "ClusterServingRuntime":
        return [
            f"kubectl apply -f {RUNTIME_FILE}   # a ClusterServingRuntime: needs rights on cluster-wide resources",
        ]
    return [f"kubectl apply -n {options.namespace} -f {RUNTIME_FILE}"]
