"""``tsctl export seldon --core 1``: a Seldon Core 1 SeldonDeployment whose graph is the archives' own,
TRANSFORMER -> ROUTER -> MODELs, each unit a container of one image running Seldon's Python wrapper
(``seldon-core-microservice`` of seldon-core 1.17.1) with a tsctl component (serving/runtimes/seldon_components.py).

    OUT/models/UNIT/ARCHIVE.mar      each unit's archive: the transformer's, each model's (claim: models/UNIT/)
    OUT/seldondeployment.yaml        the SeldonDeployment (machinelearning.seldon.io/v1)
    OUT/pvc.yaml, pvc-copy-pod.yaml  the claim and a pod to copy models/ onto it (core.py, as for Core 2)
    OUT/component-image/             the image's build context: python:X.Y-slim, seldon-core 1.17.1, this
                                     environment's torch (its CPU-only build) and torchserve, the archives'
                                     requirements, tsctl's handlers/ and serving/
    OUT/DEPLOY.md                    build, claim, copy, apply, the curl, reading meta.routing
    OUT/inputs/                      the image a request body is built from

**The graph**, as Seldon Core 1's executor walks it (executor/predictor/predictor_process.go at v1.17.1:
``Predict`` = ``transformInput``, then ``predictChildren`` (``route``, the chosen child's ``Predict``), then
``transformOutput``):

- ``transformer``: ``type: TRANSFORMER`` with ``methods: [TRANSFORM_INPUT, TRANSFORM_OUTPUT]``: the executor
  calls its ``/transform-input`` on the way in (a TRANSFORMER's, or a unit listing TRANSFORM_INPUT) and its
  ``/transform-output`` on the way out (an OUTPUT_TRANSFORMER's, or a unit listing TRANSFORM_OUTPUT): the
  archive's preprocessing before the router, its postprocessing after the model.
- ``router``: two candidates: ``implementation: RANDOM_ABTEST`` with one parameter ``ratioA`` (FLOAT): the
  executor itself sends a request to the first child when ``rand.Float64() < ratioA`` (components.go; with
  any other parameters it uses 0.5). It has no ``type``: a ROUTER-typed unit is called over HTTP instead.
  Three or more: ``type: ROUTER``, tsctl's router component with ``weights`` (STRING "60,30,10").
- one MODEL per candidate (or ``--transformer-model``'s alone, without a router): tsctl's model component
  running the archive's TorchServe workers. The MODEL children must take tensors (``--handler tensor``): they
  get the transformer's batch, as KServe's and Core 2's transformers send it.

Every unit is a container of ``componentSpecs[0]``, named as its unit (the operator finds a unit's container
by name, and refuses a graph unit without one unless it has an implementation: seldondeployment_webhook.go
``checkPredictiveUnits``): one pod, which mounts the ReadWriteOnce claim once. Each container's class and
service type are its env ``MODEL_NAME`` and ``SERVICE_TYPE``, as Seldon's wrapped images take them
(doc/source/python/python_wrapping_docker.md); ``GRPC_WORKERS=0``: the graph speaks REST, and the wrapper's
gRPC server would load the archive a second time in a process of its own. ``SELDON_ENABLE_ROUTING_INJECTION``
in ``svcOrchSpec.env`` makes the executor answer ``meta.routing`` (doc/source/graph/svcorch.md, "Routing
Metadata Injection": off by default, doc/source/analytics/routers.md "Limitations"). ``seldon.io/rest-timeout``
(spec.annotations, doc/source/graph/annotations.md) is each unit's REST timeout: the executor's per-unit call
(without it, none: rest/client.go) and the wrapper's gunicorn worker timeout (without it 5000 s: microservice.py
takes its 5000 ms default as seconds).

Every check runs before anything is written; the tree is written beside OUT and renamed into place.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import yaml

from ...errors import UserError
from .. import core, crds, out_dir
from ..archive_facts import ArchiveFacts
from ..bodies import sample_inputs
from ..images import pinned, pins, with_archive_lines, write_context
from ..kube import container_resources, cpu_cores, label, memory_bytes
from ..options import SeldonCore1Options
from . import export as seldon
from .image import BASE_IMAGE, dockerfile
from .plan import check_shared_flags

API_VERSION = "machinelearning.seldon.io/v1"
COMPONENTS = "serving.runtimes.seldon_components"
TRANSFORMER, ROUTER = "transformer", "router"  # the graph's unit names (each model's unit: its model name)
MOUNT = "/var/models"  # where each container sees the claim
MODELS_DIR = "models"
CLAIM_VOLUME = "models"
IMAGE_DIR = "component-image"
INGRESS_UNSET = "set INGRESS to the ingress address, HOST:PORT"  # the shell's message when INGRESS is unset
REST_TIMEOUT_MS = 60_000  # seldon.io/rest-timeout: a unit's call, and its gunicorn worker's timeout
# seldon-core 1.17.1 (the last Apache-2.0 release) and what its pins allow (numpy < 2, PyYAML <= 6.0.1), and
# setuptools < 81 (gunicorn 20.1 imports pkg_resources; torch 2.15 wants >= 77.0.3), as samples/runtime_env.py's
# venv holds them; the components' imports at the versions installed here.
SELDON_PINS = ("seldon-core==1.17.1", "numpy==1.26.4", "PyYAML==6.0.1", "setuptools==80.9.0")
BASE_PACKAGES = ("torch", "torchvision", "torchserve", "Pillow", "captum", "nvidia-ml-py")


@dataclass
class Unit:
    """One unit of the graph: its name, its archive's facts (None for RANDOM_ABTEST) and the model spec it runs."""

    name: str
    facts: Optional[ArchiveFacts]
    spec: object = None  # ts_config.ModelSpec of a model

    @property
    def archive(self) -> Optional[Path]:
        return self.facts.path if self.facts else None

    @property
    def folder(self) -> str:
        return f"{MODELS_DIR}/{self.name}"

    @property
    def mounted(self) -> str:
        return f"{MOUNT}/{self.folder}/{self.archive.name}"


