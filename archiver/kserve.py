"""``tsctl export kserve``: the tree to copy onto a PVC, and the manifests that serve it.

    OUT/config/config.properties     the config, checked for what KServe trips on
    OUT/model-store/*.mar            every archive the snapshot names
    OUT/inferenceservice.yaml        v1beta1, modelFormat pytorch, storageUri, protocol, resources
    OUT/inferencegraph.yaml          with --split: a Splitter between two models (A/B)
    OUT/transformer/*.mar            with --transformer-image: the archive whose pre/post the transformer runs
    OUT/pvc-copy-pod.yaml            a helper pod mounting the claim, for kubectl cp
    OUT/DEPLOY.md                    the exact commands: copy, apply, one curl per model

KServe's TorchServe runtime runs ``torchserve --start --model-store=/mnt/models/model-store
--ts-config=/mnt/models/config/config.properties`` with ``TS_SERVICE_ENVELOPE=kserve|kservev2``;
the storage URI is mounted at /mnt/models. Every manifest is validated against KServe's CRDs first.
"""

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

from handlers import TOOLKIT_HANDLERS

from . import crds
from .errors import UserError
from .mar import read_manifest
from .properties import check_keys, read_properties, render, snapshot_of

NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
PVC_URI = re.compile(r"^pvc://([a-z0-9]([-a-z0-9.]*[a-z0-9])?)(/[^\s]*)?$")
PROTOCOLS = ("v1", "v2")
COPY_POD_IMAGE = "busybox:1.36"


@dataclass
class ExportOptions:
    out: str
    name: str
    storage_uri: str
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


@dataclass
class Export:
    files: List[Path]
    notes: List[str]
    curls: List[str]


