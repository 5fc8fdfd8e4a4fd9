"""What ``tsctl export kserve --engine NAME`` writes for the runtime that serves the tree in the pod: a
``Target`` per runtime, asked by archiver/export/kserve/export.py, never compared by name.

    TARGETS = {"torchserve": TorchServeTarget(), "tsctl": TsctlTarget()}

A target checks the export's flags (``check_export``, ``export_flags``) and the config
(``check_properties``), prepares the archives (``prepare``: their locked requirements, the exported
config's changes), gives the InferenceService's predictor (``predictor``), more manifests beside it
(``manifests``), more files (``write_files``: an image's build context) and DEPLOY.md's steps of its own
(``image_steps``, ``apply_lines``), and for ``--autoscale`` the pod's ports (``ports``: readiness, metrics)
and whether the engine exports the in-flight gauge KEDA scales on (``exports_load_gauge``). MLServer has no KServe
target: ``tsctl export seldon`` exports it.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ... import engines
from ...engines.base import refuse
from ...errors import UserError
from ..archive_facts import ArchiveFacts
from ..options import TargetFlags

if TYPE_CHECKING:  # pragma: no cover
    from ...kserve_images import KServeImage

# The optional flags of ``tsctl export kserve`` that not every target takes: option name -> the flag as typed.
EXPORT_FLAGS = {
    "image": "--image",
    "runtime_kind": "--runtime-kind",
    "auto_select": "--auto-select",
    "priority": "--priority",
    "offline": "--offline",
}
ELSEWHERE = {"mlserver": "is exported for Seldon Core 2: run 'tsctl export seldon OUT' instead"}
TREE_PENDING = "sha256:" + "f" * 64  # the tree's digest, pinned once the tree is written (kserve_storage.pinned)
MOUNT = "/mnt/models"  # where KServe mounts the storage URI in the predictor's pod
# torchserve-kfs's entrypoint (kserve's wrapper Dockerfile, ../shared/kserve/wrapper): it evals the runtime's
# args (torchserve --start ...), then starts KServe's wrapper
TORCHSERVE_ENTRYPOINT = "/usr/local/bin/dockerd-entrypoint.sh"


@dataclass
class Ports:
    """The pod's ports ``--autoscale`` points at: ``ready`` serves /ping (200 only once every worker of every
    model is up), ``metrics`` serves /metrics."""

    ready: int
    metrics: int
    metrics_declared: bool  # the pod's container declares the metrics port (a PodMonitor needs it to)


def address_port(properties: Dict[str, str], key: str, default: int) -> int:
    """The port of a config.properties address (``http://0.0.0.0:8085``), else ``default``."""
    port = properties.get(key, "").rstrip("/").rpartition(":")[2]
    return int(port) if port.isdigit() else default


class Target:
    """What one runtime needs in a KServe export; see the module docstring."""

    name = ""  # the runtime's name (archiver/engines), the --engine value
    title = ""  # what messages call it
    export_flags: Tuple[str, ...] = ()  # keys of EXPORT_FLAGS it takes

    def check_export(self, flags: TargetFlags):
        given = {key: getattr(flags, key) for key in EXPORT_FLAGS}
        refuse(self.name, self.title, self.export_flags, given, EXPORT_FLAGS, flag_owners, "export")

    def check_properties(self, properties: Dict[str, str], path: Path):
        """What the exported config must say under KServe (UserError naming the key), the same for TorchServe
        and the tsctl engine, which read it alike: TS_SERVICE_ENVELOPE, which KServe sets, only with
        enable_envvars_config=true (TorchServe 0.12's ConfigManager, serving/config_properties.py: with_environment)."""
        expected = {
            "disable_token_authorization": ("true", "KServe's requests carry no TorchServe token"),
            "enable_envvars_config": ("true", "KServe's TS_SERVICE_ENVELOPE is ignored without it"),
        }
        check_values(properties, path, expected)
        if properties.get("enable_model_api", "").lower() not in ("true", "false"):
            raise UserError(
                f"{path}: set enable_model_api explicitly (TorchServe 0.11+ turns it off by default); "
                "regenerate it with 'tsctl config'"
            )

    def envelope_batches(self) -> bool:
        """True when archives of handlers that are not the toolkit's run inside TorchServe's KServe
        envelope, which answers every request of a batch of several with 503 (export sets batchSize 1):
        on TorchServe and on the tsctl engine alike, whose workers are TorchServe's and get the envelope
        KServe's TS_SERVICE_ENVELOPE names (ts/model_loader.py wraps the handler in it)."""
        return True

    def archive_notes(self, config: dict, where: str) -> List[str]:
        """Notes on an archive's model-config.yaml keys this runtime serves otherwise than TorchServe 0.12
        (UserError for one it cannot serve): none on TorchServe itself."""
        return []

    def prepare(self, flags, properties: Dict[str, str], archives: List[ArchiveFacts], notes: List[str], scratch: Path):
        """Change the exported config for this runtime; return {archive: its requirements.txt for the
        image} for the archives to rewrite with locked requirements (the others are copied as they are)."""
        return {}

    def export_notice(self, flags: TargetFlags) -> Optional[str]:
        """A line to print before a slow export (resolving requirements), if any."""
        return None

    def predictor(self, flags: TargetFlags, resources: dict, storage_uri: str) -> dict:
        """The InferenceService's ``spec.predictor`` entries serving the storage URI's tree."""
        raise NotImplementedError

    def manifests(self, flags: TargetFlags, resources: dict) -> Dict[str, dict]:
        """More manifests to write beside inferenceservice.yaml, by file name (validated first)."""
        return {}

    def write_files(self, out: Path, flags: TargetFlags, archives: List[ArchiveFacts]) -> List[Path]:
        """More files for the export (an image's build context)."""
        return []

    def image_steps(self, flags: TargetFlags) -> str:
        """DEPLOY.md's section before the claim (step 0: building an image), if any."""
        return ""

    def apply_lines(self, flags: TargetFlags) -> List[str]:
        """DEPLOY.md's commands of step 3 before the InferenceService is applied."""
        return []

    def ports(self, properties: Dict[str, str]) -> Ports:
        raise NotImplementedError

    def exports_load_gauge(self) -> bool:
        """Whether /metrics has ts_requests_in_flight (docs/engines.md, "The signal to scale on")."""
        return False


def check_values(properties: Dict[str, str], path: Path, expected: Dict[str, Tuple[str, str]]):
    for key, (value, why) in expected.items():
        if properties.get(key, "").lower() != value:
            raise UserError(f"{path}: {key} must be {value} ({why}); regenerate it with 'tsctl config'")


def storage_model(protocol: str, storage_uri: str, resources: dict, runtime: Optional[str] = None) -> dict:
    """``predictor.model`` for the tree: KServe picks the runtime for modelFormat pytorch (its TorchServe
    runtime) unless ``runtime`` names one; the tree's digest in ``TSCTL_TREE_DIGEST``, which the tsctl engine
    checks the tree against (TorchServe's runtime checks it with ``tree_check_command``)."""
    from serving.tree_digests import ENVIRONMENT

    model = {"modelFormat": {"name": "pytorch"}}
    if runtime:
        model["runtime"] = runtime
    model.update({"protocolVersion": protocol, "storageUri": storage_uri, "resources": resources})
    model["env"] = [{"name": ENVIRONMENT, "value": TREE_PENDING}]
    return model


# ---- KServe's own TorchServe runtime (modelFormat pytorch) ---------------------------------------------
class TorchServeTarget(Target):
    """TorchServe as KServe's TorchServe runtime runs it: the tree alone, requirements installed per model."""

    name = "torchserve"
    title = "TorchServe"
    export_flags = ("offline",)

    def export_notice(self, flags: TargetFlags) -> Optional[str]:
        what = "resolving and downloading" if flags.offline else "resolving"
        return f"{what} each archive's requirements for {flags.runtime} ..."

    def prepare(self, flags, properties, archives, notes, scratch):
        from ... import kserve_images

        # tsctl config leaves TorchServe's per-model install off (the local environment has the packages);
        # KServe's image has not: the exported config turns it on, for the requirements locked here.
        properties["install_py_dep_per_model"] = "true"
        runtime = kserve_images.runtime_named(flags.runtime)
        notes.extend(runtime_notes(runtime))
        return kserve_images.for_runtime(archives, runtime, flags.offline, scratch, notes, flags.progress)

    def predictor(self, flags: TargetFlags, resources: dict, storage_uri: str) -> dict:
        """KServe's TorchServe runtime; with --gpus its image's CUDA build (torchserve-kfs:VERSION-gpu)."""
        from ... import kserve_images

        model = storage_model(flags.service.protocol, storage_uri, resources)
        if flags.gpus:
            model["runtimeVersion"] = f"{kserve_images.runtime_named(flags.runtime).torchserve}-gpu"
        model["command"] = tree_check_command()
        return {"model": model}

    def ports(self, properties: Dict[str, str]) -> Ports:
        """TorchServe's own /ping on its inference address (KServe's wrapper on 8080 says ready once one worker
        of a model is, kserve_wrapper/TorchserveModel.py; TorchServe 0.12's /ping once every model has its
        minWorkers healthy, ApiUtils.isModelHealthy), and its metrics address, as the exported config says."""
        return Ports(  # KServe gives the predictor's container one port, 8080 (its wrapper's): not these
            address_port(properties, "inference_address", 8085),
            address_port(properties, "metrics_address", 8082),
            False,
        )


def tree_check_command() -> List[str]:
    """The predictor's command under KServe's TorchServe runtime: the tree checked against its pinned digest
    (serving/tree_digests.py, run as it is: the source is ``$0`` of ``sh -c``), then the image's own
    entrypoint with the runtime's args, which KServe appends (``"$@"``: torchserve --start ...). A tree that
    is not the one exported stops the container before TorchServe starts, the file named in its log."""
    from serving import tree_digests

    check = f'python -c "$0" {MOUNT} {TREE_PENDING} && exec {TORCHSERVE_ENTRYPOINT} "$@"'
    return ["sh", "-c", check, Path(tree_digests.__file__).read_text(encoding="utf-8")]


def runtime_notes(runtime: "KServeImage") -> List[str]:
    """What the generated config asks for that the runtime's TorchServe does not do."""
    if tuple(int(part) for part in runtime.torchserve.split(".")) >= (0, 11):
        return []
    return [
        f"{runtime.name} runs TorchServe {runtime.torchserve}, which has no token authorization and ignores "
        "enable_model_api=false: its management API (port 8085 inside the pod; KServe's service exposes only "
        "the wrapper's 8080) can register and delete models; --runtime torchserve-kfs:0.12.0 or --engine tsctl "
        "keeps it closed"
    ]


# ---- the tsctl engine: a ServingRuntime for its image, and an InferenceService naming it ---------------
class TsctlTarget(Target):
    """The tsctl engine from an image of the export's own (archiver/export/kserve/tsctl_image.py)."""

    name = "tsctl"
    title = "tsctl engine"
    export_flags = ("image", "runtime_kind", "auto_select", "priority")

    def check_export(self, flags: TargetFlags):
        super().check_export(flags)
        if not flags.image:
            raise UserError(
                f"--engine {self.name} needs --image REGISTRY/NAME:TAG: the image you build from the export"
            )
        from . import tsctl_image

        tsctl_image.check_runtime_kind(flags.runtime_kind)
        tsctl_image.check_selection(flags)

    def archive_notes(self, config: dict, where: str) -> List[str]:
        """The engine's notes on the keys it does not do (serving/model_config_keys.py), as it logs them at load."""
        from serving import model_config_keys

        try:
            return model_config_keys.check(config, where)
        except model_config_keys.ModelConfigRefused as exc:
            raise UserError(str(exc)) from None

    def check_properties(self, properties: Dict[str, str], path: Path):
        super().check_properties(properties, path)
        from . import tsctl_image

        tsctl_image.check_ports(properties, path)

    def prepare(self, flags, properties, archives, notes, scratch):
        from . import tsctl_image

        tsctl_image.requirements(archives)  # every archive's requirement lines checked before anything is written
        notes.extend(tsctl_image.selection_notes(flags))
        return {}

    def predictor(self, flags: TargetFlags, resources: dict, storage_uri: str) -> dict:
        """With --auto-select, the TorchServe export's predictor as it is but its tree check command (which runs
        KServe's TorchServe image's entrypoint): KServe picks the runtime, and the tree is checked when the tsctl
        engine serves it."""
        from . import tsctl_image

        named = None if flags.auto_select else tsctl_image.runtime_name(flags)
        return {"model": storage_model(flags.service.protocol, storage_uri, resources, named)}

    def manifests(self, flags: TargetFlags, resources: dict) -> Dict[str, dict]:
        from . import tsctl_image

        return {tsctl_image.RUNTIME_FILE: tsctl_image.serving_runtime(flags, resources)}

    def write_files(self, out: Path, flags: TargetFlags, archives: List[ArchiveFacts]) -> List[Path]:
        from . import tsctl_image

        return tsctl_image.write_image_context(out, flags.image, archives, flags.gpus)

    def image_steps(self, flags: TargetFlags) -> str:
        from . import tsctl_image

        return tsctl_image.build_steps(flags)

    def apply_lines(self, flags: TargetFlags) -> List[str]:
        from . import tsctl_image

        return tsctl_image.apply_lines(flags)

    def ports(self, properties: Dict[str, str]) -> Ports:
        """The engine's one HTTP port serves /ping (every worker up) and /metrics (docs/engines.md)."""
        from . import tsctl_image

        return Ports(tsctl_image.HTTP_PORT, tsctl_image.HTTP_PORT, True)  # the runtime declares its containerPort

    def exports_load_gauge(self) -> bool:
        return True


TARGETS: Dict[str, Target] = {target.name: target for target in (TorchServeTarget(), TsctlTarget())}


def flag_owners(key: str) -> List[str]:
    """The targets that take the export flag ``key``."""
    return [target.name for target in TARGETS.values() if key in target.export_flags]


def named(name: str) -> Target:
    """The target of the runtime called ``name`` (or an alias of it), else one UserError: an unknown
    runtime, or one exported another way."""
    canonical = engines.ALIASES.get(name, name)
    target = TARGETS.get(canonical)
    if target is not None:
        return target
    runtime = engines.named(name)  # an unknown name: the runtimes it must be one of
    raise UserError(f"--engine {runtime.name} {ELSEWHERE.get(runtime.name, 'has no KServe export')}")