@dataclass
class Graph:
    transformer: Unit
    models: List[Unit]
    weights: List[int]  # the router's, in the children's order ([] without a router)
    manifest: dict
    notes: List[str]


@dataclass
class Core1Export:
    files: List[Path]
    notes: List[str]
    curls: List[str]


def export(options: SeldonCore1Options) -> Core1Export:
    plan = check(options)
    out = Path(options.out)
    with out_dir.written_beside(out) as staging:
        written = write(plan, options, staging)
    return Core1Export(out_dir.moved(written, staging, out), plan.notes, [curl_line(options)])


# ---- checks -------------------------------------------------------------------------------------------
def check(options: SeldonCore1Options) -> Graph:
    notes: List[str] = []
    inputs = [("--model-store", options.model_store), ("--config", options.config)]
    out_dir.check(Path(options.out), options.force, inputs + [("--transformer-archive", options.transformer_archive)])
    check_flags(options)
    transformer = check_transformer(options)
    specs = {spec.name: spec for spec in seldon.default_versions(options, notes)}
    chosen, weights = candidates(options, list(specs))
    entries = {name: seldon.entry_of(specs[name]) for name in chosen}
    for name, entry in entries.items():
        if entry.kind != "tensor":
            raise UserError(
                f"model '{name}' gets the transformer's tensors, but its handler ({entry.handler}) reads "
                f"{entry.kind or 'its own'} requests: package the same weights with --handler tensor and name that "
                "model"
            )
        core.check_transformer_shape(transformer.facts, name, entry.shape)
    left = sorted(set(specs) - set(chosen))
    if left:
        notes.append(f"not in the graph, not exported: {', '.join(left)}")
    for name in (TRANSFORMER, ROUTER):
        if name in specs and (name in chosen):
            raise UserError(f"model '{name}' has the name of the graph's {name} unit: package it under another name")
    models = [Unit(name, entries[name].facts, specs[name]) for name in chosen]
    manifest = deployment(options, transformer, models, weights)
    crds.check(manifest, "seldondeployment.yaml")
    webhook_check(manifest)
    notes.append(f"seldondeployment.yaml: {pod_size(manifest)}")
    return Graph(transformer, models, weights, manifest, notes)


