"""``tsctl export kserve``: the tree to copy onto a PVC, and the manifests that serve it.

    OUT/config/config.properties     the config, checked for what KServe trips on; per-model install on
    OUT/model-store/*.mar            every archive the snapshot names
    OUT/inferenceservice.yaml        v1beta1, modelFormat pytorch, storageUri, protocol, resources
    OUT/inferencegraph.yaml          with --split: a Splitter between two models (A/B)
    OUT/transformer/*.mar            with --transformer-image: the archive whose pre/post the transformer runs
    OUT/pvc.yaml                     the PersistentVolumeClaim (ReadWriteOnce, twice the archives' size, >= 2Gi)
    OUT/pvc-copy-pod.yaml            a helper pod mounting the claim, for kubectl cp (restricted Pod Security Standard)
    OUT/DEPLOY.md                    the exact commands: claim, copy, apply, ingress, request bodies, a curl per model,
                                     each relative to OUT (no path of this machine in the tree)
    OUT/inputs/                      what the request bodies are built from: a drawn picture, a golden input
    OUT/servingruntime.yaml          with --engine kserve: the tsctl engine's (Cluster)ServingRuntime (kserve_engine.py)
    OUT/predictor-image/             with --engine kserve: the build context of the runtime's image

KServe's TorchServe runtime runs ``torchserve --start --model-store=/mnt/models/model-store
--ts-config=/mnt/models/config/config.properties`` with ``TS_SERVICE_ENVELOPE=kserve|kservev2``;
the storage URI is mounted at /mnt/models. What differs by engine (``--engine``: the checks, the
predictor, more manifests and files, DEPLOY.md's steps) the engine object says (archiver/engines.py):
with ``--engine kserve`` the tsctl engine serves the same tree, and the InferenceService differs only
in naming its runtime. Every manifest is validated against KServe's CRDs first.
"""

import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import yaml

from . import crds, engines, kube, out_dir, runtimes
from .choices import KSERVE_PROTOCOLS
from .errors import UserError
from .mar import handler_record, model_config, read_manifest, rewrite_archive
from .output import quiet
from .properties import check_keys, check_store, read_properties, render, snapshot_of

NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
PVC_URI = re.compile(r"^pvc://([a-z0-9]([-a-z0-9.]*[a-z0-9])?)(/[^\s]*)?$")
PATH_SEGMENT = re.compile(r"^[A-Za-z0-9_.-]+$")  # a segment of the path inside the claim (storage_path)
COPY_POD_IMAGE = "busybox:1.36"  # has tar, which kubectl cp runs in the pod
COPY_POD_UID = 1000  # the uid KServe's TorchServe runtime runs as: the copied files are its own
MIN_CLAIM_GIB = 2


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
    runtime: str = runtimes.DEFAULT  # the torchserve-kfs image the InferenceService runs (archiver/runtimes.py)
    offline: bool = False  # bundle each archive's wheels: its per-model install needs no package index
    engine: str = "torchserve"  # a key of archiver.engines.ENGINES: what serves the tree in the pod
    image: Optional[str] = None  # the tsctl engine's image (--engine kserve), built from OUT/predictor-image
    runtime_kind: Optional[str] = None  # --engine kserve: ClusterServingRuntime (default) or ServingRuntime
    force: bool = False  # replace an OUT that holds files
    progress: Callable[[str], None] = field(default=quiet, repr=False, compare=False)  # archiver.output.Progress


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
    engine = engines.named(options.engine)
    claim, sub_path = check_options(options)
    config_path = Path(options.config)
    properties = read_properties(config_path)
    check_keys(properties, config_path)
    snapshot = snapshot_of(properties, config_path)
    engine.check_properties(properties, config_path)
    archives = check_models(snapshot, Path(options.model_store), notes, engine.envelope_batches())
    notes += memory_notes(options, snapshot)
    check_split(options, snapshot)
    transformer_archive = check_transformer(options, snapshot)
    locked = engine.prepare(options, properties, archives, notes, scratch)

    manifests = engine.manifests(options, resources(options))  # the runtime the InferenceService names first
    manifests["inferenceservice.yaml"] = inference_service(options, snapshot)
    if options.split:
        manifests["inferencegraph.yaml"] = inference_graph(options)
    for name, manifest in manifests.items():
        crds.check(manifest, name)
    curls = curl_lines(options, snapshot)
    models = served_models(options, archives)
    inputs = sample_inputs(models)
    manifests["pvc-copy-pod.yaml"] = copy_pod(options, claim)
    manifests["pvc.yaml"] = claim_manifest(options, claim, archives)

    with out_dir.written_beside(Path(options.out)) as staging:
        (staging / "config").mkdir()
        (staging / "model-store").mkdir()
        properties["model_snapshot"] = json.dumps(snapshot, separators=(",", ":"))
        files = [staging / "config" / "config.properties"]
        files[0].write_text(render(properties), encoding="utf-8")
        for archive in archives:
            target = staging / "model-store" / archive.name
            if archive in locked:
                rewrite_archive(archive, target, locked[archive])
            else:
                copy_archive(archive, target)
            files.append(target)
        files += engine.write_files(staging, options, archives)
        if transformer_archive is not None:
            (staging / "transformer").mkdir()
            copy_archive(transformer_archive, staging / "transformer" / transformer_archive.name)
            files.append(staging / "transformer" / transformer_archive.name)
        for name, manifest in manifests.items():
            (staging / name).write_text(yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
            files.append(staging / name)
        files += write_inputs(staging, inputs)
        deploy = deploy_steps(options, claim, sub_path, archives, curls, models, locked)
        (staging / "DEPLOY.md").write_text(deploy, encoding="utf-8")
        files.append(staging / "DEPLOY.md")
    return Export(out_dir.moved(files, staging, Path(options.out)), notes, curls)


# ---- checks -------------------------------------------------------------------------------------------
def runtime_notes(runtime: runtimes.Runtime) -> List[str]:
    """What the generated config asks for that the runtime's TorchServe does not do."""
    if tuple(int(part) for part in runtime.torchserve.split(".")) >= (0, 11):
        return []
    return [
        f"{runtime.name} runs TorchServe {runtime.torchserve}, which has no token authorization and ignores "
        "enable_model_api=false: its management API (port 8085 inside the pod; KServe's service exposes only "
        "the wrapper's 8080) can register and delete models"
    ]


def check_options(options: ExportOptions) -> Tuple[str, str]:
    if not NAME.match(options.name):
        raise UserError(
            f"--name {options.name!r} is not a valid InferenceService name: use lowercase letters, digits and '-', "
            "starting with a letter"
        )
    kube.label(options.namespace, "--namespace", "give the namespace the InferenceService goes in, e.g. default")
    kube.check_resources(options.cpu, options.memory)
    claim, sub_path = storage_path(options.storage_uri)
    if options.protocol not in KSERVE_PROTOCOLS:
        raise UserError(f"--protocol {options.protocol!r} must be v1 or v2")
    if options.canary is not None and not 0 <= options.canary <= 100:
        raise UserError(f"--canary {options.canary} must be a percentage from 0 to 100")
    engines.named(options.engine).check_export(options)
    return claim, sub_path


def storage_path(uri: str) -> Tuple[str, str]:
    """The claim and the path inside it of ``--storage-uri pvc://CLAIM/PATH`` (PATH "" for the claim's
    root). PATH is where DEPLOY.md copies the tree, inside the claim: segments of letters, digits, '-',
    '_' and '.', none empty (``//``: an absolute path), '.' or '..' (outside the claim); one trailing '/'
    is allowed. A one-line UserError otherwise."""
    match = PVC_URI.match(uri)
    if not match:
        raise UserError(f"--storage-uri {uri!r} must look like pvc://CLAIM/PATH")
    path = match.group(3) or ""
    path = path[:-1] if path.endswith("/") else path
    segments = path.split("/")[1:]
    bad = next((s for s in segments if s in ("", ".", "..") or not PATH_SEGMENT.match(s)), None)
    if bad is not None:
        named = {"": "an empty segment (//)", ".": "a '.' segment", "..": "a '..' segment"}
        why = named.get(bad, f"the segment {bad!r}")
        raise UserError(
            f"--storage-uri {uri!r} has {why} in its path, which DEPLOY.md would copy to: give a path inside "
            "the claim of letters, digits, '-', '_' and '.' segments, e.g. pvc://models/vision"
        )
    return match.group(1), "/".join(segments)


WORKER_BYTES = 1 << 30  # one model worker's peak RSS, rounded up: 875-956 MiB measured for resnet18 and
# all-MiniLM-L6-v2 (BENCHMARKS.md, "tsctl engine"); a bigger model needs more


def memory_notes(options: ExportOptions, snapshot: dict) -> List[str]:
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
    if kube.memory_bytes(options.memory) >= needed:
        return []
    return [
        f"the predictor runs {workers} model worker{'s' if workers != 1 else ''} in one container of --memory "
        f"{options.memory}; a worker peaks near 1 GiB (875-956 MiB measured for resnet18 and all-MiniLM-L6-v2), "
        f"so give at least --memory {workers + 1}Gi (or fewer minWorkers), more for bigger models"
    ]


def check_models(snapshot: dict, store: Path, notes: List[str], envelope_batches: bool = True) -> List[Path]:
    """Each snapshot entry's archive exists and names the same model; with ``envelope_batches`` (TorchServe
    under KServe), batch sizes safe under its envelope."""
    check_store(store)
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
            toolkit = handler_record(archive) is not None
            if envelope_batches and not toolkit and entry.get("batchSize", 1) > 1:
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
    store = Path(options.model_store)
    check_same_input(
        "--split",
        {model: kind_of(store / next(iter(models[model].values()))["marName"]) for model, _ in options.split},
    )
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
    record = handler_record(archive) or {}
    if not record.get("splits"):
        if record:
            handler, where = f"{record['module']}.{record['class']}", "MAR-INF/tsctl.json"
        else:
            handler, where = read_manifest(archive)["model"]["handler"], "MANIFEST model.handler"
        raise UserError(
            f"--transformer-archive {archive} has handler {handler!r} ({where}), whose pre/post "
            "cannot run apart from its model (preprocess must turn a request into one tensor, as image_classifier's "
            "does; the text handlers' makes a dict of token tensors): give an archive built with "
            "--handler image_classifier"
        )
    models = list(snapshot["models"])
    model = options.transformer_model or models[0]
    if model not in models:
        raise UserError(f"--transformer-model '{model}' is not in the config's model_snapshot ({', '.join(models)})")
    named = f"--transformer-model '{model}'" if options.transformer_model else f"model '{model}' (the first)"
    for entry in snapshot["models"][model].values():
        predictor = Path(options.model_store) / entry["marName"]
        if kind_of(predictor) != "tensor":
            handler = read_manifest(predictor)["model"]["handler"]
            raise UserError(
                f"{named} is served by {predictor}, whose handler is {handler!r} (MANIFEST model.handler), but the "
                "transformer sends it tensors: package the same weights with --handler tensor under another model "
                "name and pass that name as --transformer-model"
            )
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
    predictor.update(engines.named(options.engine).predictor(options, resources(options)))
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
                "command": ["python", "-m", "serving.kserve_transformer"],
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
    """A pod that mounts the claim for kubectl cp, admitted under the restricted Pod Security Standard:
    non-root uid 1000 (KServe's TorchServe runtime's own), no privilege escalation, no capabilities,
    RuntimeDefault seccomp; fsGroup makes the claim's root writable for that uid."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{options.name}-copy", "namespace": options.namespace},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": COPY_POD_UID,
                "runAsGroup": COPY_POD_UID,
                "fsGroup": COPY_POD_UID,
                "fsGroupChangePolicy": "OnRootMismatch",
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "copy",
                    "image": COPY_POD_IMAGE,
                    "command": ["sleep", "3600"],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "models", "mountPath": "/pvc"}],
                }
            ],
            "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


def disk_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def claim_size(options: ExportOptions, archives: List[Path]) -> str:
    """Twice what is copied onto the claim (room for the next version beside it), at least MIN_CLAIM_GIB."""
    paths = archives + ([Path(options.transformer_archive)] if options.transformer_archive else [])
    return f"{max(MIN_CLAIM_GIB, math.ceil(2 * sum(disk_size(p) for p in paths) / 2**30))}Gi"


def claim_manifest(options: ExportOptions, claim: str, archives: List[Path]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": options.namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": claim_size(options, archives)}},
        },
    }


def predict_path(protocol: str, model: str) -> str:
    return f"/v2/models/{model}/infer" if protocol == "v2" else f"/v1/models/{model}:predict"


@dataclass
class Served:
    """A model clients call through the InferenceService, and what its requests hold."""

    name: str
    handler: str
    kind: Optional[str]  # "image", "text", "tensor"; None for a handler of the user's own
    shape: Optional[List[int]] = None  # a tensor model's handler.input_shape
    archive: Optional[Path] = None  # the archive serving it
    sample: Optional[str] = None  # the file (relative to OUT) its request body is built from: sample_inputs()

    @property
    def input_file(self) -> str:
        return f"input-{self.kind}.json" if self.kind in ("image", "text") else f"input-{self.name}.json"


def check_same_input(flag: str, kinds: Dict[str, Optional[str]]):
    """The candidates of a split (``--split``, ``--ab``) take the same kind of input: the router sends each
    request to either, so an image to a text model would fail. Unknown kinds (a handler of your own) pass."""
    known = {model: kind for model, kind in kinds.items() if kind}
    if len(set(known.values())) > 1:
        said = ", ".join(f"{model} takes {kind}" for model, kind in known.items())
        raise UserError(
            f"{flag}: {said}; a split sends each request to either candidate, so they must take the same input: "
            "split between versions of one model"
        )


def kind_of(archive: Path) -> Optional[str]:
    """What the archive's requests hold: image, text or tensor (MAR-INF/tsctl.json); None for a handler of
    the user's own that says no more."""
    kind = (handler_record(archive) or {}).get("input")
    return kind if kind in ("image", "text", "tensor") else None


def served_models(options: ExportOptions, archives: List[Path]) -> List[Served]:
    """Each snapshot model with the kind of input its archive's handler takes; with a transformer in front,
    only the transformer's model, which takes what the transformer archive's handler reads."""
    if options.transformer_archive:
        archive = Path(options.transformer_archive)
        handler = read_manifest(archive)["model"]["handler"]
        return [Served(options.transformer_model, handler, kind_of(archive), archive=archive)]
    served: Dict[str, Served] = {}
    for archive in archives:
        model = read_manifest(archive)["model"]
        kind = kind_of(archive)
        shape = (model_config(archive).get("handler") or {}).get("input_shape") if kind == "tensor" else None
        served.setdefault(model["modelName"], Served(model["modelName"], model["handler"], kind, shape, archive))
    return list(served.values())


def snapshot_archives(options: ExportOptions, snapshot: dict) -> List[Path]:
    store = Path(options.model_store)
    return [store / entry["marName"] for versions in snapshot["models"].values() for entry in versions.values()]


# Request bodies, built by python3 from a file, a text or a shape (the variable x in the body), each command
# writing its file itself, after reading its input: a missing input is one line on stderr, and no empty body.
INPUTS_DIR = "inputs"  # OUT/inputs/: the files DEPLOY.md's request bodies are built from
SAMPLE_IMAGE = f"{INPUTS_DIR}/sample.png"
FILE_READER = (
    "import base64, json, os, sys; "
    'os.path.isfile(sys.argv[1]) or sys.exit("error: no file at " + repr(sys.argv[1]) + ": set {variable} to {what}"); '
    'x = base64.b64encode(open(sys.argv[1], "rb").read()).decode()'
)
READERS = {  # kind: (variable, python reading it into x)
    "image": ("IMAGE", FILE_READER.format(variable="IMAGE", what="an image file (JPEG, PNG, ...)")),
    "text": ("TEXT", "import json, sys; x = sys.argv[1]"),
    None: ("INPUT", FILE_READER.format(variable="INPUT", what="a file your handler reads")),
}
V1_FILE = '{"instances": [{"data": x}]}'
V1_BODIES = {"image": V1_FILE, "text": '{"instances": [x]}', None: V1_FILE}
V2_BODY = '{"inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": [x]}]}'
WRITE = 'open(sys.argv[-1], "w").write(json.dumps({body}))'


def input_command(protocol: str, model: Served) -> str:
    """A shell line writing ``model.input_file`` (from $IMAGE, $TEXT, $INPUT or $SHAPE, as the model takes)."""
    if model.kind == "tensor":
        if model.shape:
            shape = f"s = {[int(n) for n in model.shape]}"
        else:
            shape = (
                's = [int(n) for n in sys.argv[1].split()] or sys.exit("error: set SHAPE to the input shape of one '
                'row of your model, e.g. 3 224 224")'
            )
        if protocol == "v2":
            body = (
                '{"inputs": [{"name": "input-0", "shape": [1, *s], "datatype": "FP32", "data": [0.0] * math.prod(s)}]}'
            )
        else:
            body = '{"instances": [functools.reduce(lambda t, n: [t] * n, s[::-1], 0.0)]}'
        code = f"import functools, json, math, sys; {shape}; {WRITE.format(body=body)}"
        argument = "" if model.shape else '"$SHAPE" '
        return f"python3 -c '{code}' {argument}{model.input_file}"
    kind = model.kind if model.kind in READERS else None
    variable, read = READERS[kind]
    body = V2_BODY if protocol == "v2" else V1_BODIES[kind]
    return f"python3 -c '{read}; {WRITE.format(body=body)}' \"${variable}\" {model.input_file}"


def sample_png(size: int = 64) -> bytes:
    """A small RGB gradient as a PNG (zlib and struct: no image library), the image DEPLOY.md sends when it
    has none of the user's."""
    import struct
    import zlib

    rows = b"".join(b"\0" + bytes(v for x in range(size) for v in (4 * x % 256, 4 * y % 256, 128)) for y in range(size))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def golden_input(archive: Optional[Path]) -> Optional[Tuple[str, bytes]]:
    """The first golden input (package --golden) the archive answered with 200, when it is a file's bytes
    (not a JSON request body): (a file name for it, its bytes). None without one."""
    from handlers import golden

    recorded = golden.read(archive) if archive is not None else None
    for case in (recorded or {}).get("cases", []):
        if case["status"] == 200 and not case["content_type"].startswith("application/json"):
            name = re.sub(r"[^A-Za-z0-9._-]+", "_", case["name"]).strip("._-")[:64] or "input"
            return name, golden.body(case)
    return None


def sample_inputs(models: List[Served]) -> Dict[str, bytes]:
    """The files under OUT/inputs/ that the request bodies of ``models`` are built from, by path relative to
    OUT; sets each model's ``sample``. An image model gets a picture drawn here; a handler of the user's own
    the first input its golden answers were 200 for, else that picture too. Text and tensor models need none."""
    files: Dict[str, bytes] = {}
    for model in models:
        if model.kind in ("text", "tensor"):
            continue
        found = golden_input(model.archive) if model.kind is None else None
        if found:
            model.sample = f"{INPUTS_DIR}/{model.name}-{found[0]}"
            files[model.sample] = found[1]
        else:
            model.sample = SAMPLE_IMAGE
            files[SAMPLE_IMAGE] = sample_png()
    return files


def write_inputs(out: Path, files: Dict[str, bytes]) -> List[Path]:
    written = []
    for relative, data in files.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)
    return written


