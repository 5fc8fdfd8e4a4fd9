"""``export seldon``'s DEPLOY.md (templates/seldon*.md) and its curl lines: every command relative to the
directory DEPLOY.md is in, from the image build to one curl per model."""

from typing import List, Optional

from serving.frontend_settings import Frontend

from ... import mlserver
from .. import core, model_image
from ..bodies import Served, request_bodies
from ..options import SeldonOptions
from . import mirror
from .image import BASE_IMAGE, IMAGE_DIR
from .plan import (
    AGENT_PORTS,
    CAPABILITIES,
    MODELS_DIR,
    MOUNT,
    RUNTIME_PATH,
    SERVER_CONFIG,
    SERVER_POD_LABEL,
    SeldonPlan,
)


def curl_line(seldon_model: str, path_name: str, input_file: str, show_headers: bool = False) -> str:
    return (
        f'curl{" -i" if show_headers else ""} -H "Content-Type: application/json" -H "seldon-model: {seldon_model}" '
        f'"http://${{MESH_IP}}/v2/models/{path_name}/infer" --data-binary @{input_file}'
    )


def curl_lines(options: SeldonOptions, plan: SeldonPlan) -> List[str]:
    """One curl per model, then the experiment's and the pipeline's."""
    lines = [curl_line(entry.name, entry.name, entry.served.input_file) for entry in plan.entries]
    if plan.experiment:
        lines.append(curl_line(f"{plan.experiment}.experiment", plan.experiment, served_input(plan, options), True))
    if plan.pipeline:
        lines.append(curl_line(f"{plan.pipeline}.pipeline", plan.pipeline, plan.transformers[0].served.input_file))
    return lines


def served_input(plan: SeldonPlan, options: SeldonOptions) -> str:
    """The request body of the experiment's first candidate (a mirror's own experiment: its default model)."""
    first = options.ab[0][0] if options.ab else options.default
    return next(e for e in plan.entries if e.name == first).served.input_file


def served_models(plan: SeldonPlan) -> List[Served]:
    """The models DEPLOY.md builds request bodies for: each Model, and the pipeline's first step when its
    requests differ from theirs."""
    served = [entry.served for entry in plan.entries]
    if plan.transformers and all(s.input_file != plan.transformers[0].served.input_file for s in served):
        served.append(plan.transformers[0].served)
    return served


def storage_steps(options: SeldonOptions, plan: SeldonPlan, image_digest: Optional[str]) -> str:
    """Steps 2 and 3: models/ onto the claim, or the model image pushed (``--storage oci``)."""
    ns, pod = f"-n {options.namespace}", f"{options.server}-copy"
    if options.model_image:
        return core.render(
            "seldon-storage-oci",
            models_dir=MODELS_DIR,
            image_digest=image_digest,
            mount=MOUNT,
            registry=model_image.registry_of(options.image_ref),
            tag=model_image.tag_of(options.image_ref),
            image_ref=options.image_ref,
        )
    entries = plan.entries + plan.transformers
    copies = [
        f"kubectl cp {ns} {MODELS_DIR}/{entry.name}/{file} {pod}:/pvc/{MODELS_DIR}/{entry.name}/{file}"
        for entry in entries
        for file in (entry.archive.name, mlserver.MODEL_SETTINGS)
    ]
    return core.render(
        "seldon-storage-pvc",
        claim=options.claim,
        claim_size=core.claim_size([entry.archive for entry in entries]),
        ns=ns,
        mount=MOUNT,
        uid=core.COPY_POD_UID,
        pod=pod,
        models_dir=MODELS_DIR,
        folders=" ".join(f"/pvc/{MODELS_DIR}/{e.name}" for e in entries),
        copies=core.lines(copies),
    )


def deploy_md(
    options: SeldonOptions, plan: SeldonPlan, served: List[Served], image_digest: Optional[str] = None
) -> str:
    """DEPLOY.md (templates/seldon.md); ``served``: served_models(plan), their sample inputs chosen
    (bodies.sample_inputs); ``image_digest``: the model image's, with ``--storage oci``."""
    ns = f"-n {options.namespace}"
    curls = curl_lines(options, plan)
    text = core.render(
        "seldon",
        models=", ".join(e.name for e in plan.entries),
        here_check=core.HERE_CHECK.format(folder=MODELS_DIR),
        namespace=options.namespace,
        server_config=SERVER_CONFIG,
        image_dir=IMAGE_DIR,
        image=options.image,
        base_image=BASE_IMAGE,
        implementation=mlserver.IMPLEMENTATION,
        runtime_path=RUNTIME_PATH,
        storage_steps=storage_steps(options, plan, image_digest),
        ns=ns,
        mount=MOUNT,
        models_dir=MODELS_DIR,
        server=options.server,
        capabilities=", ".join(CAPABILITIES),
        ports=", ".join(map(str, AGENT_PORTS)),
        waits=core.lines(wait_lines(plan, ns)),
        bodies=request_bodies("v2", served),
        curls=core.lines(curls[: len(plan.entries)]),
        experiment=experiment_section(options, plan, curls),
        mirror=mirror.section(options, plan),
        pipeline=pipeline_section(options, plan, curls),
        pod_label=SERVER_POD_LABEL,
        limit=f"{Frontend().max_request_size:,}",
    )
    return text.rstrip("\n") + "\n"


def wait_lines(plan: SeldonPlan, ns: str) -> List[str]:
    """Step 4's commands after models.yaml: a wait per Model, then the experiment's and the pipeline's."""
    entries = plan.entries + plan.transformers
    lines = [f"kubectl wait {ns} --for condition=ready --timeout=600s model/{e.name}" for e in entries]
    for kind, name in (("experiment", plan.experiment), ("pipeline", plan.pipeline)):
        if name:
            lines += [
                f"kubectl apply {ns} -f {kind}.yaml",
                f"kubectl wait {ns} --for condition=ready --timeout=300s {kind}/{name}",
            ]
    return lines


def experiment_section(options: SeldonOptions, plan: SeldonPlan, curls: List[str]) -> str:
    """How to call the A/B experiment, and keep a client on the model that answered; '' without one."""
    if not plan.experiment or not options.ab:  # a mirror's own experiment: mirror.section
        return ""
    route = curl_line(f"{plan.experiment}.experiment", plan.experiment, served_input(plan, options))
    return core.render(
        "seldon-experiment",
        experiment=plan.experiment,
        weights=", ".join(f"{name} {weight}" for name, weight in options.ab),
        total=sum(weight for _, weight in options.ab),
        default=options.default,
        curl=curls[len(plan.entries)],
        route_curl=route,
    )


def pipeline_section(options: SeldonOptions, plan: SeldonPlan, curls: List[str]) -> str:
    """How to call the transformer's pipeline; '' without one."""
    if not plan.pipeline:
        return ""
    split = options.transformer_model == plan.experiment
    return core.render(
        "seldon-pipeline",
        pipeline=plan.pipeline,
        pre=plan.transformers[0].name,
        archive=plan.transformers[0].archive.name,
        model=plan.pipeline_model,
        split_note=f", whose calls the experiment `{plan.experiment}` splits between its candidates" if split else "",
        post=plan.transformers[1].name,
        curl=curls[-1],
    )