def check_flags(options: SeldonCore1Options):
    label(options.name, "--name", "name the SeldonDeployment another way, e.g. --name tsctl-graph")
    check_shared_flags(
        options,
        "give the namespace the graph goes in, e.g. --namespace seldon",
        f"name the image to build from OUT/{IMAGE_DIR}, e.g. --image registry.example.com/tsctl-seldon:1",
    )
    if not options.transformer_archive:
        raise UserError(
            "--core 1 exports the graph TRANSFORMER -> ROUTER -> MODELs: give --transformer-archive (a toolkit "
            "image archive) and the models (--ab MODEL=PERCENT twice or more, or --transformer-model MODEL)"
        )
    if options.ab and options.transformer_model:
        raise UserError(
            "--core 1: --transformer-model names the one model of a graph without a router; with --ab the "
            "router's candidates are the models: give one or the other"
        )
    if not options.ab and not options.transformer_model:
        raise UserError("--core 1: name the graph's models: --ab MODEL=PERCENT twice or more, or --transformer-model")


def check_transformer(options: SeldonCore1Options) -> Unit:
    archive = core.splitting_transformer(options.transformer_archive)
    return Unit(TRANSFORMER, archive)


def candidates(options: SeldonCore1Options, names: List[str]) -> Tuple[List[str], List[int]]:
    """The MODEL children and the router's weights ([] without a router)."""
    if not options.ab:
        if options.transformer_model not in names:
            raise UserError(
                f"--transformer-model '{options.transformer_model}' is not a model of the store "
                f"({', '.join(names)}): name one of them"
            )
        return [options.transformer_model], []
    if len(options.ab) < 2:
        raise UserError(
            f"--ab {options.ab[0][0]}={options.ab[0][1]}: a router needs two or more candidates, e.g. --ab a=90 "
            "--ab b=10 (one model: --transformer-model)"
        )
    chosen = [model for model, _ in options.ab]
    for model in chosen:
        if model not in names:
            raise UserError(f"--ab model '{model}' is not a model of the store ({', '.join(names)}): name one of them")
        if chosen.count(model) > 1:
            raise UserError(f"--ab names '{model}' twice: give each candidate once, with its percent")
    weights = [weight for _, weight in options.ab]
    if sum(weights) != 100:
        shown = " + ".join(map(str, weights))
        raise UserError(
            f"--core 1: the --ab percents must add up to 100 (the router's shares), got {shown} = {sum(weights)}"
        )
    return chosen, weights


def webhook_check(manifest: dict):
    """What Seldon's admission webhook refuses that the schema lets through (seldondeployment_webhook.go
    ``ValidateSeldonDeployment``, ``checkPredictiveUnits``): a unit without an implementation and without a
    container of its name, a protocol or transport it does not know."""
    spec = manifest["spec"]
    if spec.get("protocol", "seldon") not in ("seldon", "tensorflow", "kfserving", "v2"):
        raise UserError(f"seldondeployment.yaml: protocol {spec['protocol']!r} is not one Seldon Core 1 knows")
    if spec.get("transport", "rest") not in ("rest", "grpc"):
        raise UserError(f"seldondeployment.yaml: transport {spec['transport']!r} is not one Seldon Core 1 knows")
    for predictor in spec["predictors"]:
        containers = {c["name"] for part in predictor.get("componentSpecs", []) for c in part["spec"]["containers"]}
        stack = [predictor["graph"]]
        while stack:
            unit = stack.pop()
            if unit.get("implementation") in (None, "UNKNOWN_IMPLEMENTATION") and unit["name"] not in containers:
                raise UserError(f"seldondeployment.yaml: graph unit '{unit['name']}' has no container of its name")
            stack += unit.get("children", [])


def pod_size(manifest: dict) -> str:
    """What the graph's one pod asks of a node: its containers' requests added up, per container."""
    containers = manifest["spec"]["predictors"][0]["componentSpecs"][0]["spec"]["containers"]
    requests = [c["resources"]["requests"] for c in containers]
    millicores = sum(int(cpu_cores(r["cpu"]) * 1000) for r in requests)
    memory = sum(memory_bytes(r["memory"]) for r in requests)
    cpu = f"{millicores / 1000:g}"
    shown = f"{memory // 2**30}Gi" if memory % 2**30 == 0 else f"{memory / 2**20:g}Mi"
    each = ", ".join(f"{c['name']} {r['cpu']} / {r['memory']}" for c, r in zip(containers, requests))
    return (
        f"the graph's pod asks for {cpu} CPU and {shown} of memory ({each}; --cpu and --memory are each unit's), "
        "plus Seldon's executor container: a node must have that free, or the pod stays Pending"
    )


