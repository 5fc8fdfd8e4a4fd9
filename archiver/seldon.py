"""``tsctl export seldon``: a model store as Seldon Core 2 serves it, on MLServer with tsctl's runtime.

    OUT/models/NAME/NAME.mar              each model's archive (the default version of each model)
    OUT/models/NAME/model-settings.json   archiver.mlserver.model_settings: implementation
                                          serving.mlserver_runtime.ArchiveModel, uri ./NAME.mar
    OUT/models/T-pre/, OUT/models/T-post/ with --transformer-archive: the transformer's archive twice, its
                                          settings' parameters.extra.role "preprocess" and "postprocess"
                                          (serving/mlserver_runtime.py), T = the archive's model name
    OUT/server.yaml                       a Server on the mlserver ServerConfig: the image built from
                                          server-image/, the claim mounted read-only into its rclone container
    OUT/models.yaml                       one Model per folder: storageUri /var/models/models/NAME,
                                          requirements [tsctl, pvc] (only this Server advertises both)
    OUT/experiment.yaml                   with --ab: an Experiment (A/B) between models of the store
    OUT/pipeline.yaml                     with --transformer-archive: a Pipeline T-pre -> model -> T-post
    OUT/networkpolicy.yaml                a NetworkPolicy: other pods reach the Server's pods only on the agent's
                                          ports (its proxies, its metrics), never MLServer's own (network_policy)
    OUT/pvc.yaml, OUT/pvc-copy-pod.yaml   the claim and a pod to copy models/ onto it (archiver/kserve.py's)
    OUT/server-image/                     the server image's build context: python:X.Y-slim, MLServer, the
                                          archives' requirements, the handlers package at /opt/tsctl
    OUT/DEPLOY.md                         every command, from the image build to one curl per model (relative to OUT)
    OUT/inputs/                           what the request bodies are built from (archiver/kserve.py: sample_inputs)

How Seldon Core 2 uses them (SeldonIO/seldon-core at 7b77f8b7, read from the source where the docs are
silent): the operator merges the Server's podSpec into the ServerConfig's by container name, appending
list entries (env, volumeMounts), so ``MLSERVER_PARALLEL_WORKERS=0`` comes after the ServerConfig's "1"
and, as the later entry, wins. The agent copies a Model's storageUri folder (here through rclone, from
the claim) into the server's model directory and rewrites its model-settings.json through a struct that
keeps name, implementation and parameters (uri, version, extra) and drops the rest, MLServer's batching
keys included (their defaults leave adaptive batching off, as model_settings asks). The scheduler places a
Model on a Server whose capabilities hold every one of its requirements and whose memory request still has
room for its ``memory``: so the mlserver container asks for --memory times the number of Models.

An Experiment with ``default`` changes that model's own route: requests naming the model (``seldon-model:
MODEL``) are split between the candidates as well as those naming ``EXP.experiment``. A Pipeline step names
a Model, never an Experiment; its model gateway calls each step through the mesh with ``seldon-model:
STEP``, so a step naming the experiment's default model is split the same way (scheduler/pkg/kafka/
gateway/worker.go, scheduler/pkg/envoy/processor/incremental.go). That is how ``--transformer-model EXP``
is written: the pipeline's model step is the experiment's default model.

Every check runs before anything is written, and the tree is written beside OUT and renamed into place:
a failure leaves no OUT (or the previous one, with --force).
"""

import json
import sys
from dataclasses import dataclass, field
from decimal import Decimal
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

import yaml

from handlers import archives as archive_files
from handlers import identity
from serving import ts_config

from . import crds, kserve, kserve_engine, kube, mlserver, out_dir
from .errors import UserError
from .kube import check_resources, label, suggest