def curl_line(path: str, input_file: str) -> str:
    return (
        f'curl -H "Host: ${{SERVICE_HOSTNAME}}" -H "Content-Type: application/json" '
        f'"http://${{INGRESS_HOST}}:${{INGRESS_PORT}}{path}" --data-binary @{input_file}'
    )


def curl_lines(options: ExportOptions, snapshot: dict) -> List[str]:
    """One curl per model: the URL names the snapshot key (the model), the Host header the service."""
    return [
        curl_line(predict_path(options.protocol, model.name), model.input_file)
        for model in served_models(options, snapshot_archives(options, snapshot))
    ]


def input_steps(options: ExportOptions, models: List[Served]) -> List[str]:
    body = "a KServe v2 body (a BYTES tensor)" if options.protocol == "v2" else "a KServe v1 body (`instances`)"
    lines = [
        "## 5. Build the request bodies",
        "",
        f"Each file holds {body}, as the InferenceService takes it; each command says which file it lacks, if it "
        "does, and then writes nothing.",
        "",
    ]
    return lines + request_bodies(options.protocol, models)


def request_bodies(protocol: str, models: List[Served]) -> List[str]:
    """DEPLOY.md's commands writing each model's request body (``protocol`` v1 or v2), by its handler's kind,
    from the files sample_inputs() chose (call it first)."""
    lines = []
    images = [m for m in models if m.kind == "image"]
    if images:
        lines += [
            f"{', '.join(m.name for m in images)}: `{images[0].input_file}` holds the image's bytes in base64; "
            f"`{SAMPLE_IMAGE}` is a picture tsctl drew (any image works; set IMAGE to one of yours):",
            "",
            "```sh",
            f"IMAGE={images[0].sample or SAMPLE_IMAGE}",
            input_command(protocol, images[0]),
            "```",
            "",
        ]
    texts = [m for m in models if m.kind == "text"]
    if texts:
        lines += [
            f"{', '.join(m.name for m in texts)}: `{texts[0].input_file}` holds the text:",
            "",
            "```sh",
            "TEXT='A sentence to send'   # your text",
            input_command(protocol, texts[0]),
            "```",
            "",
        ]
    for model in models:
        if model.kind == "tensor" and model.shape:
            lines += [
                f"{model.name}: its handler takes tensors; `{model.input_file}` holds zeros of shape {model.shape}:",
                "",
                "```sh",
                input_command(protocol, model),
                "```",
                "",
            ]
        elif model.kind == "tensor":
            lines += [
                f"{model.name}: its handler takes tensors of its model's input shape, which its model-config.yaml "
                f"does not give (`handler.input_shape`): set SHAPE to it; `{model.input_file}` holds zeros of it:",
                "",
                "```sh",
                "SHAPE=''   # the shape of one input of your model, without the batch dimension, e.g. '3 224 224'",
                input_command(protocol, model),
                "```",
                "",
            ]
        elif model.kind not in ("image", "text"):
            lines += custom_body(protocol, model)
    return lines


