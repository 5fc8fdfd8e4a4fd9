"""``export kserve``'s DEPLOY.md (templates/kserve*.md) and its curl lines: every command relative to the
directory DEPLOY.md is in (the export can be moved or copied anywhere)."""

from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from .. import core
from ..archive_facts import ArchiveFacts
from ..bodies import Served, request_bodies
from ..options import ExportOptions, Service, Transformer
from . import autoscale, targets
from . import canary as kserve_canary

if TYPE_CHECKING:  # pragma: no cover
    from . import storage as kserve_storage

V1_BODY = "a KServe v1 body (`instances`)"
V2_BODY = "a KServe v2 body (a BYTES tensor)"


def predict_path(protocol: str, model: str) -> str:
    return f"/v2/models/{model}/infer" if protocol == "v2" else f"/v1/models/{model}:predict"


def curl_line(path: str, input_file: str) -> str:
    return (
        f'curl -H "Host: ${{SERVICE_HOSTNAME}}" -H "Content-Type: application/json" '
        f'"http://${{INGRESS_HOST}}:${{INGRESS_PORT}}{path}" --data-binary @{input_file}'
    )


def curl_lines(protocol: str, served: List[Served]) -> List[str]:
    """One curl per model: the URL names the snapshot key (the model), the Host header the service."""
    return [curl_line(predict_path(protocol, model.name), model.input_file) for model in served]


def deploy_md(
    options: ExportOptions,
    target: targets.Target,
    storage: "kserve_storage.Storage",
    archives: List[ArchiveFacts],
    transformer: Optional[Transformer],
    curls: List[str],
    models: List[Served],
    locked: Dict[Path, dict],
    plan: autoscale.Autoscaling,
    config_files: Sequence[str] = ("config.properties",),
) -> str:
    """DEPLOY.md (templates/kserve.md), from the flags that shape its steps (``options``: --image, --offline,
    --split, --canary; the target's own); ``models``: the served models, their sample inputs chosen; ``plan``:
    the autoscaling (--autoscale), its files applied in step 3 and its numbers in a section of their own;
    ``config_files``: what OUT/config holds, copied in step 2; ``storage``: where the tree goes (steps 1 and 2)."""
    service, flags = options.service, options.target_flags
    ns = service.ns
    component = "transformer" if transformer else "predictor"
    paths = [archive.path for archive in archives]
    text = core.render(
        "kserve",
        name=service.name,
        here_check=core.HERE_CHECK.format(folder="model-store"),
        needs=needs(bool(options.image), service),
        image_steps=target.image_steps(flags),
        storage_steps=storage.steps(service, paths, transformer.facts.path if transformer else None, config_files),
        ns=ns,
        requirements=requirements_steps(options.offline, locked),
        apply=core.lines(apply_lines(service, options.canary, bool(options.split), target.apply_lines(flags), plan)),
        component=component,
        selector=f"serving.kserve.io/inferenceservice={service.name},component={component}",
        body=V2_BODY if service.protocol == "v2" else V1_BODY,
        bodies=request_bodies(service.protocol, models),
        transformer_note=transformer_note(transformer),
        curls=core.lines(curls),
        split=split_section(service, options.split, models),
        autoscale=plan.mode.section(plan, ns),
        canary=kserve_canary.section(service, options.canary, archives, 7 + plan.mode.deploy_steps),
    )
    return text.rstrip("\n") + "\n"


def needs(image: bool, service: Service) -> str:
    """What the reader needs beyond kubectl and python3: docker for an image, a namespace of their own."""
    text = " Step 0 needs docker (or any image builder)." if image else ""
    if service.namespace != "default":
        text += f" The namespace `{service.namespace}` must exist (`kubectl create namespace {service.namespace}`)."
    return text


def apply_lines(
    service: Service, canary: Optional[int], split: bool, target_lines: List[str], plan: autoscale.Autoscaling
) -> List[str]:
    """Step 3's commands: the autoscaling's prerequisites, the target's own, the InferenceService (and graph,
    and the autoscaling's disruption budget and monitor), then the wait."""
    ns = service.ns
    applied = plan.mode.prerequisites(plan) + target_lines
    applied += [f"kubectl apply {ns} -f {kserve_canary.first_manifest(canary)}"]
    if split:
        applied.append(f"kubectl apply {ns} -f inferencegraph.yaml")
    applied += plan.mode.apply_lines(plan, ns)
    return applied + [f"kubectl wait {ns} --for=condition=Ready inferenceservice/{service.name} --timeout=600s"]


def requirements_steps(offline: bool, locked: Dict[Path, dict]) -> str:
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
        return ""
    section = "kserve-requirements-offline" if offline else "kserve-requirements"
    return core.render(section, needing=", ".join(needing))


def transformer_note(transformer: Optional[Transformer]) -> str:
    if transformer is None:
        return ""
    return f"\nWith the transformer in front, the InferenceService answers for {transformer.model} only."


def split_section(service: Service, split: List[Tuple[str, int]], models: List[Served]) -> str:
    """The A/B split's call through the InferenceGraph (``--split``), else nothing."""
    if not split:
        return ""
    first = next(m for m in models if m.name == split[0][0])
    return core.render("kserve-split", name=service.name, ns=service.ns, curl=curl_line("", first.input_file))
