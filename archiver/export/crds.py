"""Validating KServe and Seldon Core 2 manifests against the CRDs' own OpenAPI schemas (archiver/export/crds/*.json,
archiver/export/crds/seldon/*.json; where each comes from: archiver/export/crds/README.md), and what
``export kserve --autoscale`` writes beside them: KEDA's ScaledObject, the Prometheus Operator's ServiceMonitor and
PodMonitor (crds/keda/, crds/prometheus-operator/), and a PodDisruptionBudget (``PDB_SCHEMA``, no CRD).

Kubernetes prunes or, with strict field validation (kubectl's default), rejects fields a schema does not
declare; plain JSON Schema would let them pass. So objects that declare ``properties`` are checked
strictly here too, unless the schema says ``x-kubernetes-preserve-unknown-fields``.

The ServingRuntime and ClusterServingRuntime CRDs share one schema (servingruntime.v1alpha1.json, from
``../shared/kserve/serving.kserve.io_{cluster,}servingruntimes.yaml``). Two checks are added to it where the CRD
leaves them to the API server and KServe (``runtime_schema``): the metadata (a name Kubernetes takes; no
namespace for a cluster-scoped ClusterServingRuntime) and ``protocolVersions``, which takes KServe's protocol
names only (v1, v2, grpc-v1, grpc-v2: any other string would pass the CRD and never be matched).
"""

import json
from functools import lru_cache
from pathlib import Path

import jsonschema

from ..choices import RUNTIME_KINDS
from ..errors import UserError

SCHEMAS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.v1beta1.json",
    ("serving.kserve.io/v1alpha1", "InferenceGraph"): "inferencegraph.v1alpha1.json",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime.v1alpha1.json",
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "servingruntime.v1alpha1.json",
    # Seldon Core 2 (tsctl export seldon writes all but ServerConfig, which Seldon's install provides)
    ("mlops.seldon.io/v1alpha1", "Model"): "seldon/model.v1alpha1.json",
    ("mlops.seldon.io/v1alpha1", "Server"): "seldon/server.v1alpha1.json",
    ("mlops.seldon.io/v1alpha1", "ServerConfig"): "seldon/serverconfig.v1alpha1.json",
    ("mlops.seldon.io/v1alpha1", "Experiment"): "seldon/experiment.v1alpha1.json",
    ("mlops.seldon.io/v1alpha1", "Pipeline"): "seldon/pipeline.v1alpha1.json",
    # Seldon Core 1 (tsctl export seldon --core 1)
    ("machinelearning.seldon.io/v1", "SeldonDeployment"): "seldon/seldondeployment.v1.json",
    # what tsctl export kserve --autoscale writes beside the InferenceService (archiver/export/kserve/autoscale.py)
    ("keda.sh/v1alpha1", "ScaledObject"): "keda/scaledobject.v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "prometheus-operator/servicemonitor.v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "prometheus-operator/podmonitor.v1.json",
}
PROJECTS = {  # API group -> whose CRD it is
    "serving.kserve.io": "KServe",
    "mlops.seldon.io": "Seldon Core",
    "machinelearning.seldon.io": "Seldon Core",
    "keda.sh": "KEDA",
    "monitoring.coreos.com": "the Prometheus Operator",
    "policy": "Kubernetes",
}
PROTOCOLS = ("v1", "v2", "grpc-v1", "grpc-v2")  # KServe's protocol names (constants.InferenceServiceProtocol)
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
# An object's metadata as the exports write it: a DNS-subdomain name, labels and annotations as strings.
METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": DNS_SUBDOMAIN},
        "namespace": {"type": "string"},
        "labels": STRINGS,
        "annotations": STRINGS,
    },
}
INT_OR_PERCENT = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": "^[0-9]+%$"}]}
# policy/v1 PodDisruptionBudget: built into Kubernetes, so no CRD to vendor. Written here from the Kubernetes API
# reference (PodDisruptionBudgetSpec: maxUnavailable, minAvailable (IntOrString), selector (LabelSelector),
# unhealthyPodEvictionPolicy (IfHealthyBudget | AlwaysAllow)) and its validation (minAvailable and
# maxUnavailable are mutually exclusive; a percentage is "N%"). tests/export/test_autoscale_export.py keeps it honest.
PDB_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "policy/v1"},
        "kind": {"const": "PodDisruptionBudget"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "required": ["selector"],
            "not": {"required": ["minAvailable", "maxUnavailable"]},
            "properties": {
                "maxUnavailable": INT_OR_PERCENT,
                "minAvailable": INT_OR_PERCENT,
                "selector": {
                    "type": "object",
                    "properties": {
                        "matchLabels": STRINGS,
                        "matchExpressions": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["key", "operator"],
                                "properties": {
                                    "key": {"type": "string"},
                                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                                    "values": {"type": "array", "items": {"type": "string"}},
                                },
                            },
                        },
                    },
                },
                "unhealthyPodEvictionPolicy": {"enum": ["IfHealthyBudget", "AlwaysAllow"]},
            },
        },
    },
}