def custom_body(protocol: str, model: Served) -> List[str]:
    """A handler of the user's own: what it reads is its own, so its body carries a file's bytes, in base64,
    as TorchServe's KServe envelopes hand each request to a handler (``data``), which TorchServe's own
    handlers decode. From the first golden input the archive answered 200 for, else the drawn picture."""
    if protocol == "v2":
        shape = (
            "a v2 BYTES tensor of one element, the file's bytes in base64: TorchServe's v2 envelope hands that string "
            "to the handler as the request's `data` (an FP32 tensor would reach it as nested lists, which a handler "
            "reading files refuses)"
        )
    else:
        shape = (
            '`{"instances": [{"data": ...}]}`, the file\'s bytes in base64, which the v1 envelope hands to the handler '
            "as a row"
        )
    if model.sample and model.sample != SAMPLE_IMAGE:
        source = f"`{model.sample}` is the first input its golden answers (package --golden) answered 200 for"
    else:
        source = (
            f"`{SAMPLE_IMAGE}` is a picture tsctl drew (the archive has no golden answers to take one from): set INPUT "
            f"to a file of what your handler reads, what 'tsctl predict {model.name} FILE' would send"
        )
    return [
        f"{model.name}: its handler ({model.handler}) is your own; `{model.input_file}` holds {shape}. {source}:",
        "",
        "```sh",
        f"INPUT={model.sample or SAMPLE_IMAGE}",
        input_command(protocol, model),
        "```",
        "",
    ]


