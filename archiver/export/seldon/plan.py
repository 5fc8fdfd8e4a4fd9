"""What ``tsctl export seldon`` decides before it writes (``SeldonPlan``: its Models, ``Entry``), and the names
Seldon Core 2 gives the places it uses (its API, its ServerConfig, the claim's mount, the agent's ports)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from ..archive_facts import ArchiveFacts
from ..bodies import Served, sample_answers
from ..kube import check_gpus, check_resources, image_reference, label

API_VERSION = "mlops.seldon.io/v1alpha1"
SERVER_CONFIG = "mlserver"  # Seldon Core 2's own MLServer ServerConfig
CAPABILITIES = ["tsctl", "pvc"]  # what the Server adds to the ServerConfig's, and what each Model requires
MOUNT = "/var/models"  # where the rclone container sees the claim (Seldon's k8s-pvc example)
MODELS_DIR = "models"  # OUT/models/ is the claim's models/
CLAIM_VOLUME = "models-pvc"  # as in Seldon's k8s-pvc example
RUNTIME_PATH = "/opt/tsctl"  # the handlers package in the image, on PYTHONPATH
# Seldon's mlserver ServerConfig: the agent's REST and gRPC reverse proxies (what seldon-mesh calls) and its
# metrics; MLServer itself listens on 9000 (REST) and 9500 (gRPC), which only the agent, in the pod, calls.
AGENT_PORTS = (9001, 9501, 9006)
SERVER_POD_LABEL = "seldon-server-name"  # the label Seldon's operator gives a Server's pods (its name)
AGENT_VOLUME_BYTES = 1 << 30  # the mlserver ServerConfig's mlserver-models volume (1Gi): what the agent copies into


@dataclass
class Entry:
    """One Seldon Model: its name, its archive's facts (read once) and model-settings.json."""

    name: str
    facts: ArchiveFacts
    settings: dict

    @property
    def archive(self) -> Path:
        return self.facts.path

    @property
    def kind(self) -> Optional[str]:
        """image, text, tensor (MAR-INF/tsctl.json); None for a handler of the user's own."""
        return self.facts.input

    @property
    def handler(self) -> str:
        return self.facts.handler

    @property
    def shape(self) -> Optional[list]:
        """A tensor model's handler.input_shape."""
        return self.facts.input_shape

    @property
    def served(self) -> Served:
        return Served(self.name, self.handler, self.kind, self.shape, sample_answers(self.facts))


@dataclass
class SeldonPlan:
    """Everything the export writes, decided and checked before any of it is."""

    entries: List[Entry]
    transformers: List[Entry]  # with a transformer: its preprocess and postprocess Models, else none
    manifests: Dict[str, List[dict]]
    experiment: Optional[str]
    pipeline: Optional[str]
    pipeline_model: Optional[str]
    notes: List[str]


def check_shared_flags(options, namespace_fix: str, image_fix: str):
    """The flags both Seldon exports take alike: the claim, the namespace, the image to build, the container's
    CPU, memory and GPUs; one UserError naming the flag (``namespace_fix``, ``image_fix``: each export's advice)."""
    label(options.claim, "--claim", "name the claim another way, e.g. --claim tsctl-models")
    label(options.namespace, "--namespace", namespace_fix)
    image_reference(options.image, "--image", image_fix)
    check_resources(options.cpu, options.memory)
    check_gpus(options.gpus)
