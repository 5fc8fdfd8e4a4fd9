"""``tsctl export kserve``: the tree to copy onto a PVC, and the manifests that serve it.

    OUT/config/config.properties     the config, checked for what KServe trips on; per-model install on
    OUT/config/metrics.yaml          the workers' metrics.yaml its metrics_config names, which then names this copy
    OUT/model-store/*.mar            every archive the snapshot names
    OUT/inferenceservice.yaml        v1beta1, modelFormat pytorch, storageUri, protocol, resources
    OUT/inferenceservice-shadow.yaml with --canary: the rollout's steps, gated by tsctl shadow (kserve/canary.py)
    OUT/inferenceservice-promote.yaml
    OUT/inferencegraph.yaml          with --split: a Splitter between two models (A/B)
    OUT/transformer/*.mar            with --transformer-image: the archive whose pre/post the transformer runs
    OUT/pvc.yaml                     the PersistentVolumeClaim (ReadWriteOnce, twice the archives' size, >= 2Gi)
    OUT/pvc-copy-pod.yaml            a helper pod mounting the claim, for kubectl cp (restricted Pod Security Standard)
    OUT/DEPLOY.md                    the exact commands: claim, copy, apply, ingress, request bodies, a curl per model,
                                     each relative to OUT (no path of this machine in the tree): kserve/deploy.py
    OUT/inputs/                      what the request bodies are built from: a drawn picture, a golden input
    OUT/servingruntime.yaml          with --engine tsctl: the tsctl engine's (Cluster)ServingRuntime (tsctl_image.py)
    OUT/predictor-image/             with --engine tsctl: the build context of the runtime's image
    OUT/pdb.yaml, OUT/podmonitor.yaml    with --autoscale: a PodDisruptionBudget, and a PodMonitor (or with --monitor
    OUT/capacity.json                servicemonitor, metrics-service.yaml + servicemonitor.yaml); the capacity
                                     result the numbers came from (--from-bench): archiver/export/kserve/autoscale.py

KServe's TorchServe runtime runs ``torchserve --start --model-store=/mnt/models/model-store
--ts-config=/mnt/models/config/config.properties`` with ``TS_SERVICE_ENVELOPE=kserve|kservev2``;
the storage URI is mounted at /mnt/models. What differs by runtime (``--engine``: the checks, the
predictor, more manifests and files, DEPLOY.md's steps) the runtime's target says (archiver/export/kserve/targets.py):
with ``--engine tsctl`` the tsctl engine serves the same tree, and the InferenceService differs only
in naming its runtime. Every manifest is validated against KServe's CRDs first.
"""

import hashlib
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from serving.tree_digests import LISTING, listing_bytes, tree_files

from ...choices import KSERVE_PROTOCOLS
from ...errors import UserError
from ...mar import MODEL_NAME, rewrite_archive, shown_name
from ...properties import check_keys, check_store, metrics_yaml, read_properties, render, snapshot_of
from .. import archive_facts, core, crds, kube, model_image, out_dir
from ..archive_facts import ArchiveFacts
from ..bodies import Served, sample_answers, sample_inputs
from ..options import ExportOptions, PodSize, Service, Transformer
from . import autoscale, targets
from . import canary as kserve_canary
from . import storage as kserve_storage
from .autoscale_numbers import CAPACITY_FILE, Autoscaling
from .deploy import curl_lines, deploy_md, predict_path
from .targets import MOUNT

NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
METRICS_FILE = "metrics.yaml"  # the config's metrics_config, copied beside it into OUT/config
# KServe's default predictor minReplicas ("defaults to 1 but can be set to 0 to enable scale-to-zero": kserve/kserve
# python/kserve/docs/V1beta1ComponentExtensionSpec.md): --min-replicas without --autoscale is written into the
# InferenceService only when it differs
KSERVE_MIN_REPLICAS = 1


@dataclass
class Export:
    files: List[Path]
    notes: List[str]
    curls: List[str]


def export(options: ExportOptions) -> Export:
    """Check everything, then write the tree and manifests. Nothing is written if a check fails."""
    inputs = [("--model-store", options.model_store), ("--config", options.config)]
    out_dir.check(Path(options.out), options.force, inputs + [("--transformer-archive", options.transformer_archive)])
    with tempfile.TemporaryDirectory(prefix="tsctl-export-") as scratch:  # wheels, until they are packed
        return _export(options, Path(scratch))