INGRESS_STEPS = [
    "## 4. Determine the ingress IP and ports",
    "",
    "As in KServe's getting-started guide (an Istio ingress gateway, KServe's default): does the cluster give the",
    "gateway an external load balancer?",
    "",
    "```sh",
    "kubectl get svc istio-ingressgateway -n istio-system",
    "```",
    "",
    "If EXTERNAL-IP is set, use the load balancer (where it gives a host name rather than an IP, as on AWS,",
    "read `.status.loadBalancer.ingress[0].hostname` instead):",
    "",
    "```sh",
    "export INGRESS_HOST=$(kubectl -n istio-system get service istio-ingressgateway "
    "-o jsonpath='{.status.loadBalancer.ingress[0].ip}')",
    "export INGRESS_PORT=$(kubectl -n istio-system get service istio-ingressgateway "
    "-o jsonpath='{.spec.ports[?(@.name==\"http2\")].port}')",
    "```",
    "",
    "If it is `<none>` or stays `<pending>`, there is no load balancer: forward a local port to the gateway,",
    "in a second terminal that you leave running,",
    "",
    "```sh",
    'INGRESS_GATEWAY_SERVICE=$(kubectl get svc --namespace istio-system --selector="app=istio-ingressgateway" '
    "--output jsonpath='{.items[0].metadata.name}')",
    "kubectl port-forward --namespace istio-system svc/${INGRESS_GATEWAY_SERVICE} 8080:80",
    "```",
    "",
    "and in this one:",
    "",
    "```sh",
    "export INGRESS_HOST=localhost",
    "export INGRESS_PORT=8080",
    "```",
    "",
    "Other ingresses: with Knative's Kourier instead of Istio, the gateway is the service `kourier` in",
    "`kourier-system` (the same commands with those names, its port named `http2`); with the Gateway API",
    "(`kubectl get gateway -A`), the address and port of the Gateway KServe routes through.",
    "",
]


