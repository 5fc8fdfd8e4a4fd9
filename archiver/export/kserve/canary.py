"""``export kserve --canary PERCENT``: the rollout in three manifests, gated by ``tsctl shadow``, and DEPLOY.md's
steps for it (templates/kserve-canary.md).

    OUT/inferenceservice-shadow.yaml    this export's model as the new revision with canaryTrafficPercent 0:
                                        it runs, users' requests all still go to the revision rolled out before
    OUT/inferenceservice.yaml           the same with canaryTrafficPercent PERCENT (after the check passes)
    OUT/inferenceservice-promote.yaml   without canaryTrafficPercent: the new revision takes all the traffic

KServe's canary (Serverless mode: Knative revisions) splits traffic between the latest ready revision and the
last one rolled out, and compares nothing. Each manifest carries ``serving.kserve.io/enable-tag-routing:
"true"``: KServe then tags the two revisions' routes ``latest`` and ``prev``, which keeps the new revision
routable (so running) at 0 percent; without a route Knative scales a revision to zero. The check reaches
each revision's pod through ``kubectl port-forward`` (label ``serving.knative.dev/revision``), as the
export's other steps reach a pod, so it needs neither DNS for the tagged hosts nor a Host header.
"""

import copy
from typing import TYPE_CHECKING, Dict, List, Optional

from .. import core
from ..archive_facts import ArchiveFacts
from ..options import Service

if TYPE_CHECKING:  # pragma: no cover
    from .autoscale_modes import Mode

TAG_ROUTING = "serving.kserve.io/enable-tag-routing"
SHADOW, PROMOTE = "inferenceservice-shadow.yaml", "inferenceservice-promote.yaml"
PORTS = (8081, 8082)  # the local ports of the current and the candidate revision's pods


def manifests(isvc: dict, mode: "Mode") -> Dict[str, dict]:
    """The canary's InferenceService (``isvc``, with canaryTrafficPercent and any autoscaling) with tag
    routing on, and the shadow and promote steps made from it. Standard mode (``--autoscale keda|hpa``: plain
    Deployments, no revisions) has no canary: refused in one line (``mode.check_canary``)."""
    mode.check_canary(isvc)
    canary = copy.deepcopy(isvc)
    canary["metadata"].setdefault("annotations", {})[TAG_ROUTING] = "true"
    shadow, promote = copy.deepcopy(canary), copy.deepcopy(canary)
    shadow["spec"]["predictor"]["canaryTrafficPercent"] = 0
    del promote["spec"]["predictor"]["canaryTrafficPercent"]
    return {"inferenceservice.yaml": canary, SHADOW: shadow, PROMOTE: promote}


def first_manifest(canary: Optional[int]) -> str:
    """What step 3 applies: with --canary the shadow step (nothing reaches the new revision before the check)."""
    return SHADOW if canary is not None else "inferenceservice.yaml"


def shadow_lines(protocol: str, archives: List[ArchiveFacts]) -> List[str]:
    """One ``tsctl shadow`` per archive of the tree: its golden inputs, or a sample of the user's requests."""
    lines = []
    for archive in archives:
        inputs = "" if archive.golden_answers() else " --inputs REQUESTS_DIR"
        lines.append(
            f"tsctl shadow model-store/{archive.path.name} --current http://localhost:{PORTS[0]} "
            f"--candidate http://localhost:{PORTS[1]} --protocol {protocol}{inputs}"
        )
    return lines


def section(service: Service, canary: Optional[int], archives: List[ArchiveFacts], step: int = 7) -> str:
    """DEPLOY.md's rollout (its heading numbered ``step``): the revisions, the check, then
    canaryTrafficPercent, then promotion; '' without --canary."""
    if canary is None:
        return ""
    ns = service.ns
    missing = [a.path.name for a in archives if not a.golden_answers()]
    status = f"kubectl get inferenceservice {service.name} {ns} -o jsonpath='{{.status.components.predictor"
    return core.render(
        "kserve-canary",
        step=step,
        name=service.name,
        ns=ns,
        percent=canary,
        shadow=SHADOW,
        promote=PROMOTE,
        tag_routing=TAG_ROUTING,
        current=f"{status}.latestRolledoutRevision}}'",
        candidate=f"{status}.latestReadyRevision}}'",
        current_port=PORTS[0],
        candidate_port=PORTS[1],
        checks=" &&\n".join(shadow_lines(service.protocol, archives)),
        inputs_note=inputs_note(missing),
    )


def inputs_note(missing: List[str]) -> str:
    if not missing:
        return "Each archive sends the golden inputs it was packaged with (`tsctl package --golden DIR`)."
    return (
        f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no golden inputs: replace REQUESTS_DIR "
        "with a directory of recorded request bodies, one file each (or package with `--golden DIR`)."
    )
