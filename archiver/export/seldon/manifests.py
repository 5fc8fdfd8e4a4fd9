"""The Seldon Core 2 manifests ``tsctl export seldon`` writes: the Server (Seldon's MLServer ServerConfig
running the export's image), a Model per folder, the Experiment and the Pipeline, and the NetworkPolicy
that keeps other pods off MLServer's own ports."""

from decimal import Decimal
from typing import List

from .. import kube, model_image
from ..options import SeldonOptions
from .plan import (
    AGENT_PORTS,
    API_VERSION,
    CAPABILITIES,
    CLAIM_VOLUME,
    MODELS_DIR,
    MOUNT,
    RUNTIME_PATH,
    SERVER_CONFIG,
    SERVER_POD_LABEL,
    Entry,
)


def metadata_of(options: SeldonOptions, name: str) -> dict:
    return {"name": name, "namespace": options.namespace}


def server_memory(options: SeldonOptions, models: int) -> str:
    number, unit = kube.MEMORY.match(options.memory).groups()
    total = Decimal(number) * models
    text = str(int(total)) if total == total.to_integral_value() else format(total.normalize(), "f")
    return f"{text}{unit or ''}"


def models_volume(options: SeldonOptions) -> dict:
    """Where models/ comes from: the claim, or (``--storage oci``) the model image by its digest (pinned once
    it is written: ``model_image.PENDING``)."""
    if options.model_image:
        reference = f"{options.image_ref}@{model_image.PENDING}"
        return {"name": CLAIM_VOLUME, "image": {"reference": reference, "pullPolicy": "IfNotPresent"}}
    return {"name": CLAIM_VOLUME, "persistentVolumeClaim": {"claimName": options.claim, "readOnly": True}}


def models_mount(options: SeldonOptions) -> dict:
    """models/ at MOUNT/models/: the claim's root, or the image's /models (``model_image.ROOT``)."""
    mount = {"name": CLAIM_VOLUME, "mountPath": MOUNT, "readOnly": True}
    return {**mount, "subPath": model_image.ROOT} if options.model_image else mount


def server(options: SeldonOptions, models: int) -> dict:
    """The Server: Seldon's MLServer ServerConfig, its mlserver container running our image, the claim
    mounted read-only where the rclone container copies Models from."""
    resources = kube.container_resources(options.cpu, server_memory(options, models), options.gpus)
    return {
        "apiVersion": API_VERSION,
        "kind": "Server",
        "metadata": metadata_of(options, options.server),
        "spec": {
            "serverConfig": SERVER_CONFIG,
            "extraCapabilities": list(CAPABILITIES),
            "replicas": 1,  # the claim is ReadWriteOnce: one node mounts it
            "podSpec": {
                "volumes": [models_volume(options)],
                "containers": [
                    {
                        "name": "rclone",
                        "volumeMounts": [models_mount(options)],
                    },
                    {
                        "name": "mlserver",
                        "image": options.image,
                        "env": [
                            # the runtime's archive workers are processes already: predict runs on MLServer's loop
                            {"name": "MLSERVER_PARALLEL_WORKERS", "value": "0"},
                            {"name": "PYTHONPATH", "value": RUNTIME_PATH},
                        ],
                        "resources": resources,
                    },
                ],
            },
        },
    }


def storage_uri(name: str) -> str:
    return f"{MOUNT}/{MODELS_DIR}/{name}"


def network_policy(options: SeldonOptions) -> dict:
    """Ingress to the Server's pods on the agent's ports only (``AGENT_PORTS``): MLServer's own REST and gRPC
    ports, whose model repository API loads and unloads models, are closed to other pods (the agent calls
    them from inside the pod; the kubelet's probes come from the node, which a NetworkPolicy never blocks)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata_of(options, f"{options.server}-agent-ports-only"),
        "spec": {
            "podSelector": {"matchLabels": {SERVER_POD_LABEL: options.server}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"protocol": "TCP", "port": port} for port in AGENT_PORTS]}],
        },
    }


def model(options: SeldonOptions, name: str) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "Model",
        "metadata": metadata_of(options, name),
        "spec": {"storageUri": storage_uri(name), "requirements": list(CAPABILITIES), "memory": options.memory},
    }


def experiment_manifest(options: SeldonOptions, name: str) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "Experiment",
        "metadata": metadata_of(options, name),
        "spec": {
            "default": options.default,
            "candidates": [{"name": candidate, "weight": weight} for candidate, weight in options.ab],
        },
    }


def pipeline_manifest(options: SeldonOptions, name: str, transformers: List[Entry], step: str) -> dict:
    """The transformer's preprocessing, the model, the transformer's postprocessing: each step's outputs are
    the next one's inputs (the tensor ``input-0``, then the model's ``output-0``)."""
    pre, post = (t.name for t in transformers)
    return {
        "apiVersion": API_VERSION,
        "kind": "Pipeline",
        "metadata": metadata_of(options, name),
        "spec": {
            "steps": [{"name": pre}, {"name": step, "inputs": [pre]}, {"name": post, "inputs": [step]}],
            "output": {"steps": [post]},
        },
    }