API_VERSION = "mlops.seldon.io/v1alpha1"
SERVER_CONFIG = "mlserver"  # Seldon Core 2's own MLServer ServerConfig
CAPABILITIES = ["tsctl", "pvc"]  # what the Server adds to the ServerConfig's, and what each Model requires
MOUNT = "/var/models"  # where the rclone container sees the claim (Seldon's k8s-pvc example)
MODELS_DIR = "models"  # OUT/models/ is the claim's models/
CLAIM_VOLUME = "models-pvc"  # as in Seldon's k8s-pvc example
IMAGE_DIR = "server-image"
# python:X.Y-slim with this environment's Python, MLServer and the pins below: what samples/runtime_env.py's
# mlserver venv (the tests' server) holds. Seldon's own mlserver image has Python 3.10, where several pins
# have no wheels.
BASE_IMAGE = f"python:{sys.version_info.major}.{sys.version_info.minor}-slim"
RUNTIME_PATH = "/opt/tsctl"  # the handlers package in the image, on PYTHONPATH
# Seldon's mlserver ServerConfig: the agent's REST and gRPC reverse proxies (what seldon-mesh calls) and its
# metrics; MLServer itself listens on 9000 (REST) and 9500 (gRPC), which only the agent, in the pod, calls.
AGENT_PORTS = (9001, 9501, 9006)
SERVER_POD_LABEL = "seldon-server-name"  # the label Seldon's operator gives a Server's pods (its name)
AGENT_VOLUME_BYTES = 1 << 30  # the mlserver ServerConfig's mlserver-models volume (1Gi): what the agent copies into
# The runtime's own imports (serving/mlserver_runtime.py, engine_workers.py: TorchServe's worker) and the
# toolkit handlers', at the versions installed here; MLServer at the release the runtime is tested with;
# captum, which TorchServe's own vision handlers import (pytorch/serve's image examples).
BASE_PACKAGES = ("torch", "torchvision", "torchserve", "numpy", "Pillow", "PyYAML", "captum")
TEXT_PACKAGES = ("transformers", "safetensors")


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
    ab: List[Tuple[str, int]] = field(default_factory=list)
    default: Optional[str] = None
    experiment: Optional[str] = None
    transformer_archive: Optional[str] = None
    transformer_model: Optional[str] = None
    force: bool = False


@dataclass
class SeldonExport:
    files: List[Path]
    notes: List[str]
    curls: List[str]


@dataclass
class Entry:
    """One Seldon Model: its name, archive and model-settings.json."""

    name: str
    archive: Path
    settings: dict
    kind: Optional[str]  # image, text, tensor (MAR-INF/tsctl.json); None for a handler of the user's own
    handler: str
    shape: Optional[list] = None  # a tensor model's handler.input_shape

    @property
    def served(self) -> kserve.Served:
        return kserve.Served(self.name, self.handler, self.kind, self.shape, self.archive)


@dataclass
class Plan:
    """Everything the export writes, decided and checked before any of it is."""

    entries: List[Entry]
    transformers: List[Entry]  # with a transformer: its preprocess and postprocess Models, else none
    manifests: Dict[str, List[dict]]
    experiment: Optional[str]
    pipeline: Optional[str]
    pipeline_model: Optional[str]
    notes: List[str]


def parse_ab(values) -> List[Tuple[str, int]]:
    """``--ab MODEL=WEIGHT`` values as pairs; a UserError for one that is not that."""
    pairs = []
    for value in values:
        if "," in value or " " in value.strip():
            raise UserError(
                f"--ab {value!r} names several candidates: give each its own --ab, e.g. --ab a=90 --ab b=10"
            )
        model, sep, weight = value.rpartition("=")
        if not sep or not model or not weight.isdigit() or int(weight) < 1:
            raise UserError(
                f"--ab {value!r} must be MODEL=WEIGHT with WEIGHT a positive whole number, e.g. --ab resnet18=90"
            )
        pairs.append((model, int(weight)))
    return pairs


def export(options: SeldonOptions) -> SeldonExport:
    """Check everything, then write the tree into a directory beside OUT and rename it into place."""
    plan = check(options)
    out = Path(options.out)
    with out_dir.written_beside(out) as staging:
        written = write(plan, options, staging)
    return SeldonExport(out_dir.moved(written, staging, out), plan.notes, curl_lines(options, plan))


# ---- checks -------------------------------------------------------------------------------------------
def check(options: SeldonOptions) -> Plan:
    notes: List[str] = []
    check_out(options)
    check_flags(options)
    specs = default_versions(options, notes)
    entries = [entry_of(spec) for spec in specs]
    names = [entry.name for entry in entries]
    experiment = check_ab(options, names)
    if options.ab:
        kinds = {entry.name: entry.kind for entry in entries}
        kserve.check_same_input("--ab", {model: kinds[model] for model, _ in options.ab})
    transformers, pipeline, pipeline_model = check_transformer(options, entries, experiment, notes)
    all_entries = entries + transformers
    requirements([entry.archive for entry in all_entries], False)  # each line checked before anything is written
    notes += size_notes(options, all_entries)
    manifests = {
        "server.yaml": [server(options, len(all_entries))],
        "models.yaml": [model(options, entry.name) for entry in all_entries],
    }
    if experiment:
        manifests["experiment.yaml"] = [experiment_manifest(options, experiment)]
    if pipeline:
        manifests["pipeline.yaml"] = [pipeline_manifest(options, pipeline, transformers, pipeline_model)]
    for name, documents in manifests.items():
        for document in documents:
            crds.check(document, name)
    manifests["networkpolicy.yaml"] = [network_policy(options)]
    view = kserve_view(options)
    manifests["pvc.yaml"] = [kserve.claim_manifest(view, options.claim, [e.archive for e in all_entries])]
    manifests["pvc-copy-pod.yaml"] = [kserve.copy_pod(view, options.claim)]
    return Plan(entries, transformers, manifests, experiment, pipeline, pipeline_model, notes)


