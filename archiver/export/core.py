"""What both exports (``export kserve``, ``export seldon``) write the same way: the claim the tree is copied
onto and the pod that copies it, the archives hard-linked into the tree, the files under OUT/inputs/, and
DEPLOY.md's sections and the images' Dockerfiles rendered from the templates beside this module
(archiver/export/templates/)."""

import math
import os
import shutil
import string
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from handlers.settings import ImageSettings

from ..errors import UserError
from . import archive_facts
from .archive_facts import ArchiveFacts

COPY_POD_IMAGE = "busybox:1.36"  # has tar, which kubectl cp runs in the pod
COPY_POD_UID = 1000  # the uid KServe's TorchServe runtime runs as (and Seldon's servers): the copied files are its own
MIN_CLAIM_GIB = 2
TEMPLATES = Path(__file__).parent / "templates"
HERE_CHECK = (
    'test -f DEPLOY.md -a -d {folder} || echo "error: run these commands from the directory DEPLOY.md is in" >&2'
)


# ---- DEPLOY.md, the Dockerfiles -------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def template(name: str) -> string.Template:
    """templates/NAME.md (templates/NAME when NAME has a suffix of its own: ``tsctl-image.Dockerfile``), a
    ``string.Template``: ``$name``/``${name}`` are filled in, ``$$`` is a ``$`` of the shell commands it shows."""
    return string.Template((TEMPLATES / (name if Path(name).suffix else f"{name}.md")).read_text(encoding="utf-8"))


def render(name: str, /, **values) -> str:
    """templates/NAME.md (or NAME) with ``values`` filled in (a KeyError names a value the template wants and
    lacks)."""
    return template(name).substitute(values)


def lines(texts: Iterable[str]) -> str:
    """Commands (or paragraphs) one a line, for a template value that holds several."""
    return "\n".join(texts)


# ---- the claim, and the pod that copies onto it ---------------------------------------------------------
def copy_pod(owner: str, namespace: str, claim: str) -> dict:
    """A pod ``OWNER-copy`` that mounts the claim for kubectl cp, admitted under the restricted Pod Security
    Standard: non-root uid 1000 (KServe's TorchServe runtime's own), no privilege escalation, no
    capabilities, RuntimeDefault seccomp; fsGroup makes the claim's root writable for that uid."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{owner}-copy", "namespace": namespace},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": COPY_POD_UID,
                "runAsGroup": COPY_POD_UID,
                "fsGroup": COPY_POD_UID,
                "fsGroupChangePolicy": "OnRootMismatch",
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "copy",
                    "image": COPY_POD_IMAGE,
                    "command": ["sleep", "3600"],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "models", "mountPath": "/pvc"}],
                }
            ],
            "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


def disk_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def claim_size(paths: List[Path]) -> str:
    """Twice what is copied onto the claim (room for the next version beside it), at least MIN_CLAIM_GIB."""
    return f"{max(MIN_CLAIM_GIB, math.ceil(2 * sum(disk_size(p) for p in paths) / 2**30))}Gi"


def claim_manifest(claim: str, namespace: str, paths: List[Path]) -> dict:
    """The PersistentVolumeClaim for what ``paths`` hold (``claim_size``), ReadWriteOnce."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": claim_size(paths)}},
        },
    }


# ---- files --------------------------------------------------------------------------------------------------
def copy_archive(source: Path, target: Path):
    """Hard-link when possible (same filesystem, no copy of GBs), else copy; a directory archive is copied as the
    engine copies a store's (``copy_directory``)."""
    if target.exists() or target.is_symlink():
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    if source.is_dir():
        copy_directory(source, target)
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def copy_directory(source: Path, target: Path):
    """A directory archive copied through what was opened, as the engine copies one of its store
    (handlers/archives.py ``model_dir``): links followed only to files and folders inside the folder it lies in,
    pipes, devices and dangling links left out; a link leading out (a secret of this machine that would go into
    the tree and the image) is one UserError naming it."""
    from handlers.archives import Archive, ArchiveError

    try:
        with Archive(source, within=source.parent) as found:
            found.model_dir(target)
    except ArchiveError as exc:
        raise UserError(str(exc)) from None