def port_forward_steps(options: ExportOptions) -> List[str]:
    """No ingress at all (or none you can reach): forward a local port to the serving pod itself."""
    component = "transformer" if options.transformer_image else "predictor"
    ns = f"-n {options.namespace}"
    selector = f"serving.kserve.io/inferenceservice={options.name},component={component}"
    return [
        f"Or, past any ingress (a test, or a RawDeployment without one), forward a local port to the {component}'s "
        "pod (its container serves on 8080) in a second terminal that you leave running,",
        "",
        "```sh",
        f"kubectl port-forward {ns} $(kubectl get pod {ns} -l {selector} -o name | head -n 1) 8080:8080",
        "```",
        "",
        "with INGRESS_HOST=localhost and INGRESS_PORT=8080 as above (the Host header is then not needed).",
        "",
    ]


def requirements_steps(options: ExportOptions, locked: Dict[Path, dict]) -> List[str]:
    """What the pod installs when it starts, for archives with requirements (TorchServe's per-model install)."""
    needing = []
    for archive, entries in locked.items():
        lines = [
            line
            for data in entries.values()
            if isinstance(data, bytes)
            for line in data.decode("utf-8", "replace").splitlines()
            if line.strip() and not line.startswith("-")
        ]
        if lines:
            needing.append(f"{archive.name} ({len(lines)} locked packages)")
    if not needing:
        return []
    if options.offline:
        return [
            f"When the pod starts, TorchServe installs the requirements of {', '.join(needing)} into each model's "
            "directory from the wheels inside the archive (`--offline`): no package index is needed.",
            "",
        ]
    return [
        f"When the pod starts, TorchServe installs the requirements of {', '.join(needing)} into each model's "
        "directory with pip, from the package index the image's pip uses (PyPI unless the image configures "
        "another): the cluster needs outbound access to it, and the model is READY only once the install is done. "
        "Without that access, export again with `--offline --force`: the locked wheels then go inside the archive "
        "and the install needs no index.",
        "",
    ]


