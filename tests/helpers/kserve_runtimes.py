"""How KServe picks the serving runtime of an InferenceService, and which new runtimes its webhook admits, as
kserve/kserve does at commit aaac4e294dae2c7b1aa1886447793f3aa1c30912 (the one ../shared/kserve is from), for
tests without a cluster. Written here from reading, not copied: a model of KServe's rules, so the
tests say what they check, not KServe's code running.

``picked(isvc, runtimes)``: pkg/controller/v1beta1/inferenceservice/components/predictor.go (reconcileModel)
and pkg/apis/serving/v1beta1/predictor_model.go (GetSupportingRuntimes):

- an InferenceService naming ``runtime`` gets that runtime (the namespace's ServingRuntime of that name,
  else the ClusterServingRuntime), unless it is disabled, lacks the protocol, or lists no entry of the
  model's format (autoSelect does not matter then);
- otherwise the candidates are the runtimes, not disabled, not multi-model, not multi-node, whose
  ``supportedModelFormats`` hold an entry with ``autoSelect: true`` of the model's format name (and its
  version, when the model gives one) and whose ``protocolVersions`` hold the model's (v1 when it says
  none; a runtime listing none takes any);
- the namespace's ServingRuntimes come first, then the ClusterServingRuntimes: each list sorted by the
  lowest protocol it speaks, then newest first (``runtimes`` is in creation order here), then by name;
  then, stably, by the priority of the format's first entry, highest first, those with none last;
- the first candidate is picked; none is an error (NoSupportingRuntime).

``refused(new, installed)``: pkg/webhook/admission/servingruntime/servingruntime_webhook.go: a runtime is
refused when one of its own auto-selected formats is given two priorities, or when an installed runtime of
the same kind (and namespace), enabled, another name, of the same multi-model-ness and sharing a protocol,
auto-selects an equal format (name, any case; the same version or neither has one) at the same priority.
"""

from typing import List, Optional

PROTOCOL_ORDER = {"v1": 1, "v2": 2, "grpc-v1": 3, "grpc-v2": 4}  # constants.ProtocolVersion; unknown: 5
CLUSTER = "ClusterServingRuntime"


def _spec(runtime: dict) -> dict:
    return runtime.get("spec", {})


def _name(runtime: dict) -> str:
    return runtime["metadata"]["name"]


def _enabled(runtime: dict) -> bool:
    spec = _spec(runtime)
    return not spec.get("disabled") and not spec.get("multiModel") and "workerSpec" not in spec


def _speaks(runtime: dict, protocol: Optional[str]) -> bool:
    spoken = _spec(runtime).get("protocolVersions") or []
    return not protocol or not spoken or protocol in spoken


def supports(model: dict, runtime: dict) -> bool:
    """RuntimeSupportsModel: the runtime lists the model's format (and version, if the model gives one),
    through an auto-selected entry unless the model names its runtime."""
    wanted = model["modelFormat"]
    labels = set()
    for entry in _spec(runtime).get("supportedModelFormats", []):
        if model.get("runtime") or entry.get("autoSelect"):
            labels.add((entry["name"], None))
            if entry.get("version") is not None:
                labels.add((entry["name"], entry["version"]))
    return (wanted["name"], wanted.get("version")) in labels


def _priority(runtime: dict, format_name: str) -> Optional[int]:
    for entry in _spec(runtime).get("supportedModelFormats", []):
        if entry["name"] == format_name:
            return entry.get("priority")
    return None


def _lowest_protocol(runtime: dict) -> int:
    spoken = _spec(runtime).get("protocolVersions") or []
    return min((PROTOCOL_ORDER.get(p, 5) for p in spoken), default=5)


