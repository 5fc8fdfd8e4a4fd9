"""Where ``tsctl export kserve`` puts the tree for the pod (``--storage``): a ``Storage`` per kind, asked by
archiver/export/kserve/export.py, never compared by name.

    pvc  the tree copied onto a PersistentVolumeClaim (``--storage-uri pvc://CLAIM/PATH``): pvc.yaml, the
         copy pod, DEPLOY.md's copy steps
    oci  the tree as a model image (``--image-ref REF``, archiver/export/model_image.py), mounted by KServe
         0.20 as an image volume: ``storageUri: oci+native://REF@sha256:DIGEST``

Either way the tree carries its digests (serving/tree_digests.py) and the InferenceService pins them.
"""

import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ...errors import UserError
from .. import core, model_image
from ..options import Service

PVC_URI = re.compile(r"^pvc://([a-z0-9]([-a-z0-9.]*[a-z0-9])?)(/[^\s]*)?$")
PATH_SEGMENT = re.compile(r"^[A-Za-z0-9_.-]+$")  # a segment of the path inside the claim (storage_path)


class Storage:
    """Where the tree goes; see the module docstring."""

    def uri(self) -> str:
        """The InferenceService's storageUri (``model_image.PENDING`` where a digest comes once the tree is
        written)."""
        raise NotImplementedError

    def manifests(self, service: Service, archives: List[Path]) -> Dict[str, dict]:
        return {}

    def write(self, staging: Path) -> Tuple[List[Path], Dict[str, str]]:
        """Files written beside the tree once it is complete, and the digests to pin in the manifests."""
        return [], {}

    def steps(
        self, service: Service, archives: List[Path], transformer: Optional[Path], config_files: Sequence[str]
    ) -> str:
        """DEPLOY.md's steps 1 and 2: the tree where the pod finds it."""
        raise NotImplementedError


class Pvc(Storage):
    def __init__(self, storage_uri: Optional[str], image_ref: Optional[str]):
        if image_ref is not None:
            raise UserError("--image-ref is for --storage oci: the PVC flow copies the tree onto --storage-uri's claim")
        if not storage_uri:
            raise UserError("--storage pvc needs --storage-uri pvc://CLAIM/PATH: the claim the tree is copied to")
        self.storage_uri = storage_uri
        self.claim, self.sub_path = storage_path(storage_uri)

    def uri(self) -> str:
        return self.storage_uri

    def manifests(self, service: Service, archives: List[Path]) -> Dict[str, dict]:
        return {
            "pvc-copy-pod.yaml": core.copy_pod(service.name, service.namespace, self.claim),
            "pvc.yaml": core.claim_manifest(self.claim, service.namespace, archives),
        }

    def steps(
        self, service: Service, archives: List[Path], transformer: Optional[Path], config_files: Sequence[str]
    ) -> str:
        pod, ns = f"{service.name}-copy", service.ns
        root = f"/pvc/{self.sub_path}".rstrip("/")
        transformers = [transformer] if transformer else []
        folders = [f"{root}/config", f"{root}/model-store"] + ([f"{root}/transformer"] if transformers else [])
        copies = [f"kubectl cp {ns} config/{name} {pod}:{root}/config/{name}" for name in config_files]
        copies += [f"kubectl cp {ns} model-store/{a.name} {pod}:{root}/model-store/{a.name}" for a in archives]
        copies += [f"kubectl cp {ns} transformer/{a.name} {pod}:{root}/transformer/{a.name}" for a in transformers]
        return core.render(
            "kserve-storage-pvc",
            claim=self.claim,
            claim_size=core.claim_size(archives + transformers),
            ns=ns,
            mounted=f"{self.claim}/{self.sub_path}".rstrip("/"),
            uid=core.COPY_POD_UID,
            pod=pod,
            folders=" ".join(folders),
            copies=core.lines(copies),
            root=root,
        )


class Oci(Storage):
    def __init__(self, storage_uri: Optional[str], image_ref: Optional[str]):
        if storage_uri:
            raise UserError(
                "--storage-uri is for --storage pvc: with --storage oci the InferenceService's storageUri "
                "is the image's (--image-ref), pinned by its digest"
            )
        if not image_ref:
            raise UserError("--storage oci needs --image-ref REGISTRY/NAME:TAG: where you will push the model image")
        model_image.check_reference(image_ref)
        self.reference = image_ref
        self.digest = model_image.PENDING

    def uri(self) -> str:
        return f"oci+native://{self.reference}@{model_image.PENDING}"

    def write(self, staging: Path) -> Tuple[List[Path], Dict[str, str]]:
        self.digest, files = model_image.write(staging, staging / model_image.FOLDER, self.reference)
        return files, {self.uri(): f"oci+native://{self.reference}@{self.digest}"}

    def steps(
        self, service: Service, archives: List[Path], transformer: Optional[Path], config_files: Sequence[str]
    ) -> str:
        return core.render(
            "kserve-storage-oci",
            image_ref=self.reference,
            image_digest=self.digest,
            registry=model_image.registry_of(self.reference),
            tag=model_image.tag_of(self.reference),
            transformer_folder=" and `/models/transformer/`" if transformer else "",
        )


STORAGES = {"pvc": Pvc, "oci": Oci}


def of(storage: str, storage_uri: Optional[str], image_ref: Optional[str]) -> Storage:
    """``--storage``'s kind, with ``--storage-uri`` and ``--image-ref`` checked for it."""
    kind = STORAGES.get(storage)
    if kind is None:
        raise UserError(f"--storage {storage!r} must be one of {', '.join(STORAGES)}")
    return kind(storage_uri, image_ref)


def storage_path(uri: str) -> Tuple[str, str]:
    """The claim and the path inside it of ``--storage-uri pvc://CLAIM/PATH`` (PATH "" for the claim's
    root). PATH is where DEPLOY.md copies the tree, inside the claim: segments of letters, digits, '-',
    '_' and '.', none empty (``//``: an absolute path), '.' or '..' (outside the claim); one trailing '/'
    is allowed. A one-line UserError otherwise."""
    match = PVC_URI.match(uri)
    if not match:
        raise UserError(f"--storage-uri {uri!r} must look like pvc://CLAIM/PATH")
    path = match.group(3) or ""
    path = path[:-1] if path.endswith("/") else path
    segments = path.split("/")[1:]
    bad = next((s for s in segments if s in ("", ".", "..") or not PATH_SEGMENT.match(s)), None)
    if bad is not None:
        named = {"": "an empty segment (//)", ".": "a '.' segment", "..": "a '..' segment"}
        why = named.get(bad, f"the segment {bad!r}")
        raise UserError(
            f"--storage-uri {uri!r} has {why} in its path, which DEPLOY.md would copy to: give a path inside "
            "the claim of letters, digits, '-', '_' and '.' segments, e.g. pvc://models/vision"
        )
    return match.group(1), "/".join(segments)