def export(options: ExportOptions) -> Export:
    """Check everything, then write the tree and manifests. Nothing is written if a check fails."""
    notes: List[str] = []
    claim, sub_path = check_options(options)
    config_path = Path(options.config)
    properties = read_properties(config_path)
    check_keys(properties, config_path)
    snapshot = snapshot_of(properties, config_path)
    check_properties(properties, config_path)
    archives = check_models(snapshot, Path(options.model_store), properties, notes)
    check_split(options, snapshot)
    transformer_archive = check_transformer(options, snapshot)

    isvc = inference_service(options, snapshot)
    manifests = {"inferenceservice.yaml": isvc}
    if options.split:
        manifests["inferencegraph.yaml"] = inference_graph(options)
    for name, manifest in manifests.items():
        crds.check(manifest, name)
    curls = curl_lines(options, snapshot)
    manifests["pvc-copy-pod.yaml"] = copy_pod(options, claim)

    out = Path(options.out)
    clear_previous_export(out)
    (out / "config").mkdir(parents=True, exist_ok=True)
    (out / "model-store").mkdir(parents=True, exist_ok=True)
    properties["model_snapshot"] = json.dumps(snapshot, separators=(",", ":"))
    files = [out / "config" / "config.properties"]
    files[0].write_text(render(properties), encoding="utf-8")
    for archive in archives:
        target = out / "model-store" / archive.name
        copy_archive(archive, target)
        files.append(target)
    if transformer_archive is not None:
        (out / "transformer").mkdir(exist_ok=True)
        copy_archive(transformer_archive, out / "transformer" / transformer_archive.name)
        files.append(out / "transformer" / transformer_archive.name)
    for name, manifest in manifests.items():
        (out / name).write_text(yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
        files.append(out / name)
    (out / "DEPLOY.md").write_text(deploy_steps(options, claim, sub_path, archives, curls), encoding="utf-8")
    files.append(out / "DEPLOY.md")
    return Export(files, notes, curls)


# ---- checks -------------------------------------------------------------------------------------------
def check_options(options: ExportOptions) -> Tuple[str, str]:
    if not NAME.match(options.name):
        raise UserError(
            f"--name {options.name!r} is not a valid InferenceService name: use lowercase letters, digits and '-', "
            "starting with a letter"
        )
    match = PVC_URI.match(options.storage_uri)
    if not match:
        raise UserError(f"--storage-uri {options.storage_uri!r} must look like pvc://CLAIM/PATH")
    if options.protocol not in PROTOCOLS:
        raise UserError(f"--protocol {options.protocol!r} must be v1 or v2")
    if options.canary is not None and not 0 <= options.canary <= 100:
        raise UserError(f"--canary {options.canary} must be a percentage from 0 to 100")
    return match.group(1), (match.group(3) or "/").strip("/")


def check_properties(properties: Dict[str, str], path: Path):
    expected = {
        "enable_envvars_config": ("true", "KServe's TS_SERVICE_ENVELOPE is ignored without it"),
        "disable_token_authorization": ("true", "KServe's requests carry no TorchServe token, so every one gets 401"),
    }
    for key, (value, why) in expected.items():
        if properties.get(key, "").lower() != value:
            raise UserError(f"{path}: {key} must be {value} ({why}); regenerate it with 'tsctl config'")
    if properties.get("enable_model_api", "").lower() not in ("true", "false"):
        raise UserError(
            f"{path}: set enable_model_api explicitly (TorchServe 0.11+ turns it off by default); "
            "regenerate it with 'tsctl config'"
        )


def check_models(snapshot: dict, store: Path, properties: Dict[str, str], notes: List[str]) -> List[Path]:
    """Each snapshot entry's archive exists and names the same model; batch sizes safe under envelopes."""
    if not store.is_dir():
        raise UserError(f"model store {store} does not exist: build archives with 'tsctl package'")
    archives = []
    for name, versions in snapshot.get("models", {}).items():
        for version, entry in versions.items():
            archive = store / entry.get("marName", "")
            if not entry.get("marName") or not archive.exists():
                raise UserError(
                    f"model_snapshot entry '{name}' names marName {entry.get('marName')!r}, which is not in {store}: "
                    "run 'tsctl config' again after packaging"
                )
            manifest = read_manifest(archive)["model"]
            if manifest["modelName"] != name:
                raise UserError(
                    f"model_snapshot key '{name}' differs from {archive.name}'s model name "
                    f"'{manifest['modelName']}': KServe serves the key, so requests for either would miss one; "
                    "run 'tsctl config' again"
                )
            if manifest.get("requirementsFile") and properties.get("install_py_dep_per_model") != "true":
                raise UserError(
                    f"{archive.name} carries {manifest['requirementsFile']} but install_py_dep_per_model is not true: "
                    "KServe would not install them; regenerate the config with 'tsctl config'"
                )
            toolkit = manifest.get("handler") in TOOLKIT_HANDLERS.values()
            if not toolkit and entry.get("batchSize", 1) > 1:
                entry["batchSize"] = 1
                notes.append(
                    f"{name}: batchSize set to 1 in the exported config: its handler ({manifest.get('handler')}) runs "
                    "inside TorchServe 0.12's KServe envelope, which answers every request of a larger batch with 503"
                )
            archives.append(archive)
    return archives


def check_split(options: ExportOptions, snapshot: dict):
    if not options.split:
        return
    models = snapshot.get("models", {})
    if len(options.split) != 2:
        raise UserError("--split takes exactly two MODEL=PERCENT values, e.g. --split a=90 --split b=10")
    for model, _ in options.split:
        if model not in models:
            raise UserError(f"--split model '{model}' is not in the config's model_snapshot ({', '.join(models)})")
    if options.split[0][0] == options.split[1][0]:
        raise UserError("--split needs two different models")
    total = sum(weight for _, weight in options.split)
    if total != 100:
        raise UserError(f"--split weights add up to {total}, not 100")
    if options.transformer_image or options.transformer_archive:
        raise UserError("--split and a transformer cannot be combined: split between models, or transform one")


def check_transformer(options: ExportOptions, snapshot: dict) -> Optional[Path]:
    if not (options.transformer_image or options.transformer_archive):
        return None
    if not (options.transformer_image and options.transformer_archive):
        raise UserError(
            "--transformer-image and --transformer-archive go together: the image runs the archive's pre/post"
        )
    archive = Path(options.transformer_archive)
    if not archive.exists():
        raise UserError(f"--transformer-archive {archive} does not exist")
    handler = read_manifest(archive)["model"].get("handler")
    if handler not in TOOLKIT_HANDLERS.values():
        raise UserError(
            f"--transformer-archive {archive} has handler {handler!r}: a transformer runs toolkit handlers only"
        )
    models = list(snapshot["models"])
    model = options.transformer_model or models[0]
    if model not in models:
        raise UserError(f"--transformer-model '{model}' is not in the config's model_snapshot ({', '.join(models)})")
    options.transformer_model = model
    return archive


# ---- manifests ----------------------------------------------------------------------------------------
def resources(options: ExportOptions) -> dict:
    amount = {"cpu": options.cpu, "memory": options.memory}
    return {"requests": dict(amount), "limits": dict(amount)}


def inference_service(options: ExportOptions, snapshot: dict) -> dict:
    predictor: dict = {}
    if options.canary is not None:
        predictor["canaryTrafficPercent"] = options.canary
    predictor["model"] = {
        "modelFormat": {"name": "pytorch"},
        "protocolVersion": options.protocol,
        "storageUri": options.storage_uri,
        "resources": resources(options),
    }
    spec = {"predictor": predictor}
    if options.transformer_image:
        spec["transformer"] = transformer(options)
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": options.name, "namespace": options.namespace},
        "spec": spec,
    }


def transformer(options: ExportOptions) -> dict:
    archive = Path(options.transformer_archive).name
    return {
        "containers": [
            {
                "name": "kserve-container",
                "image": options.transformer_image,
                "command": ["python", "-m", "handlers.kserve_transformer"],
                "args": [
                    "--model_name",
                    options.transformer_model,
                    "--archive",
                    f"/mnt/models/transformer/{archive}",
                    "--predictor_protocol",
                    options.protocol,
                ],
                "env": [{"name": "STORAGE_URI", "value": options.storage_uri}],
                "resources": resources(options),
            }
        ]
    }