def write_inputs(out: Path, files: Dict[str, bytes]) -> List[Path]:
    written = []
    for relative, data in files.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)
    return written


def check_same_input(flag: str, archives: Dict[str, ArchiveFacts]) -> List[str]:
    """The candidates of a split (``--split``, ``--ab``, ``--mirror``: model -> its archive's facts) take the same
    kind of input (MAR-INF/tsctl.json's, ``ArchiveFacts.input``): the router sends each request to either, so an
    image to a text model would fail; one UserError naming both archives. A handler of the user's own says
    nothing of its input: accepted, with a note for each such archive (returned) saying tsctl cannot tell."""
    known = {model: archive.input for model, archive in archives.items() if archive.input}
    if len(set(known.values())) > 1:
        said = ", ".join(f"{archives[model].path} ('{model}') takes {kind}" for model, kind in known.items())
        raise UserError(
            f"{flag}: {said}; a split sends each request to either candidate, so they must take the same input: "
            "split between versions of one model"
        )
    return [
        f"{flag}: tsctl cannot tell what {archive.path}'s handler ({archive.handler}) "
        f"takes, so it is not checked against {', '.join(str(archives[m].path) for m in known) or 'the others'}: "
        "send it the same requests as the other candidates before deploying"
        for model, archive in archives.items()
        if model not in known
    ]


def splitting_transformer(path) -> ArchiveFacts:
    """``--transformer-archive``'s facts, read once and checked: it exists, and its handler is the toolkit's and
    splits (its preprocessing makes one tensor of a request, its postprocessing reads the model's raw output:
    MAR-INF's ``splits``), as every transformer the exports write runs it apart from its model; a UserError
    otherwise."""
    archive = Path(path)
    if not archive.is_file():
        raise UserError(f"--transformer-archive {archive} does not exist")
    facts = archive_facts.read(archive)
    record = facts.record
    if record is None:
        raise UserError(
            f"--transformer-archive {archive} is not a toolkit archive (no MAR-INF/tsctl.json; handler "
            f"{facts.handler!r}): package it with --handler image_classifier"
        )
    if not record.get("splits"):
        raise UserError(
            f"--transformer-archive {archive}: its handler ({record.get('class')}) cannot run apart from its model "
            "(its preprocessing does not make one tensor of a request: the text handlers' makes a dict of token "
            "tensors): give an archive built with --handler image_classifier"
        )
    return facts


def transformer_shape(archive: ArchiveFacts) -> Optional[List[int]]:
    """The shape of one image's tensor the transformer archive sends its model: ``[3, crop, crop]`` for the
    toolkit's image_classifier (its model-config.yaml ``handler.crop``, else 224); None for any other handler (a
    subclass may preprocess another way: its shape cannot be known without running it)."""
    record = archive.record or {}
    if (record.get("module"), record.get("class")) != ("handlers.image", "ImageClassifier"):
        return None
    crop = (archive.config.get("handler") or {}).get("crop", ImageSettings.crop)
    return [3, crop, crop]


def check_transformer_shape(transformer: ArchiveFacts, model: str, shape) -> None:
    """The model behind a transformer takes the tensor the transformer makes: else every request routed to it is
    refused (the tensor handler's 400). Silent where either shape is unknown (no ``handler.input_shape``)."""
    made = transformer_shape(transformer)
    if made is None or shape is None or list(shape) == made:
        return
    shape = list(shape)
    square = len(shape) == 3 and shape[0] == 3 and shape[1] == shape[2]
    other = f", or give a transformer archive with handler.crop: {shape[1]}" if square else ""
    raise UserError(
        f"model '{model}' takes tensors of shape {shape} (its handler.input_shape), but the transformer "
        f"{transformer.path.name} makes {made} (its handler.crop): every request routed to it would be refused; "
        f"package '{model}' with handler.input_shape: {made} (weights that take {made[1]}x{made[2]} images){other}"
    )