def _ordered(runtimes: List[dict], format_name: str) -> List[dict]:
    """The lowest protocol first, then the newest (``metadata.creationTimestamp`` when every runtime has one,
    else the later in ``runtimes``), then by name; then, stably, by priority, highest first, none last."""
    stamped = all("creationTimestamp" in r["metadata"] for r in runtimes)
    created = {id(r): r["metadata"]["creationTimestamp"] if stamped else n for n, r in enumerate(runtimes)}
    by_list = sorted(runtimes, key=_name)
    by_list.sort(key=lambda r: created[id(r)], reverse=True)  # stable: equal times keep the names' order
    by_list.sort(key=_lowest_protocol)
    with_priority = [r for r in by_list if _priority(r, format_name) is not None]
    without = [r for r in by_list if _priority(r, format_name) is None]
    return sorted(with_priority, key=lambda r: -_priority(r, format_name)) + without  # sorted() is stable


def candidates(isvc: dict, runtimes: List[dict]) -> List[str]:
    """GetSupportingRuntimes: the names of the runtimes KServe would try for an InferenceService that names
    none, in its order. ``runtimes``: every ServingRuntime and ClusterServingRuntime, oldest first."""
    model = isvc["spec"]["predictor"]["model"]
    namespace = isvc["metadata"].get("namespace", "default")
    protocol = model.get("protocolVersion", "v1")
    local = [r for r in runtimes if r["kind"] != CLUSTER and r["metadata"].get("namespace") == namespace]
    cluster = [r for r in runtimes if r["kind"] == CLUSTER]
    found = []
    for group in (local, cluster):
        fitting = [r for r in group if _enabled(r) and supports(model, r) and _speaks(r, protocol)]
        found += [_name(r) for r in _ordered(fitting, model["modelFormat"]["name"])]
    return found


def picked(isvc: dict, runtimes: List[dict]) -> str:
    """The runtime KServe runs the InferenceService on; ValueError with KServe's reason when none."""
    model = isvc["spec"]["predictor"]["model"]
    named = model.get("runtime")
    if named is None:
        found = candidates(isvc, runtimes)
        if not found:
            raise ValueError("No runtime found to support specified framework/version")
        return found[0]
    namespace = isvc["metadata"].get("namespace", "default")
    same = [r for r in runtimes if _name(r) == named]
    local = [r for r in same if r["kind"] != CLUSTER and r["metadata"].get("namespace") == namespace]
    found = (local or [r for r in same if r["kind"] == CLUSTER] or [None])[0]
    if found is None:
        raise ValueError(f"No ServingRuntimes or ClusterServingRuntimes with the name: {named}")
    if _spec(found).get("disabled"):
        raise ValueError("Specified runtime is disabled")
    if model.get("protocolVersion") and not _speaks(found, model["protocolVersion"]):
        raise ValueError("Specified runtime does not support specified protocol version")
    if not supports(model, found):
        raise ValueError("Specified runtime does not support specified framework/version")
    return named


def _same_format(one: dict, other: dict) -> bool:
    return one["name"].lower() == other["name"].lower() and one.get("version") == other.get("version")


def refused(new: dict, installed: List[dict]) -> Optional[str]:
    """The webhook's reason for refusing ``new`` beside ``installed`` (same kind), None when it admits it."""
    spec = _spec(new)
    if spec.get("disabled"):
        return None
    given = {}
    for entry in spec.get("supportedModelFormats", []):
        if entry.get("autoSelect"):
            first = given.setdefault(entry["name"], entry.get("priority"))
            if None not in (first, entry.get("priority")) and first != entry.get("priority"):
                return f"different priorities assigned for the model format {entry['name']}"
    for other in installed:
        theirs = _spec(other)
        if (
            other["kind"] != new["kind"]
            or other["metadata"].get("namespace") != new["metadata"].get("namespace")
            or theirs.get("disabled")
            or _name(other) == _name(new)
            or bool(theirs.get("multiModel")) != bool(spec.get("multiModel"))
            or not set(theirs.get("protocolVersions") or []) & set(spec.get("protocolVersions") or [])
        ):
            continue
        for mine in spec.get("supportedModelFormats", []):
            for their in theirs.get("supportedModelFormats", []):
                equal = _same_format(mine, their) and mine.get("autoSelect") and their.get("autoSelect")
                if equal and None not in (mine.get("priority"), their.get("priority")):
                    if mine["priority"] == their["priority"]:
                        return f"same priority assigned for the model format {mine['name']} ({_name(other)})"
    return None
