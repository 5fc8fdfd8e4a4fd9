"""The flags of each export, as the command line passes them: ``ExportOptions`` (``tsctl export kserve``,
archiver/export/kserve/export.py), ``SeldonOptions`` (``tsctl export seldon``, archiver/export/seldon/export.py) and
``SeldonCore1Options`` (``tsctl export seldon --core 1``, archiver/export/seldon/core1.py); and the parts of
``export kserve``'s flags its steps take in place of all of them: the ``Service``, the ``PodSize``, the
``TargetFlags`` of the runtime that serves the tree, a checked ``Transformer`` (the autoscaling's flags become
its plan: kserve/autoscale_numbers.py's ``Autoscaling``)."""

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

from .. import kserve_images
from ..output import quiet
from . import kube
from .archive_facts import ArchiveFacts


@dataclass(frozen=True)
class Service:
    """The InferenceService an export writes: the name and namespace every other manifest derives its own
    from, and the protocol its clients speak."""

    name: str
    namespace: str
    protocol: str

    @property
    def ns(self) -> str:
        """kubectl's namespace flag, as DEPLOY.md's commands write it."""
        return f"-n {self.namespace}"


@dataclass(frozen=True)
class PodSize:
    """What each container asks for and is limited to: ``--cpu``, ``--memory`` and ``--gpus``."""

    cpu: str
    memory: str
    gpus: int

    def resources(self) -> dict:
        return kube.container_resources(self.cpu, self.memory, self.gpus)


@dataclass(frozen=True)
class TargetFlags:
    """What the runtime serving the tree reads (archiver/export/kserve/targets.py): the InferenceService, the
    GPUs it asks for, and the flags only some runtimes take (targets.EXPORT_FLAGS, checked by the target)."""

    service: Service
    gpus: int = 0
    runtime: str = kserve_images.DEFAULT  # --engine torchserve: the torchserve-kfs image
    offline: bool = False
    image: Optional[str] = None  # --engine tsctl: its image, its runtime's kind and selection
    runtime_kind: Optional[str] = None
    auto_select: bool = False
    priority: Optional[int] = None
    progress: Callable[[str], None] = field(default=quiet, repr=False, compare=False)


@dataclass(frozen=True)
class Transformer:
    """A transformer in front of the predictor, checked: its image, the model it sends to, its archive's facts."""

    image: str
    model: str
    facts: ArchiveFacts


