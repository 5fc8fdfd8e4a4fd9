"""``tsctl export kserve --storage oci``: the export's tree as a model image, an OCI image layout in
OUT/model-image that holds data only: ``/models/`` with exactly what the PVC flow copies (config/,
model-store/, transformer/). KServe 0.20 mounts such an image's ``/models`` at /mnt/models as a Kubernetes
image volume (``storageUri: oci+native://REF@sha256:DIGEST``, pkg/utils/storage.go
ConfigureOciNativeToContainer: subPath "models"), so TorchServe's runtime arguments stay unchanged.

The image is written here, with no tool and no daemon, and is reproducible: the same tree gives the same
bytes and so the same digest (entries sorted, one fixed time, owner root, modes 0755/0644, an uncompressed
layer: no compressor's version in the bytes). One layer, one config per platform (linux/amd64 and
linux/arm64: the data fits both) and an image index over them, whose digest the InferenceService pins.
Push it as it is, digests preserved: ``skopeo copy --all --preserve-digests oci:model-image:TAG
docker://REF`` (DEPLOY.md).
"""

import hashlib
import json
import tarfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from serving.tree_digests import FOLDERS

from ..errors import UserError
from . import kube

FOLDER = "model-image"  # OUT/model-image: the OCI image layout
ROOT = "models"  # the folder of the image KServe mounts (subPath "models")
PLATFORMS = (("linux", "amd64"), ("linux", "arm64"))
EPOCH = 0  # every entry's time: the tree's bytes alone decide the digest
LAYER = "application/vnd.oci.image.layer.v1.tar"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
PENDING = "sha256:" + "0" * 64  # a digest not known yet: the manifests are checked with it, then ``pinned``


def check_reference(reference: str, flag: str = "--image-ref"):
    """A UserError unless ``reference`` names where the image goes (REGISTRY/NAME:TAG), without a digest: the
    export pins the digest of the image it writes."""
    kube.image_reference(reference, flag, "name it e.g. registry.example.com/models/resnet:1")
    if "@" in reference:
        raise UserError(
            f"{flag} {reference!r} holds a digest: give REGISTRY/NAME:TAG, and the export pins the "
            "digest of the image it writes"
        )


def registry_of(reference: str) -> str:
    """The registry an image reference names, by Docker's rule (distribution/reference): the first part of the
    name is a host when it holds a '.' or a ':' or is ``localhost``; else the image is Docker Hub's
    (``myorg/vision:1`` -> ``docker.io``; ``registry.example.com/vision:1`` -> ``registry.example.com``)."""
    first, slash, _ = reference.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def tag_of(reference: str) -> str:
    """The tag of an image reference (``registry:5000/models/resnet:2`` -> ``2``; none -> ``latest``)."""
    name = reference.rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name else "latest"


class Hashing:
    """A file written and hashed at once (what tarfile writes to): the layer is never held in memory."""

    def __init__(self, target):
        self.target, self.sha256, self.size = target, hashlib.sha256(), 0

    def tell(self) -> int:
        return self.size

    def write(self, data) -> int:
        self.sha256.update(data)
        self.size += len(data)
        return self.target.write(data)


def write_layer(tree: Path, target, folders: Sequence[str] = FOLDERS) -> dict:
    """The one layer, written to ``target``: ``models/`` and the tree's ``folders`` under it, a reproducible
    tar; its descriptor."""
    hashing = Hashing(target)
    with tarfile.open(fileobj=hashing, mode="w", format=tarfile.PAX_FORMAT) as layer:
        layer.addfile(entry(ROOT + "/", tarfile.DIRTYPE, 0))
        for top in folders:
            if not (tree / top).is_dir():
                continue
            for path in [tree / top] + sorted((tree / top).rglob("*")):
                name = f"{ROOT}/{path.relative_to(tree).as_posix()}"
                if path.is_dir():
                    layer.addfile(entry(name + "/", tarfile.DIRTYPE, 0))
                else:
                    with open(path, "rb") as data:
                        layer.addfile(entry(name, tarfile.REGTYPE, path.stat().st_size), data)
    return {"mediaType": LAYER, "digest": "sha256:" + hashing.sha256.hexdigest(), "size": hashing.size}


def entry(name: str, kind: bytes, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime = kind, size, EPOCH
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def canonical(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")


def descriptor(media_type: str, data: bytes, **more) -> dict:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data), **more}


def platform_blobs(layer: dict) -> Tuple[List[bytes], bytes]:
    """Each platform's config and manifest over ``layer`` (its descriptor), and the image index's bytes."""
    blobs, manifests = [], []
    for system, architecture in PLATFORMS:
        config = canonical(
            {
                "architecture": architecture,
                "os": system,
                "config": {},
                "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]},
            }
        )
        manifest = canonical(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": descriptor(CONFIG, config),
                "layers": [layer],
            }
        )
        blobs += [config, manifest]
        manifests.append(descriptor(MANIFEST, manifest, platform={"architecture": architecture, "os": system}))
    return blobs, canonical({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests})


def write(tree: Path, out: Path, reference: str, folders: Sequence[str] = FOLDERS) -> Tuple[str, List[Path]]:
    """Write the image of ``tree``'s ``folders`` (export kserve's; export seldon's models/) as the OCI image
    layout ``out``, tagged with ``reference``'s tag; return the image index's digest (what
    ``oci+native://REF@DIGEST`` and an image volume pin) and the files written."""
    blobs_dir = out / "blobs" / "sha256"
    blobs_dir.mkdir(parents=True)
    with open(blobs_dir / "layer.partial", "wb") as target:
        layer = write_layer(tree, target, folders)
    written = blobs_dir / layer["digest"].split(":", 1)[1]
    (blobs_dir / "layer.partial").rename(written)
    blobs, index = platform_blobs(layer)
    top = canonical(
        {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [descriptor(INDEX, index, annotations={REF_NAME: tag_of(reference)})],
        }
    )
    files: Dict[Path, bytes] = {out / "oci-layout": canonical({"imageLayoutVersion": "1.0.0"}), out / "index.json": top}
    for blob in blobs + [index]:
        files[blobs_dir / hashlib.sha256(blob).hexdigest()] = blob
    for path, data in files.items():
        path.write_bytes(data)
    return descriptor(INDEX, index)["digest"], sorted([written, *files])


def pinned(document, values: Dict[str, str]):
    """``document`` (a manifest: dicts, lists, strings) with each key of ``values`` replaced by its value in
    every string: the digests known once the tree is written."""
    if isinstance(document, dict):
        return {key: pinned(value, values) for key, value in document.items()}
    if isinstance(document, list):
        return [pinned(value, values) for value in document]
    if isinstance(document, str):
        for pending, value in values.items():
            document = document.replace(pending, value)
    return document