def _export(options: ExportOptions, scratch: Path) -> Export:
    notes: List[str] = []
    target = targets.named(options.engine)
    storage = check_options(options)
    service, pod, flags = options.service, options.pod, options.target_flags
    config_path = Path(options.config)
    properties = read_properties(config_path)
    check_keys(properties, config_path)
    snapshot = snapshot_of(properties, config_path)
    target.check_properties(properties, config_path)
    facts = check_models(snapshot, Path(options.model_store), notes, target.envelope_batches(), target.archive_notes)
    archives = [archive.path for archive in facts]
    gpu_settings(pod.gpus, properties, config_path, notes)
    notes += memory_notes(pod.memory, snapshot)
    check_split(options.split, bool(options.transformer_image or options.transformer_archive), snapshot, facts, notes)
    transformer = check_transformer(options, snapshot, facts)
    metrics = carried_metrics(properties, config_path)
    ports = target.ports(properties) if options.autoscale else None  # the pod's, where the autoscaling looks
    plan = autoscale.check(options, snapshot, target, notes, ports)
    plan.mode.check_metrics(metrics, f"metrics_config of {config_path}")
    locked = target.prepare(flags, properties, facts, notes, scratch)

    manifests = target.manifests(flags, pod.resources())  # the runtime the InferenceService names first
    predictor = target.predictor(flags, pod.resources(), storage.uri())
    isvc = inference_service(service, predictor, plan, options.canary)
    if transformer is not None:
        isvc["spec"]["transformer"] = transformer_spec(transformer, service.protocol, storage.uri(), pod)
    manifests["inferenceservice.yaml"] = isvc
    autoscale.apply(isvc, plan, ports)
    scaling = autoscale.manifests(plan, ports)
    if options.canary is not None:  # the shadow, canary and promote steps (kserve/canary.py), scaled as isvc
        manifests.update(kserve_canary.manifests(isvc, plan.mode))
    if options.split:
        manifests["inferencegraph.yaml"] = inference_graph(service, options.split)
    for name, manifest in list(manifests.items()) + autoscale.validated(plan, isvc, scaling):
        crds.check(manifest, name)
    manifests.update(scaling)
    models = served_models(facts, transformer)
    curls = curl_lines(service.protocol, models)
    inputs = sample_inputs(models)
    claimed = archives + ([transformer.facts.path] if transformer else [])
    manifests.update(storage.manifests(service, claimed))

    with out_dir.written_beside(Path(options.out)) as staging:
        properties["model_snapshot"] = json.dumps(snapshot, separators=(",", ":"))
        files = write_tree(staging, properties, archives, locked, config_header(target, config_path, properties))
        if metrics is not None:
            files += core.write_inputs(staging / "config", {METRICS_FILE: metrics})
        if transformer is not None:
            copied = staging / "transformer" / transformer.facts.path.name
            copied.parent.mkdir()
            core.copy_archive(transformer.facts.path, copied)
            files.append(copied)
        listing, tree_digest = write_listing(staging)  # the tree is complete: its digests, then its image
        image_files, digests = storage.write(staging)
        files += [listing] + image_files + target.write_files(staging, flags, facts)
        digests[targets.TREE_PENDING] = tree_digest
        for name, manifest in manifests.items():
            manifest = model_image.pinned(manifest, digests)
            (staging / name).write_text(kube.manifest_text(manifest), encoding="utf-8")
            files.append(staging / name)
        files += core.write_inputs(staging, inputs)
        capacity = autoscale.capacity_copy(plan)
        if capacity is not None:
            files += core.write_inputs(staging, {CAPACITY_FILE: capacity})
        config_files = ["config.properties"] + ([METRICS_FILE] if metrics is not None else []) + [listing.name]
        deploy = deploy_md(options, target, storage, facts, transformer, curls, models, locked, plan, config_files)
        (staging / "DEPLOY.md").write_text(deploy, encoding="utf-8")
        files.append(staging / "DEPLOY.md")
    return Export(out_dir.moved(files, staging, Path(options.out)), notes, curls)