def seldon_requirements(archives: List[ArchiveFacts]) -> str:
    """seldon-core and its pins, the components' packages at the versions installed here, then each archive's
    own requirement lines (each checked: archiver/requirements.py)."""
    lines = list(SELDON_PINS) + [pinned(name) for name in BASE_PACKAGES]
    taken = pins(("numpy", "PyYAML"))  # seldon-core's pins stand for these
    for line in with_archive_lines(lines, archives):
        if line not in lines and line not in taken:
            lines.append(line)
    return "\n".join(lines) + "\n"


# ---- the SeldonDeployment -----------------------------------------------------------------------------
# it draws a number per message and answers its meta: what it holds of one is bounded by this memory
# (serving/runtimes/seldon_bounds.py: 20 MiB and 524,288 values a message at 256Mi)
ROUTER_RESOURCES = {"cpu": "100m", "memory": "256Mi"}


def parameter(name: str, value, kind: str) -> dict:
    """One of Seldon's typed parameters (its value always a string, as the CRD has it)."""
    return {"name": name, "value": str(value).lower() if kind == "BOOL" else str(value), "type": kind}


def container(options: SeldonCore1Options, name: str, component: str, service_type: str) -> dict:
    gpus = options.gpus if component == "Model" else 0  # the transformer and the router run no model
    return {
        "name": name,
        "image": options.image,
        "env": [
            {"name": "MODEL_NAME", "value": f"{COMPONENTS}.{component}"},
            {"name": "SERVICE_TYPE", "value": service_type},
            {"name": "GRPC_WORKERS", "value": "0"},
        ],
        "volumeMounts": [{"name": CLAIM_VOLUME, "mountPath": MOUNT, "readOnly": True}],
        "resources": container_resources(options.cpu, options.memory, gpus),
        # answered 503 until the unit's archive has loaded (the operator's default probe: the port is open)
        "readinessProbe": {"httpGet": {"path": "/health/status", "port": "http"}, "periodSeconds": 5},
    }


def model_unit(unit: Unit) -> dict:
    spec = unit.spec
    return {
        "name": unit.name,
        "type": "MODEL",
        "endpoint": {"type": "REST"},
        "parameters": [
            parameter("archive", unit.mounted, "STRING"),
            parameter("batch_size", spec.batch_size, "INT"),
            parameter("max_batch_delay", spec.max_batch_delay, "INT"),
            parameter("min_workers", spec.min_workers, "INT"),
            parameter("response_timeout", spec.response_timeout, "INT"),
        ],
    }


def router_unit(models: List[Unit], weights: List[int]) -> dict:
    children = [model_unit(m) for m in models]
    if len(models) == 2:  # the executor's own A/B router: one parameter, ratioA, or it uses 0.5
        ratio = parameter("ratioA", f"{weights[0] / 100:g}", "FLOAT")
        return {"name": ROUTER, "implementation": "RANDOM_ABTEST", "parameters": [ratio], "children": children}
    return {
        "name": ROUTER,
        "type": "ROUTER",
        "endpoint": {"type": "REST"},
        "parameters": [parameter("weights", ",".join(map(str, weights)), "STRING")],
        "children": children,
    }


def deployment(options: SeldonCore1Options, transformer: Unit, models: List[Unit], weights: List[int]) -> dict:
    below = router_unit(models, weights) if weights else model_unit(models[0])
    graph = {
        "name": TRANSFORMER,
        "type": "TRANSFORMER",
        "methods": ["TRANSFORM_INPUT", "TRANSFORM_OUTPUT"],
        "endpoint": {"type": "REST"},
        "parameters": [parameter("archive", transformer.mounted, "STRING")],
        "children": [below],
    }
    containers = [container(options, TRANSFORMER, "Transformer", "TRANSFORMER")]
    if len(weights) > 2:
        router = container(options, ROUTER, "Router", "ROUTER")
        router["volumeMounts"] = []
        router["resources"] = {"requests": dict(ROUTER_RESOURCES), "limits": dict(ROUTER_RESOURCES)}
        containers.append(router)
    containers += [container(options, m.name, "Model", "MODEL") for m in models]
    volume = {"name": CLAIM_VOLUME, "persistentVolumeClaim": {"claimName": options.claim, "readOnly": True}}
    return {
        "apiVersion": API_VERSION,
        "kind": "SeldonDeployment",
        "metadata": {"name": options.name, "namespace": options.namespace},
        "spec": {
            "protocol": "seldon",
            "transport": "rest",
            "annotations": {"seldon.io/rest-timeout": str(REST_TIMEOUT_MS)},
            "predictors": [
                {
                    "name": "default",
                    "replicas": 1,  # the claim is ReadWriteOnce: one node mounts it
                    "svcOrchSpec": {"env": [{"name": "SELDON_ENABLE_ROUTING_INJECTION", "value": "true"}]},
                    "componentSpecs": [{"spec": {"volumes": [volume], "containers": containers}}],
                    "graph": graph,
                }
            ],
        },
    }