def inference_graph(options: ExportOptions) -> dict:
    host = f"{options.name}-predictor.{options.namespace}.svc.cluster.local"
    steps = [
        {"name": model, "serviceUrl": f"http://{host}{predict_path(options.protocol, model)}", "weight": weight}
        for model, weight in options.split
    ]
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "InferenceGraph",
        "metadata": {"name": f"{options.name}-split", "namespace": options.namespace},
        "spec": {"nodes": {"root": {"routerType": "Splitter", "steps": steps}}},
    }


def copy_pod(options: ExportOptions, claim: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{options.name}-copy", "namespace": options.namespace},
        "spec": {
            "containers": [
                {
                    "name": "copy",
                    "image": COPY_POD_IMAGE,
                    "command": ["sleep", "3600"],
                    "volumeMounts": [{"name": "models", "mountPath": "/pvc"}],
                }
            ],
            "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


def predict_path(protocol: str, model: str) -> str:
    return f"/v2/models/{model}/infer" if protocol == "v2" else f"/v1/models/{model}:predict"


def curl_lines(options: ExportOptions, snapshot: dict) -> List[str]:
    """One curl per model: the URL names the snapshot key (the model), the Host header the service."""
    body = "@input-v2.json" if options.protocol == "v2" else "@input.json"
    return [
        f'curl -H "Host: ${{SERVICE_HOSTNAME}}" -H "Content-Type: application/json" '
        f'"http://${{INGRESS_HOST}}:${{INGRESS_PORT}}{predict_path(options.protocol, model)}" -d {body}'
        for model in snapshot["models"]
    ]


def deploy_steps(options: ExportOptions, claim: str, sub_path: str, archives: List[Path], curls: List[str]) -> str:
    pod = f"{options.name}-copy"
    ns = f"-n {options.namespace}"
    root = f"/pvc/{sub_path}".rstrip("/")
    lines = [
        f"# Deploying {options.name}",
        "",
        f"1. Copy the tree onto the PVC `{claim}` (mounted by KServe at /mnt/models):",
        "",
        "```sh",
        f"kubectl apply {ns} -f pvc-copy-pod.yaml",
        f"kubectl wait {ns} --for=condition=Ready pod/{pod} --timeout=120s",
        f"kubectl exec {ns} {pod} -- mkdir -p {root}/config {root}/model-store"
        + (f" {root}/transformer" if options.transformer_archive else ""),
        f"kubectl cp {ns} config/config.properties {pod}:{root}/config/config.properties",
    ]
    lines += [f"kubectl cp {ns} model-store/{a.name} {pod}:{root}/model-store/{a.name}" for a in archives]
    if options.transformer_archive:
        name = Path(options.transformer_archive).name
        lines.append(f"kubectl cp {ns} transformer/{name} {pod}:{root}/transformer/{name}")
    lines += [
        f"kubectl exec {ns} {pod} -- ls -lR {root}",
        f"kubectl delete {ns} pod/{pod}",
        "```",
        "",
        "2. Deploy:",
        "",
        "```sh",
        f"kubectl apply {ns} -f inferenceservice.yaml",
    ]
    if options.split:
        lines.append(f"kubectl apply {ns} -f inferencegraph.yaml")
    lines += [
        f"kubectl wait {ns} --for=condition=Ready inferenceservice/{options.name} --timeout=600s",
        "```",
        "",
        "3. Call each model. The URL names the model (the model_snapshot key), not the InferenceService;",
        "the Host header names the InferenceService. input.json holds a KServe v1 body, e.g.",
        '`{"instances": [{"data": "<base64 image>"}]}` or `{"instances": ["a text"]}`; input-v2.json a v2 body,',
        '`{"inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": ["<base64 image or text>"]}]}`:',
        "",
        "```sh",
        f"SERVICE_HOSTNAME=$(kubectl get inferenceservice {options.name} {ns} "
        "-o jsonpath='{.status.url}' | cut -d/ -f3)",
        *curls,
        "```",
        "",
    ]
    return "\n".join(lines)


OUTPUTS = (
    "config",
    "model-store",
    "transformer",
    "inferenceservice.yaml",
    "inferencegraph.yaml",
    "pvc-copy-pod.yaml",
    "DEPLOY.md",
)


def clear_previous_export(out: Path):
    """Remove what an earlier export wrote to ``out`` (only the names export writes), so nothing stale stays."""
    for name in OUTPUTS:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def copy_archive(source: Path, target: Path):
    """Hard-link when possible (same filesystem, no copy of GBs), else copy; directories are copied."""
    if target.exists() or target.is_symlink():
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    if source.is_dir():
        shutil.copytree(source, target)
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