def gpu_settings(gpus: int, properties: Dict[str, str], config: Path, notes: List[str]):
    """With ``--gpus N`` the tree's config says ``number_of_gpu=N`` (what TorchServe and the engine give
    workers, serving/gpus.py); a config asking for GPUs the predictor does not get is noted."""
    asked = (properties.get("number_of_gpu") or "").strip()
    if gpus:
        properties["number_of_gpu"] = str(gpus)
    elif asked not in ("", "0"):
        notes.append(
            f"{config} says number_of_gpu={asked} but the predictor asks for no GPU: its workers run on "
            f"the CPU; give --gpus {asked} to ask for them"
        )


def carried_metrics(properties: Dict[str, str], config: Path) -> Optional[bytes]:
    """The workers' metrics.yaml the config names (``metrics_config``, read as TorchServe started here reads
    it: ``properties.metrics_yaml``), to copy beside the exported config; the key then names the copy as the
    pod sees it. None when the config names none (TorchServe's own is used)."""
    given = properties.get("metrics_config")
    if not given:
        return None
    path = metrics_yaml(given, f"metrics_config of {config}")
    properties["metrics_config"] = f"{MOUNT}/config/{METRICS_FILE}"
    return Path(path).read_bytes()


def config_header(target: targets.Target, config: Path, properties: Dict[str, str]) -> List[str]:
    """The exported config's comment: what wrote it, from what (the --config file, by name only: no path of
    this machine goes into the tree), and what the export changed."""
    lines = [
        f"# Written by tsctl export kserve for KServe (mounted at /mnt/models), served by {target.title}:",
        f"# the keys of {config.name} (--config), its model_snapshot checked against the model store.",
    ]
    if properties.get("metrics_config"):
        lines.append(f"# metrics_config: the file {config.name} named, copied beside this one as {METRICS_FILE}.")
    if properties.get("install_py_dep_per_model", "").lower() == "true":
        lines.append(
            "# install_py_dep_per_model=true: TorchServe installs each archive's requirements.txt, locked for the "
            "image by the export."
        )
    return lines


def write_tree(
    root: Path, properties: Dict[str, str], archives: List[Path], locked: Dict[Path, dict], header: List[str]
) -> List[Path]:
    """config/config.properties (under ``header``) and model-store/: each archive as it is, or rewritten with
    its locked requirements."""
    (root / "config").mkdir()
    (root / "model-store").mkdir()
    files = [root / "config" / "config.properties"]
    files[0].write_text(render(properties, header), encoding="utf-8")
    for archive in archives:
        target = root / "model-store" / archive.name
        if archive in locked:
            rewrite_archive(archive, target, locked[archive])
        else:
            core.copy_archive(archive, target)
        files.append(target)
    return files


def write_listing(root: Path) -> Tuple[Path, str]:
    """config/tree-digests.json: the sha256 of every other file of the tree (serving/tree_digests.py); its path,
    and its own sha256, the tree's digest, which the InferenceService pins."""
    listing = listing_bytes(tree_files(str(root)))
    path = root / LISTING
    path.write_bytes(listing)
    return path, "sha256:" + hashlib.sha256(listing).hexdigest()


# ---- checks -------------------------------------------------------------------------------------------
def check_options(options: ExportOptions) -> kserve_storage.Storage:
    if not NAME.match(options.name):
        raise UserError(
            f"--name {options.name!r} is not a valid InferenceService name: use lowercase letters, digits and '-', "
            "starting with a letter"
        )
    kube.label(options.namespace, "--namespace", "give the namespace the InferenceService goes in, e.g. default")
    kube.check_resources(options.cpu, options.memory)
    kube.check_gpus(options.gpus)
    for flag, image in (("--image", options.image), ("--transformer-image", options.transformer_image)):
        if image is not None:  # docker build -t and the kubelet refuse what is not a reference (InvalidImageName)
            kube.image_reference(image, flag, f"name the image another way, e.g. {flag} registry.example.com/tsctl:1")
    storage = kserve_storage.of(options.storage, options.storage_uri, options.image_ref)
    if options.protocol not in KSERVE_PROTOCOLS:
        raise UserError(f"--protocol {options.protocol!r} must be v1 or v2")
    if options.canary is not None and not 0 <= options.canary <= 100:
        raise UserError(f"--canary {options.canary} must be a percentage from 0 to 100")
    targets.named(options.engine).check_export(options.target_flags)
    return storage


WORKER_BYTES = 1 << 30  # one model worker's peak RSS, rounded up: 875-956 MiB measured for resnet18 and
# all-MiniLM-L6-v2 (BENCHMARKS.md, "tsctl engine"); a bigger model needs more