def check_out(options: SeldonOptions):
    inputs = [("--model-store", options.model_store), ("--config", options.config)]
    inputs.append(("--transformer-archive", options.transformer_archive))
    out_dir.check(Path(options.out), options.force, inputs)


def check_flags(options: SeldonOptions):
    label(options.server, "--server", "name the Server another way, e.g. --server tsctl-mlserver")
    label(options.claim, "--claim", "name the claim another way, e.g. --claim tsctl-models")
    label(options.namespace, "--namespace", "give the namespace Seldon Core 2 runs in, e.g. --namespace seldon-mesh")
    if not options.image or any(c.isspace() for c in options.image):
        raise UserError(
            f"--image {options.image!r} must name the image to build from OUT/{IMAGE_DIR}, "
            "e.g. --image registry.example.com/tsctl-mlserver:1"
        )
    check_resources(options.cpu, options.memory)
    if not options.ab and (options.default or options.experiment):
        flag = "--default" if options.default else "--experiment"
        raise UserError(f"{flag} is for an A/B experiment: give its candidates with --ab MODEL=WEIGHT (twice or more)")
    if bool(options.transformer_archive) != bool(options.transformer_model):
        raise UserError(
            "--transformer-archive and --transformer-model go together: the archive whose preprocessing runs "
            "first, and the model (or --ab experiment) it sends to"
        )


def config_path(options: SeldonOptions) -> Optional[Path]:
    if options.config:
        return Path(options.config)
    return ts_config.default_config(Path(options.model_store))


def default_versions(options: SeldonOptions, notes: List[str]) -> List[ts_config.ModelSpec]:
    """Each model's default version (Seldon serves one artifact per Model), each named as Seldon needs."""
    try:
        specs, _ = ts_config.models(config_path(options), Path(options.model_store))
    except ts_config.ConfigError as exc:
        raise UserError(str(exc)) from None
    chosen: Dict[str, ts_config.ModelSpec] = {}
    versions: Dict[str, List[str]] = {}
    for spec in specs:
        versions.setdefault(spec.name, []).append(spec.version)
        if spec.default or spec.name not in chosen:
            chosen[spec.name] = spec
    for name, listed in versions.items():
        if len(listed) > 1:
            notes.append(
                f"{name}: the snapshot has versions {', '.join(listed)}; exported the default version "
                f"{chosen[name].version} only (a Seldon Model serves one; export another version under its own "
                "model name to serve both)"
            )
    for spec in chosen.values():
        fix = f"package it again with --model-name {suggest(spec.name)} and remove {spec.archive} from the store"
        label(spec.name, f"model {spec.archive.name}'s name", fix)
    return list(chosen.values())


def entry_of(spec: ts_config.ModelSpec, extra: Optional[dict] = None) -> Entry:
    archive = spec.archive
    manifest = archive_files.read_manifest(archive)["model"]
    kind = kserve.kind_of(archive)
    shape = None
    if kind == "tensor":
        shape = (ts_config.archive_config(archive).get("handler") or {}).get("input_shape")
    settings = mlserver.model_settings(spec, f"./{archive.name}", extra)
    return Entry(spec.name, archive, settings, kind, str(manifest.get("handler")), shape)


def check_ab(options: SeldonOptions, names: List[str]) -> Optional[str]:
    """The experiment's name, after checking its candidates; None without --ab."""
    if not options.ab:
        return None
    if len(options.ab) < 2:
        raise UserError("--ab needs at least two candidates, e.g. --ab resnet18=90 --ab resnet18-b=10")
    seen = set()
    for model_name, weight in options.ab:
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
            raise UserError(f"--ab {model_name}={weight}: the weight must be a positive whole number, e.g. 90")
        if model_name not in names:
            raise UserError(
                f"--ab model '{model_name}' is not a model of the store ({', '.join(names)}): name one of them"
            )
        if model_name in seen:
            raise UserError(f"--ab names '{model_name}' twice: give each candidate once, with its weight")
        seen.add(model_name)
    candidates = [model_name for model_name, _ in options.ab]
    if options.default is not None and options.default not in candidates:
        raise UserError(
            f"--default '{options.default}' is not among the --ab candidates ({', '.join(candidates)}): "
            "name one of them"
        )
    options.default = options.default or candidates[0]
    name = options.experiment or f"{candidates[0]}-ab"
    label(name, "--experiment", f"name the experiment another way, e.g. --experiment {suggest(name)[:60]}")
    return name