@lru_cache(maxsize=None)
def schema_for(api_version: str, kind: str) -> dict:
    if api_version == "serving.kserve.io/v1alpha1" and kind in RUNTIME_KINDS:
        return runtime_schema(kind)
    if (api_version, kind) == ("policy/v1", "PodDisruptionBudget"):
        return strict(PDB_SCHEMA)
    if (api_version, kind) == ("machinelearning.seldon.io/v1", "SeldonDeployment"):
        return seldon_deployment_schema()
    name = SCHEMAS.get((api_version, kind))
    if name is None:
        raise UserError(f"no {project(api_version)} schema for {kind} {api_version}")
    return strict(vendored(name))


@lru_cache(maxsize=None)
def vendored(name: str) -> dict:
    return json.loads((Path(__file__).parent / "crds" / name).read_text())


def runtime_schema(kind: str) -> dict:
    """A (Cluster)ServingRuntime's schema: KServe's CRD (the same for both kinds) with the metadata and
    protocol checks of the module docstring; a cluster-scoped one has no namespace."""
    schema = json.loads(json.dumps(vendored(SCHEMAS[("serving.kserve.io/v1alpha1", kind)])))  # a copy to add to
    metadata = json.loads(json.dumps(METADATA))  # a copy: a cluster-scoped kind adds to it
    if kind == "ClusterServingRuntime":
        metadata["not"] = {"required": ["namespace"]}
    schema["properties"]["metadata"] = metadata
    schema["properties"]["spec"]["properties"]["protocolVersions"]["items"]["enum"] = list(PROTOCOLS)
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    return strict(schema)


# Seldon Core 1's graph units: the CRD types them as plain strings and leaves ``children`` open; the operator's
# Go types (operator/apis/machinelearning.seldon.io/v1/seldondeployment_types.go at v1.17.1) name the values.
UNIT_ENUMS = {
    "type": ["UNKNOWN_TYPE", "ROUTER", "COMBINER", "MODEL", "TRANSFORMER", "OUTPUT_TRANSFORMER"],
    "methods": ["TRANSFORM_INPUT", "TRANSFORM_OUTPUT", "ROUTE", "AGGREGATE", "SEND_FEEDBACK"],
    "parameter": ["INT", "FLOAT", "DOUBLE", "STRING", "BOOL"],  # also what seldon-core-microservice parses
    "endpoint": ["REST", "GRPC"],
}


def seldon_deployment_schema() -> dict:
    """A SeldonDeployment's schema: Seldon's CRD (v1) with the metadata check of a namespaced object and its
    graph checked unit by unit: each unit's type, methods, parameter types and endpoint type among the
    operator's values, and its children units too (the CRD leaves them unchecked)."""
    schema = json.loads(json.dumps(vendored(SCHEMAS[("machinelearning.seldon.io/v1", "SeldonDeployment")])))
    schema["properties"]["metadata"] = METADATA
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    schema = strict(schema)
    predictor = schema["properties"]["spec"]["properties"]["predictors"]["items"]
    unit = predictor["properties"]["graph"]
    fields = unit["properties"]
    fields["type"]["enum"] = UNIT_ENUMS["type"]
    fields["methods"]["items"]["enum"] = UNIT_ENUMS["methods"]
    fields["parameters"]["items"]["properties"]["type"]["enum"] = UNIT_ENUMS["parameter"]
    fields["endpoint"]["properties"]["type"]["enum"] = UNIT_ENUMS["endpoint"]
    fields["children"]["items"] = {"$ref": "#/definitions/unit"}
    schema["definitions"] = {"unit": unit}
    predictor["properties"]["graph"] = {"$ref": "#/definitions/unit"}
    return schema


def project(api_version: str) -> str:
    """Whose CRDs an apiVersion's group is (KServe's, Seldon Core's), for messages."""
    return PROJECTS.get(api_version.split("/", 1)[0], "KServe")


def strict(schema):
    """A copy where objects with declared properties refuse undeclared ones."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


# The integer formats the CRDs declare (int32, int64): the API server stores any integer, but the controller
# decoding the object into its Go struct (KServe's webhook, Knative's) fails on one its field cannot hold.
INTEGERS = jsonschema.FormatChecker(())
for _format, _bits in (("int32", 31), ("int64", 63)):
    INTEGERS.checks(_format)(lambda value, bits=_bits: not isinstance(value, int) or -(2**bits) <= value < 2**bits)


def problems(manifest: dict) -> list:
    """Readable schema violations, each 'path: message'; [] when the manifest is valid."""
    schema = schema_for(manifest.get("apiVersion", ""), manifest.get("kind", ""))
    validator = jsonschema.Draft7Validator(schema, format_checker=INTEGERS)
    found = []
    for error in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in error.absolute_path) or "(top)"
        found.append(f"{path}: {error.message}")
    return found


def check(manifest: dict, where: str):
    """Raise UserError naming the file and the first violation."""
    found = problems(manifest)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        owner = project(str(manifest.get("apiVersion", "")))
        raise UserError(f"{where} does not match {owner}'s {manifest.get('kind')} schema: {found[0]}{more}")