def memory_notes(memory: str, snapshot: dict) -> List[str]:
    """A note when the predictor's one container (``--memory``) cannot hold a worker per minWorkers of every
    model at about WORKER_BYTES each, with 1 GiB more for the server and headroom (TorchServe's JVM: 209 MiB
    after warm-up, measured beside two resnet18 workers of 785 MiB; its heap may grow to a quarter of the
    container's limit): such a container is OOM-killed under load, or as its last workers load."""
    workers = sum(
        max(1, int(entry.get("minWorkers", 1) or 1))
        for versions in snapshot.get("models", {}).values()
        for entry in versions.values()
    )
    needed = (workers + 1) * WORKER_BYTES
    if kube.memory_bytes(memory) >= needed:
        return []
    return [
        f"the predictor runs {workers} model worker{'s' if workers != 1 else ''} in one container of --memory "
        f"{memory}; a worker peaks near 1 GiB (875-956 MiB measured for resnet18 and all-MiniLM-L6-v2), "
        f"so give at least --memory {workers + 1}Gi (or fewer minWorkers), more for bigger models"
    ]


def check_models(
    snapshot: dict, store: Path, notes: List[str], envelope_batches: bool = True, archive_notes=lambda config, where: []
) -> List[ArchiveFacts]:
    """Each snapshot entry's archive exists, names the same model, and is read once (its facts, in the
    snapshot's order); with ``envelope_batches`` (TorchServe under KServe), batch sizes safe under its envelope;
    ``archive_notes(config, where)``: the target's notes on each archive's model-config.yaml (UserError for what
    it cannot serve)."""
    check_store(store)
    archives = []
    for name, versions in snapshot.get("models", {}).items():
        if not MODEL_NAME.match(name):  # it goes into URLs, DEPLOY.md's shell lines and KEDA's PromQL as it is
            raise UserError(
                f"model_snapshot key {shown_name(name)} is not a model name tsctl packages (letters, digits, '_', "
                "'-' and '.'): package the model again under such a name and run 'tsctl config'"
            )
        for version, entry in versions.items():
            archive = store / entry.get("marName", "")
            if not entry.get("marName") or not archive.exists():
                raise UserError(
                    f"model_snapshot entry '{name}' names marName {entry.get('marName')!r}, which is not in {store}: "
                    "run 'tsctl config' again after packaging"
                )
            facts = archive_facts.read(archive, within=store)
            manifest = facts.model
            if manifest["modelName"] != name:
                raise UserError(
                    f"model_snapshot key '{name}' differs from {archive.name}'s model name "
                    f"'{manifest['modelName']}': KServe serves the key, so requests for either would miss one; "
                    "run 'tsctl config' again"
                )
            notes.extend(archive_notes(facts.config, f"{archive.name}'s model-config.yaml"))
            if envelope_batches and not facts.toolkit and entry.get("batchSize", 1) > 1:
                entry["batchSize"] = 1
                notes.append(
                    f"{name}: batchSize set to 1 in the exported config: its handler ({manifest.get('handler')}) runs "
                    "inside TorchServe 0.12's KServe envelope, which answers every request of a larger batch with 503"
                )
            archives.append(facts)
    return archives


def check_split(
    split: List[Tuple[str, int]], transformer: bool, snapshot: dict, facts: List[ArchiveFacts], notes: List[str]
):
    """``--split``: two models of the snapshot, taking the same input, whose weights add up to 100; no
    ``transformer`` beside it."""
    if not split:
        return
    models = snapshot.get("models", {})
    if len(split) != 2:
        raise UserError("--split takes exactly two MODEL=PERCENT values, e.g. --split a=90 --split b=10")
    for model, _ in split:
        if model not in models:
            raise UserError(f"--split model '{model}' is not in the config's model_snapshot ({', '.join(models)})")
    if split[0][0] == split[1][0]:
        raise UserError("--split needs two different models")
    first = first_versions(facts)
    notes += core.check_same_input("--split", {model: first[model] for model, _ in split})
    total = sum(weight for _, weight in split)
    if total != 100:
        raise UserError(f"--split weights add up to {total}, not 100")
    if transformer:
        raise UserError("--split and a transformer cannot be combined: split between models, or transform one")


