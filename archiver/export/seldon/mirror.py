"""``export seldon --mirror CANDIDATE[=PERCENT]``: Seldon Core 2's shadow deployment, gated by ``tsctl shadow``.

    OUT/experiment.yaml           an Experiment whose ``default`` is the model answering now (``--default``),
                                  its only candidate, with ``mirror: {name: CANDIDATE, percent: PERCENT}``
                                  (with ``--ab``, the mirror is added to the A/B experiment instead)
    OUT/experiment-promote.yaml   the same Experiment with CANDIDATE as its only candidate: requests naming the
                                  default model are answered by the candidate

Seldon copies PERCENT percent of the requests for the default model to the mirror and drops its answers:
it compares nothing. DEPLOY.md's steps (templates/seldon-mirror.md) compare them with ``tsctl shadow`` through
the mesh (``seldon-model: MODEL``, which shadow sends over v2) before applying the promotion.
"""

from typing import Dict, List, Optional, Tuple

from ...errors import UserError
from .. import core
from ..kube import label, suggest
from ..options import SeldonOptions
from .plan import API_VERSION, MODELS_DIR, Entry, SeldonPlan

PROMOTE = "experiment-promote.yaml"


def parse_mirror(value: Optional[str]) -> Optional[Tuple[str, int]]:
    """``--mirror MODEL[=PERCENT]`` as (model, percent), 100 when left out; a UserError for anything else."""
    if value is None:
        return None
    model, sep, percent = value.partition("=")
    if not model or (sep and not percent.isdigit()) or (sep and not 1 <= int(percent) <= 100):
        raise UserError(
            f"--mirror {value!r} must be MODEL or MODEL=PERCENT, PERCENT from 1 to 100: e.g. --mirror resnet18-v2=50"
        )
    return model, int(percent) if sep else 100


def check(options: SeldonOptions, entries: List[Entry], experiment: Optional[str], notes: List[str]) -> Optional[str]:
    """The experiment the mirror goes in (the --ab one, else a new one, its name checked), after checking the
    mirror and the model it shadows (``options.default``, set here when the store has just one other
    model; ``notes`` hears of a handler whose input cannot be told); ``experiment`` unchanged without --mirror."""
    if not options.mirror:
        return experiment
    candidate, _ = options.mirror
    kinds = {entry.name: entry.kind for entry in entries}
    if candidate not in kinds:
        raise UserError(f"--mirror model '{candidate}' is not a model of the store ({', '.join(kinds)}): name one")
    if options.ab and candidate in [name for name, _ in options.ab]:
        raise UserError(f"--mirror '{candidate}' is an --ab candidate already: mirror a model outside the split")
    others = [name for name in kinds if name != candidate]
    current = options.default or (others[0] if len(others) == 1 else None)
    if current is None or current not in kinds or current == candidate:
        said = f"--default '{options.default}' is not" if options.default else "no --default names"
        raise UserError(
            f"{said} the model answering now, which --mirror '{candidate}' shadows: give --default with another "
            f"model of the store ({', '.join(others)})"
        )
    archives = {entry.name: entry.facts for entry in entries}
    notes += core.check_same_input("--mirror", {current: archives[current], candidate: archives[candidate]})
    options.default = current
    if options.ab:
        return experiment
    name = options.experiment or f"{current}-mirror"
    label(name, "--experiment", f"name the experiment another way, e.g. --experiment {suggest(name)[:60]}")
    return name


def manifests(options: SeldonOptions, experiment: str, ab_manifest: Optional[dict]) -> Dict[str, List[dict]]:
    """experiment.yaml (the --ab one with the mirror added, or the mirror's own) and experiment-promote.yaml."""
    candidate, percent = options.mirror
    if ab_manifest is not None:
        shadowing = ab_manifest
    else:
        shadowing = experiment_of(options, experiment, options.default)
    shadowing["spec"]["mirror"] = {"name": candidate, "percent": percent}
    return {"experiment.yaml": [shadowing], PROMOTE: [experiment_of(options, experiment, candidate)]}


def experiment_of(options: SeldonOptions, name: str, answering: str) -> dict:
    """An Experiment on the default model whose requests ``answering`` takes, all of them."""
    return {
        "apiVersion": API_VERSION,
        "kind": "Experiment",
        "metadata": {"name": name, "namespace": options.namespace},
        "spec": {"default": options.default, "candidates": [{"name": answering, "weight": 100}]},
    }


def section(options: SeldonOptions, plan: SeldonPlan) -> str:
    """DEPLOY.md's shadow check and promotion; '' without --mirror."""
    if not options.mirror:
        return ""
    candidate, percent = options.mirror
    current = options.default
    archive = next(entry.archive.name for entry in plan.entries if entry.name == current)
    ns = f"-n {options.namespace}"
    check_line = (
        f"tsctl shadow {MODELS_DIR}/{current}/{archive} --current http://${{MESH_IP}} "
        f"--candidate http://${{MESH_IP}} --protocol v2 --model {current} --model-candidate {candidate}"
    )
    return core.render(
        "seldon-mirror",
        experiment=plan.experiment,
        current=current,
        candidate=candidate,
        percent=percent,
        check=check_line,
        ns=ns,
        promote=PROMOTE,
    )
