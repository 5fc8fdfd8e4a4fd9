"""``tsctl export check TREE``: an exported tree (OUT itself, its copy on a claim, an unpacked model image)
checked as the pod checks it before a worker loads (serving/tree_digests.py): its listing has the digest the
InferenceService pins, and every file of config/, model-store/ and transformer/ is as the export wrote it, no
more and no fewer."""

from pathlib import Path
from typing import Optional

import yaml

from serving import tree_digests

from ..errors import UserError

ISVC = "inferenceservice.yaml"


def pinned_digest(tree: Path) -> str:
    """The digest TREE/inferenceservice.yaml pins (its predictor's ``TSCTL_TREE_DIGEST``), else a UserError
    asking for ``--digest``."""
    path = tree / ISVC
    if not path.is_file():
        raise UserError(f"{path} does not exist: give the tree's digest with --digest sha256:HEX")
    try:
        isvc = yaml.safe_load(path.read_text(encoding="utf-8"))
        env = isvc["spec"]["predictor"]["model"].get("env") or []
    except (OSError, yaml.YAMLError, TypeError, KeyError, AttributeError) as exc:
        raise UserError(f"{path} cannot be read as an InferenceService ({exc}): give --digest sha256:HEX") from None
    for entry in env:
        if isinstance(entry, dict) and entry.get("name") == tree_digests.ENVIRONMENT:
            return str(entry.get("value"))
    raise UserError(f"{path} pins no tree digest ({tree_digests.ENVIRONMENT}): give --digest sha256:HEX")


def check(tree: Path, digest: Optional[str] = None) -> dict:
    """The report of TREE's check against ``digest`` (default: the one TREE/inferenceservice.yaml pins):
    ``problem`` None when every file matches, else the first file that does not, named."""
    if not tree.is_dir():
        raise UserError(f"{tree} is not a directory: give the exported tree (OUT, or its copy)")
    expected = digest or pinned_digest(tree)
    if not expected.startswith("sha256:"):
        raise UserError(f"--digest {expected!r} must look like sha256:HEX, as the InferenceService pins it")
    try:
        pinned = tree_digests.Tree.pinned(str(tree), expected)
        pinned.check_all()
    except tree_digests.TreeChanged as exc:
        return {"tree": str(tree), "digest": expected, "files": None, "problem": str(exc)}
    except (ValueError, KeyError) as exc:
        problem = f"{tree_digests.LISTING} is not a listing the export writes ({exc}): copy the tree again"
        return {"tree": str(tree), "digest": expected, "files": None, "problem": problem}
    return {"tree": str(tree), "digest": expected, "files": len(pinned.files), "problem": None}
