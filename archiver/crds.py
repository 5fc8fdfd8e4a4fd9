"""Validating KServe manifests against the CRDs' own OpenAPI schemas (archiver/crds/*.json).

Kubernetes prunes or, with strict field validation (kubectl's default), rejects fields a schema does not
declare; plain JSON Schema would let them pass. So objects that declare ``properties`` are checked
strictly here too, unless the schema says ``x-kubernetes-preserve-unknown-fields``.
"""

import json
from functools import lru_cache
from pathlib import Path

import jsonschema

from .errors import UserError

SCHEMAS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.v1beta1.json",
    ("serving.kserve.io/v1alpha1", "InferenceGraph"): "inferencegraph.v1alpha1.json",
}


@lru_cache(maxsize=None)
def schema_for(api_version: str, kind: str) -> dict:
    name = SCHEMAS.get((api_version, kind))
    if name is None:
        raise UserError(f"no KServe schema for {kind} {api_version}")
    return strict(json.loads((Path(__file__).parent / "crds" / name).read_text()))


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


def problems(manifest: dict) -> list:
    """Readable schema violations, each 'path: message'; [] when the manifest is valid."""
    schema = schema_for(manifest.get("apiVersion", ""), manifest.get("kind", ""))
    validator = jsonschema.Draft7Validator(schema)
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
        raise UserError(f"{where} does not match KServe's {manifest.get('kind')} schema: {found[0]}{more}")