# ---- writing ------------------------------------------------------------------------------------------
def curl_line(options: SeldonCore1Options) -> str:
    return (
        'curl -sS --fail-with-body -H "Content-Type: application/json" '
        f'"http://${{INGRESS:?{INGRESS_UNSET}}}/seldon/{options.namespace}/{options.name}/api/v1.0/predictions" '
        "--data-binary @input.json -o answer.json"
    )


def write(plan: Graph, options: SeldonCore1Options, root: Path) -> List[Path]:
    files: List[Path] = []
    units = [plan.transformer] + plan.models
    for unit in units:
        folder = root / unit.folder
        folder.mkdir(parents=True)
        core.copy_archive(unit.archive, folder / unit.archive.name)
        files.append(folder / unit.archive.name)
    manifests = {
        "seldondeployment.yaml": plan.manifest,
        "pvc.yaml": core.claim_manifest(options.claim, options.namespace, [u.archive for u in units]),
        "pvc-copy-pod.yaml": core.copy_pod(options.name, options.namespace, options.claim),
    }
    for name, document in manifests.items():
        (root / name).write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        files.append(root / name)
    recipe = dockerfile("seldon-core1-image.Dockerfile", options.image, IMAGE_DIR, options.gpus)
    requirements = seldon_requirements([u.facts for u in units])
    files += write_context(root / IMAGE_DIR, recipe, requirements)
    spec = seldon.transformer_spec(plan.transformer.facts, TRANSFORMER)
    served = seldon.entry_of(spec, None, plan.transformer.facts).served
    files += core.write_inputs(root, sample_inputs([served]))
    (root / "DEPLOY.md").write_text(deploy_md(plan, options, units), encoding="utf-8")
    files.append(root / "DEPLOY.md")
    return files


def deploy_md(plan: Graph, options: SeldonCore1Options, units: List[Unit]) -> str:
    ns, pod = f"-n {options.namespace}", f"{options.name}-copy"
    copies = [f"kubectl cp {ns} {u.folder}/{u.archive.name} {pod}:/pvc/{u.folder}/{u.archive.name}" for u in units]
    first = plan.models[0].name
    routing = {TRANSFORMER: -1, first: -1}
    if plan.weights:
        shares = ", ".join(f"{m.name} {w}%" for m, w in zip(plan.models, plan.weights))
        how = "RANDOM_ABTEST, ratioA" if len(plan.weights) == 2 else "tsctl's router component"
        router = f"the router `{ROUTER}` ({how}) sends each request to one of {shares}, and "
        routing_words = (
            f"`-1` for a unit that ran, and for the router `{ROUTER}` the index of the child that "
            f"answered (`0` is `{first}`, in the order of the graph's children)"
        )
        routing[ROUTER] = 0
    else:
        router = ""
        routing_words = f"`-1` for each unit that ran, `{TRANSFORMER}` and `{first}` (this graph has no router)"
    return (
        core.render(
            "seldon-core1",
            name=options.name,
            models=", ".join(m.name for m in plan.models),
            here_check=core.HERE_CHECK.format(folder=MODELS_DIR),
            namespace=options.namespace,
            ns=ns,
            image_dir=IMAGE_DIR,
            image=options.image,
            base_image=BASE_IMAGE,
            claim=options.claim,
            claim_size=core.claim_size([u.archive for u in units]),
            mount=MOUNT,
            uid=core.COPY_POD_UID,
            pod=pod,
            folders=" ".join(f"/pvc/{u.folder}" for u in units),
            copies=core.lines(copies),
            models_dir=MODELS_DIR,
            transformer=TRANSFORMER,
            router=router,
            pod_size=pod_size(plan.manifest),
            routing_words=routing_words,
            routing_example=json.dumps(routing, sort_keys=True),
            curl=curl_line(options),
            timeout=REST_TIMEOUT_MS,
        ).rstrip("\n")
        + "\n"
    )


__all__ = ["API_VERSION", "SeldonCore1Options", "export"]