def check_transformer(
    options: SeldonOptions, entries: List[Entry], experiment: Optional[str], notes: List[str]
) -> Tuple[List[Entry], Optional[str], Optional[str]]:
    """The transformer's preprocess and postprocess Models, the pipeline's name and its model step; ([],
    None, None) without a transformer. As for KServe's transformer, the archive's handler must split
    (preprocessing to one tensor, postprocessing from the model's raw output) and the model step must
    take tensors (``--handler tensor`` with the same weights)."""
    if not options.transformer_archive:
        return [], None, None
    archive = Path(options.transformer_archive)
    if not archive.exists():
        raise UserError(f"--transformer-archive {archive} does not exist")
    record = identity.read(archive)
    if record is None:
        handler = archive_files.read_manifest(archive)["model"].get("handler")
        raise UserError(
            f"--transformer-archive {archive} is not a toolkit archive (no {identity.RECORD}; handler {handler!r}): "
            "package it with a toolkit handler, e.g. --handler image_classifier"
        )
    if not record.get("splits"):
        raise UserError(
            f"--transformer-archive {archive}: its handler ({record.get('class')}) cannot run apart from its model "
            f"({identity.RECORD} splits: false: its preprocessing does not make one tensor of a request, or there is "
            "none): use an archive built with --handler image_classifier"
        )
    names = {entry.name: entry for entry in entries}
    target = options.transformer_model
    if target not in names and target != experiment:
        also = f", or the experiment '{experiment}'" if experiment else ""
        raise UserError(
            f"--transformer-model '{target}' is not a model of the store ({', '.join(names)}{also}): name one of them"
        )
    predictors = [candidate for candidate, _ in options.ab] if target == experiment else [target]
    for predictor in predictors:
        if names[predictor].kind != "tensor":
            role = f"a candidate of the experiment '{target}'" if target == experiment else "the pipeline's model step"
            raise UserError(
                f"--transformer-model: '{predictor}' ({role}) gets the transformer's tensors, but its handler "
                f"({names[predictor].handler}) reads {names[predictor].kind or 'its own'} requests: package the same "
                "weights with --handler tensor and name that model"
            )
    model_name = archive_files.read_manifest(archive)["model"]["modelName"]
    base = suggest(model_name)[:58]
    transformers = []
    for role, suffix in (("preprocess", "pre"), ("postprocess", "post")):
        name = f"{base}-{suffix}"
        label(name, "the transformer's Model name", f"package {archive.name} again with a shorter --model-name")
        if name in names:
            raise UserError(
                f"the transformer's Model name '{name}' is also a model of the store: package {archive.name} again "
                "under another --model-name"
            )
        transformers.append(entry_of(transformer_spec(archive, name), {"role": role}))
    step = options.default if target == experiment else target
    pipeline = f"{target}-pipeline"
    shorter = "--experiment" if target == experiment else "--transformer-model"
    label(pipeline, "the pipeline's name", f"use a shorter {shorter}")
    if pipeline in names or pipeline in (t.name for t in transformers):
        raise UserError(f"the pipeline's name '{pipeline}' is also the name of one of its models: rename that model")
    if target == experiment:
        notes.append(
            f"pipeline {pipeline}: its model step is '{step}', the experiment's default; a Pipeline step names a "
            f"Model, not an Experiment, and Seldon routes the step's calls (seldon-model: {step}) by {experiment}'s "
            "weights because the experiment has that default (x-seldon-route does not pin a route inside a pipeline)"
        )
    return transformers, pipeline, step


def transformer_spec(archive: Path, name: str) -> ts_config.ModelSpec:
    """The transformer's worker settings: its model-config.yaml's, as TorchServe registers an archive."""
    spec = ts_config._from_archive(archive, ts_config.Frontend())
    spec.name = name
    return spec


def size_notes(options: SeldonOptions, entries: List[Entry]) -> List[str]:
    notes = []
    total = sum(kserve.disk_size(entry.archive) for entry in entries)
    if total > AGENT_VOLUME_BYTES:
        notes.append(
            f"the archives add up to {total / 2**30:.1f} GiB: each server replica's agent copies them onto the "
            f"{SERVER_CONFIG} ServerConfig's mlserver-models volume, 1Gi in Seldon's default: give that "
            "volumeClaimTemplate more storage"
        )
    if len(entries) > 1:
        notes.append(
            f"server.yaml: the mlserver container asks for {server_memory(options, len(entries))} of memory, "
            f"{len(entries)} Models of --memory {options.memory} each (Seldon places a Model only where the memory "
            "its Models declare still fits the container's memory request)"
        )
    return notes