HERE_CHECK = (
    'test -f DEPLOY.md -a -d {folder} || echo "error: run these commands from the directory DEPLOY.md is in" >&2'
)


def deploy_steps(
    options: ExportOptions,
    claim: str,
    sub_path: str,
    archives: List[Path],
    curls: List[str],
    models: List[Served],
    locked: Dict[Path, dict],
) -> str:
    """DEPLOY.md: every command relative to its own directory (the export can be moved or copied anywhere)."""
    pod = f"{options.name}-copy"
    ns = f"-n {options.namespace}"
    root = f"/pvc/{sub_path}".rstrip("/")
    mounted = f"{claim}/{sub_path}".rstrip("/")
    engine = engines.named(options.engine)
    lines = [
        f"# Deploying {options.name}",
        "",
        "Run every command from the directory this file is in: the paths below are relative to it. `cd` there; "
        "this says so if you are elsewhere:",
        "",
        "```sh",
        HERE_CHECK.format(folder="model-store"),
        "```",
        "",
        "You need kubectl for a cluster with KServe, and python3 for step 5."
        + (" Step 0 needs docker (or any image builder)." if options.image else "")
        + (
            f" The namespace `{options.namespace}` must exist (`kubectl create namespace {options.namespace}`)."
            if options.namespace != "default"
            else ""
        ),
        "",
        *engine.deploy_steps(options),
        "## 1. The claim",
        "",
        f"`pvc.yaml` asks for the PersistentVolumeClaim `{claim}`: {claim_size(options, archives)}, ReadWriteOnce, "
        "the cluster's default StorageClass. Skip this step if the claim exists already "
        f"(`kubectl get pvc {ns} {claim}` shows it).",
        "",
        "```sh",
        f"kubectl apply {ns} -f pvc.yaml",
        "```",
        "",
        f"## 2. Copy the tree onto the claim (KServe mounts `{mounted}` at /mnt/models)",
        "",
        f"The copy pod passes the restricted Pod Security Standard: busybox runs as uid {COPY_POD_UID}, non-root, "
        "without privilege escalation or capabilities, with the RuntimeDefault seccomp profile; `fsGroup` makes the "
        f"claim writable for it. The files it writes belong to uid {COPY_POD_UID}, the uid KServe's TorchServe "
        "runtime runs as, and are readable by everyone.",
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
        "If `mkdir` says Permission denied, the volume ignores fsGroup (some NFS and hostPath provisioners): have "
        f"the claim's directory made writable for uid {COPY_POD_UID}. Delete the pod before step 3: a ReadWriteOnce "
        "claim is attached to one node at a time.",
        "",
        "## 3. Deploy",
        "",
        *requirements_steps(options, locked),
        "```sh",
        *engine.apply_lines(options),
        f"kubectl apply {ns} -f inferenceservice.yaml",
    ]
    if options.split:
        lines.append(f"kubectl apply {ns} -f inferencegraph.yaml")
    lines += [
        f"kubectl wait {ns} --for=condition=Ready inferenceservice/{options.name} --timeout=600s",
        "```",
        "",
        *INGRESS_STEPS,
        *port_forward_steps(options),
        *input_steps(options, models),
        "## 6. Call each model",
        "",
        "The URL names the model (the model_snapshot key), not the InferenceService; the Host header names the",
        "InferenceService.",
    ]
    if options.transformer_archive:
        lines.append(
            f"With the transformer in front, the InferenceService answers for {options.transformer_model} only."
        )
    lines += [
        "",
        "```sh",
        f"SERVICE_HOSTNAME=$(kubectl get inferenceservice {options.name} {ns} "
        "-o jsonpath='{.status.url}' | cut -d/ -f3)",
        *curls,
        "```",
        "",
    ]
    if options.split:
        first = next(m for m in models if m.name == options.split[0][0])
        lines += [
            "The A/B split: the InferenceGraph sends each request to one of the two models by weight:",
            "",
            "```sh",
            f"SERVICE_HOSTNAME=$(kubectl get inferencegraph {options.name}-split {ns} "
            "-o jsonpath='{.status.url}' | cut -d/ -f3)",
            curl_line("", first.input_file),
            "```",
            "",
        ]
    return "\n".join(lines)


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
