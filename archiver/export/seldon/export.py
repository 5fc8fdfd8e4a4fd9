"""``tsctl export seldon``: a model store as Seldon Core 2 serves it, on MLServer with tsctl's runtime.

    OUT/models/NAME/NAME.mar              each model's archive (the default version of each model)
    OUT/models/NAME/model-settings.json   archiver.mlserver.model_settings: implementation
                                          serving.runtimes.mlserver_runtime.ArchiveModel, uri ./NAME.mar
    OUT/models/T-pre/, OUT/models/T-post/ with --transformer-archive: the transformer's archive twice, its
                                          settings' parameters.extra.role "preprocess" and "postprocess"
                                          (serving/runtimes/mlserver_runtime.py), T = the archive's model name
    OUT/server.yaml                       a Server on the mlserver ServerConfig: the image built from
                                          server-image/, the claim mounted read-only into its rclone container
    OUT/models.yaml                       one Model per folder: storageUri /var/models/models/NAME,
                                          requirements [tsctl, pvc] (only this Server advertises both)
    OUT/experiment.yaml                   with --ab: an Experiment (A/B) between models of the store; with
                                          --mirror, the model it shadows (seldon/mirror.py)
    OUT/experiment-promote.yaml           with --mirror: the promotion, after tsctl shadow passes
    OUT/pipeline.yaml                     with --transformer-archive: a Pipeline T-pre -> model -> T-post
    OUT/networkpolicy.yaml                a NetworkPolicy: other pods reach the Server's pods only on the agent's
                                          ports (its proxies, its metrics), never MLServer's own (network_policy)
    OUT/pvc.yaml, OUT/pvc-copy-pod.yaml   the claim and a pod to copy models/ onto it (core.py, as export kserve's)
    OUT/server-image/                     the server image's build context: python:X.Y-slim, MLServer, the
                                          archives' requirements, the handlers package at /opt/tsctl
    OUT/DEPLOY.md                         every command, from the image build to one curl per model (relative to OUT)
    OUT/inputs/                           what the request bodies are built from (bodies.py: sample_inputs)

The manifests are seldon/manifests.py, the image seldon/image.py, DEPLOY.md seldon/deploy.py.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

from serving import config_properties, frontend_settings, ts_config

from ... import mlserver
from ...errors import UserError
from .. import archive_facts, core, crds, model_image, out_dir
from ..archive_facts import ArchiveFacts
from ..bodies import sample_inputs
from ..kube import label, suggest
from ..options import SeldonOptions
from . import mirror as seldon_mirror
from .deploy import curl_lines, deploy_md, served_models
from .image import IMAGE_DIR, requirements, write_image_context
from .manifests import API_VERSION, experiment_manifest, model, network_policy, pipeline_manifest, server, server_memory
from .plan import AGENT_VOLUME_BYTES, MODELS_DIR, SERVER_CONFIG, Entry, SeldonPlan, check_shared_flags

__all__ = ["API_VERSION", "SeldonOptions", "export", "parse_ab", "model", "server"]


@dataclass
class SeldonExport:
    files: List[Path]
    notes: List[str]
    curls: List[str]


def parse_ab(values) -> List[Tuple[str, int]]:
    """``--ab MODEL=WEIGHT`` values as pairs; a UserError for one that is not that."""
    pairs = []
    for value in values:
        if "," in value or " " in value.strip():
            raise UserError(
                f"--ab {value!r} names several candidates: give each its own --ab, e.g. --ab a=90 --ab b=10"
            )
        model, sep, weight = value.rpartition("=")
        if not sep or not model or not (weight.isascii() and weight.isdigit()) or int(weight) < 1:
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
def check(options: SeldonOptions) -> SeldonPlan:
    notes: List[str] = []
    check_out(options)
    check_flags(options)
    specs = default_versions(options, notes)
    entries = [entry_of(spec) for spec in specs]
    names = [entry.name for entry in entries]
    experiment = seldon_mirror.check(options, entries, check_ab(options, names), notes)
    if options.ab:
        archives = {entry.name: entry.facts for entry in entries}
        notes += core.check_same_input("--ab", {model: archives[model] for model, _ in options.ab})
    transformers, pipeline, pipeline_model = check_transformer(options, entries, experiment, notes)
    all_entries = entries + transformers
    requirements([entry.facts for entry in all_entries], False)  # each line checked when it was read
    notes += size_notes(options, all_entries)
    manifests = {
        "server.yaml": [server(options, len(all_entries))],
        "models.yaml": [model(options, entry.name) for entry in all_entries],
    }
    if experiment:
        manifests["experiment.yaml"] = [experiment_manifest(options, experiment)] if options.ab else []
    if options.mirror:  # the mirror, and the promotion tsctl shadow gates (seldon/mirror.py)
        manifests.update(seldon_mirror.manifests(options, experiment, (manifests["experiment.yaml"] or [None])[0]))
    if pipeline:
        manifests["pipeline.yaml"] = [pipeline_manifest(options, pipeline, transformers, pipeline_model)]
    for name, documents in manifests.items():
        for document in documents:
            crds.check(document, name)
    manifests["networkpolicy.yaml"] = [network_policy(options)]
    if not options.model_image:  # the claim, and the pod that copies models/ onto it
        archives = [e.archive for e in all_entries]
        manifests["pvc.yaml"] = [core.claim_manifest(options.claim, options.namespace, archives)]
        manifests["pvc-copy-pod.yaml"] = [core.copy_pod(options.server, options.namespace, options.claim)]
    return SeldonPlan(entries, transformers, manifests, experiment, pipeline, pipeline_model, notes)


def check_out(options: SeldonOptions):
    inputs = [("--model-store", options.model_store), ("--config", options.config)]
    inputs.append(("--transformer-archive", options.transformer_archive))
    out_dir.check(Path(options.out), options.force, inputs)


def check_flags(options: SeldonOptions):
    label(options.server, "--server", "name the Server another way, e.g. --server tsctl-mlserver")
    check_shared_flags(
        options,
        "give the namespace Seldon Core 2 runs in, e.g. --namespace seldon-mesh",
        f"name the image to build from OUT/{IMAGE_DIR}, e.g. --image registry.example.com/tsctl-mlserver:1",
    )
    if options.model_image:
        model_image.check_reference(options.image_ref or "", "--image-ref")
    elif options.image_ref is not None:
        raise UserError("--image-ref is for --storage oci: the PVC flow copies models/ onto --claim")
    if not options.ab and not options.mirror and (options.default or options.experiment):
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
    except config_properties.ConfigError as exc:
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


def entry_of(spec: ts_config.ModelSpec, extra: Optional[dict] = None, facts: Optional[ArchiveFacts] = None) -> Entry:
    """The Model of ``spec``: its archive read once (``facts``, when it was read already)."""
    facts = facts or archive_facts.read(spec.archive, within=spec.archive.parent)
    settings = mlserver.model_settings(spec, f"./{spec.archive.name}", extra)
    return Entry(spec.name, facts, settings)


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
    archive = core.splitting_transformer(options.transformer_archive)
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
        core.check_transformer_shape(archive, predictor, names[predictor].shape)
    model_name = archive.name
    base = suggest(model_name)[:58]
    transformers = []
    for role, suffix in (("preprocess", "pre"), ("postprocess", "post")):
        name = f"{base}-{suffix}"
        label(name, "the transformer's Model name", f"package {archive.path.name} again with a shorter --model-name")
        if name in names:
            raise UserError(
                f"the transformer's Model name '{name}' is also a model of the store: package {archive.path.name} "
                "again under another --model-name"
            )
        transformers.append(entry_of(transformer_spec(archive, name), {"role": role}, archive))
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


def transformer_spec(facts: ArchiveFacts, name: str) -> ts_config.ModelSpec:
    """The transformer's worker settings: its model-config.yaml's, as TorchServe registers an archive."""
    return ts_config.from_model_config(name, facts.version, facts.path, facts.config, frontend_settings.Frontend())


def size_notes(options: SeldonOptions, entries: List[Entry]) -> List[str]:
    notes = []
    total = sum(core.disk_size(entry.archive) for entry in entries)
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


# ---- writing ------------------------------------------------------------------------------------------
def write(plan: SeldonPlan, options: SeldonOptions, root: Path) -> List[Path]:
    files: List[Path] = []
    for entry in plan.entries + plan.transformers:
        folder = root / MODELS_DIR / entry.name
        folder.mkdir(parents=True)
        core.copy_archive(entry.archive, folder / entry.archive.name)
        (folder / mlserver.MODEL_SETTINGS).write_text(json.dumps(entry.settings, indent=2) + "\n")
        files += [folder / entry.archive.name, folder / mlserver.MODEL_SETTINGS]
    digests, digest = {}, None
    if options.model_image:  # models/ complete: its image, whose digest the Server's volume pins
        digest, image_files = model_image.write(root, root / model_image.FOLDER, options.image_ref, (MODELS_DIR,))
        files += image_files
        digests[f"{options.image_ref}@{model_image.PENDING}"] = f"{options.image_ref}@{digest}"
    for name, documents in plan.manifests.items():
        documents = [model_image.pinned(document, digests) for document in documents]
        (root / name).write_text(yaml.safe_dump_all(documents, sort_keys=False), encoding="utf-8")
        files.append(root / name)
    files += write_image_context(root, options, plan.entries + plan.transformers)
    served = served_models(plan)
    files += core.write_inputs(root, sample_inputs(served))
    (root / "DEPLOY.md").write_text(deploy_md(options, plan, served, digest), encoding="utf-8")
    files.append(root / "DEPLOY.md")
    return files