# ---- manifests ----------------------------------------------------------------------------------------
def metadata_of(options: SeldonOptions, name: str) -> dict:
    return {"name": name, "namespace": options.namespace}


def server_memory(options: SeldonOptions, models: int) -> str:
    number, unit = kube.MEMORY.match(options.memory).groups()
    total = Decimal(number) * models
    text = str(int(total)) if total == total.to_integral_value() else format(total.normalize(), "f")
    return f"{text}{unit or ''}"


def server(options: SeldonOptions, models: int) -> dict:
    """The Server: Seldon's MLServer ServerConfig, its mlserver container running our image, the claim
    mounted read-only where the rclone container copies Models from."""
    amount = {"cpu": options.cpu, "memory": server_memory(options, models)}
    return {
        "apiVersion": API_VERSION,
        "kind": "Server",
        "metadata": metadata_of(options, options.server),
        "spec": {
            "serverConfig": SERVER_CONFIG,
            "extraCapabilities": list(CAPABILITIES),
            "replicas": 1,  # the claim is ReadWriteOnce: one node mounts it
            "podSpec": {
                "volumes": [
                    {"name": CLAIM_VOLUME, "persistentVolumeClaim": {"claimName": options.claim, "readOnly": True}}
                ],
                "containers": [
                    {
                        "name": "rclone",
                        "volumeMounts": [{"name": CLAIM_VOLUME, "mountPath": MOUNT, "readOnly": True}],
                    },
                    {
                        "name": "mlserver",
                        "image": options.image,
                        "env": [
                            # the runtime's archive workers are processes already: predict runs on MLServer's loop
                            {"name": "MLSERVER_PARALLEL_WORKERS", "value": "0"},
                            {"name": "PYTHONPATH", "value": RUNTIME_PATH},
                        ],
                        "resources": {"requests": dict(amount), "limits": dict(amount)},
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


def kserve_view(options: SeldonOptions) -> SimpleNamespace:
    """What archiver/kserve.py's claim and copy pod read of their options."""
    return SimpleNamespace(name=options.server, namespace=options.namespace, transformer_archive=None)


# ---- the image ----------------------------------------------------------------------------------------
def requirements(archives: List[Path], text: bool) -> str:
    """The runtime's packages at the versions installed here, then each archive's own requirement lines
    (read as archiver/kserve_engine.requirements reads them: its lines without its engine's server packages,
    which would replace MLServer's own)."""
    names = BASE_PACKAGES + (TEXT_PACKAGES if text else ())
    lines = [mlserver.REQUIREMENT] + [pinned(name) for name in names]
    engine_pins = {f"{name}=={metadata.version(name)}" for name in kserve_engine.BASE_PACKAGES}
    for line in kserve_engine.requirements(archives).splitlines():
        if line not in engine_pins and line not in lines:
            lines.append(line)
    return "\n".join(lines) + "\n"


DOCKERFILE = """\
# Seldon Core 2's MLServer with tsctl's runtime (serving.mlserver_runtime.ArchiveModel): the image
# server.yaml's mlserver container runs, started as Seldon's mlserver image starts (the ServerConfig sets
# its ports and MLSERVER_MODELS_DIR), through serving/mlserver_start.py: no REST model repository load or
# unload (Seldon's agent uses gRPC's), request bodies bounded. From the directory DEPLOY.md is in:
#   docker build -t {image} {context} && docker push {image}
FROM {base}
ARG TORCH_INDEX={torch_index}
RUN useradd --uid 1000 --create-home mlserver
COPY requirements.txt {runtime}/requirements.txt
RUN pip install --no-cache-dir --extra-index-url "$TORCH_INDEX" -r {runtime}/requirements.txt
COPY handlers/ {runtime}/handlers/
COPY serving/ {runtime}/serving/
ENV PYTHONPATH={runtime} PYTHONUNBUFFERED=1 MLSERVER_MODELS_DIR=/mnt/agent/models
USER 1000
CMD ["sh", "-c", "exec python -m serving.mlserver_start start \\"$MLSERVER_MODELS_DIR\\""]
"""


def pinned(name: str) -> str:
    """``name==VERSION`` as installed here, else the bare name."""
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return name


def write_image_context(out: Path, options: SeldonOptions, entries: List[Entry]) -> List[Path]:
    context = out / IMAGE_DIR
    context.mkdir(parents=True)
    dockerfile = context / "Dockerfile"
    dockerfile.write_text(
        DOCKERFILE.format(
            image=options.image,
            context=IMAGE_DIR,
            base=BASE_IMAGE,
            torch_index=kserve_engine.CPU_TORCH_INDEX,
            runtime=RUNTIME_PATH,
        )
    )
    pinned = context / "requirements.txt"
    text = any(entry.kind == "text" for entry in entries)
    pinned.write_text(requirements([entry.archive for entry in entries], text))
    return [dockerfile, pinned] + kserve_engine.copy_packages(context)


# ---- writing ------------------------------------------------------------------------------------------
def write(plan: Plan, options: SeldonOptions, root: Path) -> List[Path]:
    files: List[Path] = []
    for entry in plan.entries + plan.transformers:
        folder = root / MODELS_DIR / entry.name
        folder.mkdir(parents=True)
        kserve.copy_archive(entry.archive, folder / entry.archive.name)
        (folder / mlserver.MODEL_SETTINGS).write_text(json.dumps(entry.settings, indent=2) + "\n")
        files += [folder / entry.archive.name, folder / mlserver.MODEL_SETTINGS]
    for name, documents in plan.manifests.items():
        (root / name).write_text(yaml.safe_dump_all(documents, sort_keys=False), encoding="utf-8")
        files.append(root / name)
    files += write_image_context(root, options, plan.entries + plan.transformers)
    served = served_models(plan)
    files += kserve.write_inputs(root, kserve.sample_inputs(served))
    (root / "DEPLOY.md").write_text(deploy_steps(options, plan, served), encoding="utf-8")
    files.append(root / "DEPLOY.md")
    return files


# ---- DEPLOY.md ----------------------------------------------------------------------------------------
def curl_line(seldon_model: str, path_name: str, input_file: str, show_headers: bool = False) -> str:
    return (
        f'curl{" -i" if show_headers else ""} -H "Content-Type: application/json" -H "seldon-model: {seldon_model}" '
        f'"http://${{MESH_IP}}/v2/models/{path_name}/infer" --data-binary @{input_file}'
    )


def curl_lines(options: SeldonOptions, plan: Plan) -> List[str]:
    """One curl per model, then the experiment's and the pipeline's."""
    lines = [curl_line(entry.name, entry.name, entry.served.input_file) for entry in plan.entries]
    by_name = {entry.name: entry for entry in plan.entries}
    if plan.experiment:
        first = by_name[options.ab[0][0]]
        lines.append(curl_line(f"{plan.experiment}.experiment", plan.experiment, first.served.input_file, True))
    if plan.pipeline:
        lines.append(curl_line(f"{plan.pipeline}.pipeline", plan.pipeline, plan.transformers[0].served.input_file))
    return lines


def input_steps(served: List[kserve.Served]) -> List[str]:
    lines = [
        "## 6. Build the request bodies",
        "",
        "Each file holds an Open Inference Protocol (v2) body, e.g. "
        '`{"inputs":[{"name":"input-0","shape":[1],"datatype":"BYTES","data":["..."]}]}`: for an image the base64 '
        "of its file (a JPEG, say), for text the strings.",
        "",
    ]
    return lines + kserve.request_bodies("v2", served)


def served_models(plan: Plan) -> List[kserve.Served]:
    """The models DEPLOY.md builds request bodies for: each Model, and the pipeline's first step when its
    requests differ from theirs."""
    served = [entry.served for entry in plan.entries]
    if plan.transformers and all(s.input_file != plan.transformers[0].served.input_file for s in served):
        served.append(plan.transformers[0].served)
    return served


def deploy_steps(options: SeldonOptions, plan: Plan, served: List[kserve.Served]) -> str:
    """DEPLOY.md, every command relative to its own directory; ``served``: served_models(plan), their
    sample inputs chosen (kserve.sample_inputs)."""
    ns = f"-n {options.namespace}"
    pod = f"{options.server}-copy"
    entries = plan.entries + plan.transformers
    curls = curl_lines(options, plan)
    claim_size = kserve.claim_size(kserve_view(options), [entry.archive for entry in entries])
    lines = [
        f"# Deploying {', '.join(e.name for e in plan.entries)} on Seldon Core 2",
        "",
        "Run every command from the directory this file is in: the paths below are relative to it. `cd` there; "
        "this says so if you are elsewhere:",
        "",
        "```sh",
        kserve.HERE_CHECK.format(folder=MODELS_DIR),
        "```",
        "",
        f"You need kubectl for a cluster running Seldon Core 2 in the namespace `{options.namespace}` (its "
        f"`{SERVER_CONFIG}` ServerConfig and the `seldon-mesh` service), docker (or any image builder) and python3.",
        "",
        "## 1. The server image",
        "",
        f"`{IMAGE_DIR}/` is the build context of `{options.image}`: {BASE_IMAGE} with tsctl's MLServer runtime "
        f"(`{mlserver.IMPLEMENTATION}`, the handlers package at {RUNTIME_PATH}) and what the archives need, pinned in "
        f"`{IMAGE_DIR}/requirements.txt`, installed when the image is built (the build needs the package index; the "
        "pods install nothing). Push it where the cluster pulls from:",
        "",
        "```sh",
        f"docker build -t {options.image} {IMAGE_DIR}",
        f"docker push {options.image}",
        "```",
        "",
        "## 2. The claim",
        "",
        f"`pvc.yaml` asks for the PersistentVolumeClaim `{options.claim}`: {claim_size}, ReadWriteOnce, the "
        f"cluster's default StorageClass. Skip this step if the claim exists already (`kubectl get pvc {ns} "
        f"{options.claim}` shows it).",
        "",
        "```sh",
        f"kubectl apply {ns} -f pvc.yaml",
        "```",
        "",
        f"## 3. Copy models/ onto the claim (the Server's rclone container sees it at {MOUNT})",
        "",
        f"The copy pod runs busybox as uid {kserve.COPY_POD_UID}, non-root, under the restricted Pod Security "
        "Standard; the files it writes are readable by everyone (Seldon's servers run as uid 1000).",
        "",
        "```sh",
        f"kubectl apply {ns} -f pvc-copy-pod.yaml",
        f"kubectl wait {ns} --for=condition=Ready pod/{pod} --timeout=120s",
        f"kubectl exec {ns} {pod} -- mkdir -p " + " ".join(f"/pvc/{MODELS_DIR}/{e.name}" for e in entries),
    ]
    for entry in entries:
        for file in (entry.archive.name, mlserver.MODEL_SETTINGS):
            path = f"{MODELS_DIR}/{entry.name}/{file}"
            lines.append(f"kubectl cp {ns} {path} {pod}:/pvc/{path}")
    lines += [
        f"kubectl exec {ns} {pod} -- ls -lR /pvc/{MODELS_DIR}",
        f"kubectl delete {ns} pod/{pod}",
        "```",
        "",
        "Delete the pod before step 4: a ReadWriteOnce claim is attached to one node at a time.",
        "",
        "## 4. Deploy",
        "",
        f"`server.yaml` is the Server `{options.server}` (Seldon's `{SERVER_CONFIG}` ServerConfig with the image of "
        f"step 1, advertising the capabilities {', '.join(CAPABILITIES)}); `models.yaml` holds one Model per folder of "
        f"models/, each requiring those capabilities, so they are placed on this Server.",
        "",
        "`networkpolicy.yaml` lets other pods reach the Server's pods only on the agent's ports "
        f"({', '.join(map(str, AGENT_PORTS))}: its REST and gRPC proxies, which `seldon-mesh` calls, and its metrics), "
        'never MLServer\'s own 9000 and 9500 (see "What reaches MLServer" below).',
        "",
        "```sh",
        f"kubectl apply {ns} -f networkpolicy.yaml",
        f"kubectl apply {ns} -f server.yaml",
        f"kubectl wait {ns} --for condition=ready --timeout=600s server/{options.server}",
        f"kubectl apply {ns} -f models.yaml",
    ]
    lines += [f"kubectl wait {ns} --for condition=ready --timeout=600s model/{e.name}" for e in entries]
    if plan.experiment:
        lines += [
            f"kubectl apply {ns} -f experiment.yaml",
            f"kubectl wait {ns} --for condition=ready --timeout=300s experiment/{plan.experiment}",
        ]
    if plan.pipeline:
        lines += [
            f"kubectl apply {ns} -f pipeline.yaml",
            f"kubectl wait {ns} --for condition=ready --timeout=300s pipeline/{plan.pipeline}",
        ]
    lines += [
        "```",
        "",
        "## 5. The mesh's address",
        "",
        "Where the `seldon-mesh` service has a load balancer:",
        "",
        "```sh",
        f"MESH_IP=$(kubectl get svc seldon-mesh {ns} -o jsonpath='{{.status.loadBalancer.ingress[0].ip}}')",
        "```",
        "",
        "Without one, forward a local port to it in a second terminal that you leave running,",
        "",
        "```sh",
        f"kubectl port-forward {ns} svc/seldon-mesh 9000:80",
        "```",
        "",
        "and in this one:",
        "",
        "```sh",
        "MESH_IP=localhost:9000",
        "```",
        "",
        *input_steps(served),
        "## 7. Call each model",
        "",
        "The `seldon-model` header names what answers: a Model, `NAME.experiment` or `NAME.pipeline`.",
        "",
        "```sh",
        *curls[: len(plan.entries)],
        "```",
        "",
    ]
    if plan.experiment:
        weights = ", ".join(f"{name} {weight}" for name, weight in options.ab)
        total = sum(weight for _, weight in options.ab)
        lines += [
            f"The experiment `{plan.experiment}` sends each request to one candidate, by weight ({weights}; each "
            f"gets weight/{total} of the requests). With `default: {options.default}`, requests naming "
            f"`{options.default}` itself are split the same way.",
            "",
            "```sh",
            curls[len(plan.entries)],
            "```",
            "",
            "The response header `x-seldon-route` names the model that answered; send it back with the same "
            '`seldon-model` header (`-H "x-seldon-route: ROUTE"`) to keep a client on that model:',
            "",
            "```sh",
            f"ROUTE=$({curl_line(f'{plan.experiment}.experiment', plan.experiment, served_input(plan, options))} "
            "-s -o /dev/null -D - | tr -d '\\r' | awk 'tolower($1) == \"x-seldon-route:\" {print $2}')",
            curl_line(f"{plan.experiment}.experiment", plan.experiment, served_input(plan, options))
            + ' -H "x-seldon-route: ${ROUTE}"',
            "```",
            "",
        ]
    if plan.pipeline:
        lines += [
            f"The pipeline `{plan.pipeline}` sends each request to `{plan.transformers[0].name}` "
            f"({plan.transformers[0].archive.name}'s preprocessing in tsctl's runtime: one tensor), that tensor to "
            f"`{plan.pipeline_model}`"
            + (
                f", whose calls the experiment `{plan.experiment}` splits between its candidates"
                if options.transformer_model == plan.experiment
                else ""
            )
            + f", and its raw output to `{plan.transformers[1].name}` ({plan.transformers[0].archive.name}'s "
            "postprocessing), whose answer is the pipeline's:",
            "",
            "```sh",
            curls[-1],
            "```",
            "",
        ]
    return "\n".join(lines + exposure_lines(options))


def exposure_lines(options: SeldonOptions) -> List[str]:
    """DEPLOY.md's last section: what keeps clients from MLServer's model repository API, and its body bound."""
    from serving.ts_config import Frontend

    ports, ns, limit = ", ".join(map(str, AGENT_PORTS)), f"-n {options.namespace}", Frontend().max_request_size
    return [
        "## What reaches MLServer",
        "",
        "- **Loading and unloading models.** MLServer's model repository API (`POST /v2/repository/models/NAME/load`, "
        "`/unload`, and the same calls over gRPC) loads and unloads models, for whoever calls it; MLServer has no "
        "setting to turn it off, and the agent's REST proxy forwards any path to MLServer. The image starts MLServer "
        "through tsctl's `serving/mlserver_start.py`, whose REST app has no load and unload routes (404). The gRPC "
        "calls stay: the agent, in the Server's pod, loads and unloads Models with them on MLServer's port 9500 (its "
        "own gRPC proxy, which `seldon-mesh` calls, forwards only ModelInfer, ModelMetadata and ModelReady). "
        f"`networkpolicy.yaml` admits other pods to the Server's pods (label `{SERVER_POD_LABEL}: {options.server}`) "
        f"on the agent's ports {ports} only, so no other pod reaches MLServer's 9000 and 9500; the kubelet's probes "
        "come from the node, which a NetworkPolicy always admits. It is enforced only where the cluster's network "
        "plugin enforces NetworkPolicies (Calico, Cilium; not flannel alone). To check it, from another pod: "
        f"`kubectl run {ns} -it --rm probe --image=busybox --restart=Never -- wget -T 5 -O- "
        f"http://POD_IP:9000/v2/health/live` must time out (POD_IP: `kubectl get pods {ns} -o wide "
        f"-l {SERVER_POD_LABEL}={options.server}`).",
        f"- **Request bodies.** The image refuses a REST body above {limit:,} bytes (TorchServe's "
        "`max_request_size`) with 413 before MLServer parses it; `TSCTL_MAX_REQUEST_SIZE` in the mlserver "
        "container's env (server.yaml) changes it. gRPC messages are not bounded by it: Seldon's ServerConfig lets "
        "them reach 1 GB (`MLSERVER_GRPC_MAX_MESSAGE_LENGTH` in the same env lowers it). Bound both before the "
        "mesh too: with an nginx ingress in "
        "front, its annotation `nginx.ingress.kubernetes.io/proxy-body-size: 8m`; with Envoy, its buffer filter's "
        "`max_request_bytes: 8388608`.",
        "",
    ]


def served_input(plan: Plan, options: SeldonOptions) -> str:
    return next(e for e in plan.entries if e.name == options.ab[0][0]).served.input_file