@dataclass
class ExportOptions:
    out: str
    name: str
    storage_uri: Optional[str] = None  # --storage pvc: pvc://CLAIM/PATH (archiver/export/kserve/storage.py)
    storage: str = "pvc"  # a key of kserve_storage.STORAGES: where the pod finds the tree
    image_ref: Optional[str] = None  # --storage oci: where the model image will be pushed (REGISTRY/NAME:TAG)
    protocol: str = "v1"
    config: str = "config/config.properties"
    model_store: str = "model-store"
    canary: Optional[int] = None
    split: List[Tuple[str, int]] = field(default_factory=list)
    transformer_image: Optional[str] = None
    transformer_archive: Optional[str] = None
    transformer_model: Optional[str] = None
    namespace: str = "default"
    cpu: str = "1"
    memory: str = "2Gi"
    gpus: int = 0  # NVIDIA GPUs the predictor asks for; number_of_gpu in the tree's config, a CUDA torch in the image
    runtime: str = kserve_images.DEFAULT  # the torchserve-kfs image the InferenceService runs
    offline: bool = False  # bundle each archive's wheels: its per-model install needs no package index
    engine: str = "torchserve"  # a key of archiver.export.kserve.targets.TARGETS: what serves the tree in the pod
    image: Optional[str] = None  # the tsctl engine's image (--engine tsctl), built from OUT/predictor-image
    runtime_kind: Optional[str] = None  # --engine tsctl: ClusterServingRuntime (default) or ServingRuntime
    auto_select: bool = False  # --engine tsctl: KServe picks the runtime for InferenceServices naming only pytorch
    priority: Optional[int] = None  # with auto_select: its priority for pytorch (None: tsctl_image.DEFAULT_PRIORITY)
    force: bool = False  # replace an OUT that holds files
    # --autoscale (archiver/export/kserve/autoscale.py): the mode, and what sizes it
    autoscale: Optional[str] = None  # knative | keda | hpa
    from_bench: Optional[str] = None  # the capacity result file (tsctl bench --capacity)
    target: Optional[int] = None  # one replica's concurrency, by hand (at most the measured knee)
    scale_metric: str = "concurrency"  # knative: concurrency | rps
    min_replicas: int = 1
    max_replicas: Optional[int] = None  # None: --peak-rps's, else autoscale_numbers.DEFAULT_MAX_REPLICAS
    peak_rps: Optional[float] = None  # the load to plan for: maxReplicas = ceil(peak / one replica's throughput)
    scale_down_delay: str = "300s"
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"  # what KEDA queries
    monitor: Optional[str] = None  # podmonitor | servicemonitor; None: by whether the pod declares the port
    progress: Callable[[str], None] = field(default=quiet, repr=False, compare=False)  # archiver.output.Progress

    @property
    def service(self) -> Service:
        return Service(self.name, self.namespace, self.protocol)

    @property
    def pod(self) -> PodSize:
        return PodSize(self.cpu, self.memory, self.gpus)

    @property
    def target_flags(self) -> TargetFlags:
        chosen = (self.image, self.runtime_kind, self.auto_select, self.priority, self.progress)
        return TargetFlags(self.service, self.gpus, self.runtime, self.offline, *chosen)


@dataclass
class SeldonOptions:
    out: str
    image: str
    model_store: str = "model-store"
    config: Optional[str] = None  # None: config/config.properties beside the store when it exists
    server: str = "tsctl-mlserver"
    claim: str = "tsctl-models"
    namespace: str = "seldon-mesh"
    cpu: str = "1"
    memory: str = "2Gi"  # each Model's memory; the mlserver container asks for it times the number of Models
    gpus: int = 0  # NVIDIA GPUs of the mlserver container; a CUDA torch in its image
    ab: List[Tuple[str, int]] = field(default_factory=list)
    default: Optional[str] = None
    experiment: Optional[str] = None
    mirror: Optional[Tuple[str, int]] = None  # --mirror MODEL=PERCENT: a shadow of --default (seldon/mirror.py)
    transformer_archive: Optional[str] = None
    transformer_model: Optional[str] = None
    storage: str = "pvc"  # pvc: models/ copied onto --claim; oci: a model image mounted into the Server's pod
    image_ref: Optional[str] = None  # --storage oci: where the model image will be pushed (REGISTRY/NAME:TAG)
    force: bool = False

    @property
    def model_image(self) -> bool:
        """Whether models/ goes to the Server as a model image (``--storage oci``) rather than on the claim."""
        return self.storage == "oci"


@dataclass
class SeldonCore1Options:
    out: str
    image: str  # the components' image, built from OUT/component-image
    transformer_archive: Optional[str] = None  # the graph's TRANSFORMER: a toolkit archive whose handler splits
    transformer_model: Optional[str] = None  # the one MODEL without --ab
    ab: List[Tuple[str, int]] = field(default_factory=list)  # the router's MODEL children and their percents
    model_store: str = "model-store"
    config: Optional[str] = None  # None: config/config.properties beside the store when it exists
    name: str = "tsctl-graph"  # the SeldonDeployment's
    claim: str = "tsctl-models"
    namespace: str = "seldon"
    cpu: str = "1"  # each container's
    memory: str = "2Gi"  # each container's
    gpus: int = 0  # NVIDIA GPUs of each model unit's container; a CUDA torch in the image
    force: bool = False