def check_transformer(options: ExportOptions, snapshot: dict, facts: List[ArchiveFacts]) -> Optional[Transformer]:
    """``--transformer-image`` and ``--transformer-archive`` (together), the model it sends to
    (``--transformer-model``, else the snapshot's first), which must take tensors of the shape the
    transformer's handler makes."""
    if not (options.transformer_image or options.transformer_archive):
        return None
    if not (options.transformer_image and options.transformer_archive):
        raise UserError(
            "--transformer-image and --transformer-archive go together: the image runs the archive's pre/post"
        )
    transformer = core.splitting_transformer(options.transformer_archive)
    models = list(snapshot["models"])
    model = options.transformer_model or models[0]
    if model not in models:
        raise UserError(f"--transformer-model '{model}' is not in the config's model_snapshot ({', '.join(models)})")
    named = f"--transformer-model '{model}'" if options.transformer_model else f"model '{model}' (the first)"
    for predictor in (archive for archive in facts if archive.name == model):
        if predictor.input != "tensor":
            raise UserError(
                f"{named} is served by {predictor.path}, whose handler is {predictor.handler!r} (MANIFEST "
                "model.handler), but the transformer sends it tensors: package the same weights with --handler "
                "tensor under another model name and pass that name as --transformer-model"
            )
        core.check_transformer_shape(transformer, model, predictor.input_shape)
    return Transformer(options.transformer_image, model, transformer)


def first_versions(facts: List[ArchiveFacts]) -> Dict[str, ArchiveFacts]:
    """Each model's first version in the snapshot: what a split sends a model's requests to."""
    first: Dict[str, ArchiveFacts] = {}
    for archive in facts:
        first.setdefault(archive.name, archive)
    return first


# ---- manifests ----------------------------------------------------------------------------------------
def inference_service(service: Service, predictor: dict, plan: Autoscaling, canary: Optional[int]) -> dict:
    """The InferenceService: the target's predictor, with --canary's percent, and without --autoscale
    KServe's default autoscaler's bounds when given (--autoscale writes its own: autoscale.apply)."""
    spec: dict = {}
    if canary is not None:
        spec["canaryTrafficPercent"] = canary
    spec.update(predictor)
    if not plan.mode.scales and plan.min_replicas != KSERVE_MIN_REPLICAS:
        spec["minReplicas"] = plan.min_replicas
    if not plan.mode.scales and plan.max_given:
        spec["maxReplicas"] = plan.max_replicas
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": service.name, "namespace": service.namespace},
        "spec": {"predictor": spec},
    }


def transformer_spec(transformer: Transformer, protocol: str, storage_uri: str, pod: PodSize) -> dict:
    """The InferenceService's transformer: KServe's transformer running the archive's pre- and post-processing
    in front of the predictor."""
    archive = transformer.facts.path.name
    return {
        "containers": [
            {
                "name": "kserve-container",
                "image": transformer.image,
                "command": ["python", "-m", "serving.runtimes.kserve_transformer"],
                "args": [
                    "--model_name",
                    transformer.model,
                    "--archive",
                    f"/mnt/models/transformer/{archive}",
                    "--predictor_protocol",
                    protocol,
                ],
                "env": [{"name": "STORAGE_URI", "value": storage_uri}],
                "resources": pod.resources(),
            }
        ]
    }


def inference_graph(service: Service, split: List[Tuple[str, int]]) -> dict:
    host = f"{service.name}-predictor.{service.namespace}.svc.cluster.local"
    steps = [
        {"name": model, "serviceUrl": f"http://{host}{predict_path(service.protocol, model)}", "weight": weight}
        for model, weight in split
    ]
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "InferenceGraph",
        "metadata": {"name": f"{service.name}-split", "namespace": service.namespace},
        "spec": {"nodes": {"root": {"routerType": "Splitter", "steps": steps}}},
    }


def served_models(facts: List[ArchiveFacts], transformer: Optional[Transformer]) -> List[Served]:
    """Each snapshot model with the kind of input its archive's handler takes; with a transformer in front,
    only the transformer's model, which takes what the transformer archive's handler reads."""
    if transformer is not None:
        front = transformer.facts
        return [Served(transformer.model, front.handler, front.input, golden=sample_answers(front))]
    served: Dict[str, Served] = {}
    for archive in facts:
        model = Served(archive.name, archive.handler, archive.input, archive.input_shape, sample_answers(archive))
        served.setdefault(archive.name, model)
    return list(served.values())
