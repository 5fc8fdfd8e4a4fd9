"""``export kserve``'s DEPLOY.md (templates/kserve*.md) and its curl lines: every command relative to the
directory DEPLOY.md is in (the export can be moved or copied anywhere)."""

from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Sequence

from .. import core
from ..bodies import Served, request_bodies
from ..options import ExportOptions
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


def curl_lines(options: ExportOptions, served: List[Served]) -> List[str]:
    """One curl per model: the URL names the snapshot key (the model), the Host header the service."""
    return [curl_line(predict_path(options.protocol, model.name), model.input_file) for model in served]


def deploy_md(
    options: ExportOptions,
    storage: "kserve_storage.Storage",
    archives: List[Path],
    curls: List[str],
    models: List[Served],
    locked: Dict[Path, dict],
    plan: autoscale.Autoscaling,
    config_files: Sequence[str] = ("config.properties",),
) -> str:
    """DEPLOY.md (templates/kserve.md); ``models``: the served models, their sample inputs chosen; ``plan``: the
    autoscaling (--autoscale), its files applied in step 3 and its numbers in a section of their own;
    ``config_files``: what OUT/config holds, copied in step 2; ``storage``: where the tree goes (steps 1 and 2)."""
    ns = f"-n {options.namespace}"
    target = targets.named(options.engine)
    component = "transformer" if options.transformer_image else "predictor"
    text = core.render(
        "kserve",
        name=options.name,
        here_check=core.HERE_CHECK.format(folder="model-store"),
        needs=needs(options),
        image_steps=target.image_steps(options),
        storage_steps=storage.steps(options, archives, config_files),
        ns=ns,
        requirements=requirements_steps(options, locked),
        apply=core.lines(apply_lines(options, target, ns, plan)),
        component=component,
        selector=f"serving.kserve.io/inferenceservice={options.name},component={component}",
        body=V2_BODY if options.protocol == "v2" else V1_BODY,
        bodies=request_bodies(options.protocol, models),
        transformer_note=transformer_note(options),
        curls=core.lines(curls),
        split=split_section(options, models, ns),
        autoscale=plan.mode.section(plan, options, ns),
        canary=kserve_canary.section(options, archives, 7 + plan.mode.deploy_steps),
    )
    return text.rstrip("\n") + "\n"


def needs(options: ExportOptions) -> str:
    """What the reader needs beyond kubectl and python3: docker for an image, a namespace of their own."""
    text = " Step 0 needs docker (or any image builder)." if options.image else ""
    if options.namespace != "default":
        text += f" The namespace `{options.namespace}` must exist (`kubectl create namespace {options.namespace}`)."
    return text


def apply_lines(options: ExportOptions, target: targets.Target, ns: str, plan: autoscale.Autoscaling) -> List[str]:
    """Step 3's commands: the autoscaling's prerequisites, the target's own, the InferenceService (and graph,
    and the autoscaling's disruption budget and monitor), then the wait."""
    applied = plan.mode.prerequisites(plan) + target.apply_lines(options)
    applied += [f"kubectl apply {ns} -f {kserve_canary.first_manifest(options)}"]
    if options.split:
        applied.append(f"kubectl apply {ns} -f inferencegraph.yaml")
    applied += plan.mode.apply_lines(plan, ns)
    return applied + [f"kubectl wait {ns} --for=condition=Ready inferenceservice/{options.name} --timeout=600s"]


def requirements_steps(options: ExportOptions, locked: Dict[Path, dict]) -> str:
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
    section = "kserve-requirements-offline" if options.offline else "kserve-requirements"
    return core.render(section, needing=", ".join(needing))


def transformer_note(options: ExportOptions) -> str:
    if not options.transformer_archive:
        return ""
    return f"\nWith the transformer in front, the InferenceService answers for {options.transformer_model} only."


def split_section(options: ExportOptions, models: List[Served], ns: str) -> str:
    """The A/B split's call through the InferenceGraph (``--split``), else nothing."""
    if not options.split:
        return ""
    first = next(m for m in models if m.name == options.split[0][0])
    return core.render("kserve-split", name=options.name, ns=ns, curl=curl_line("", first.input_file))
