"""The digests that bind what a pod loads to what ``tsctl export kserve`` wrote: the export's tree (config/,
model-store/, transformer/) carries ``config/tree-digests.json``, the sha256 of every other file of it, and
the InferenceService pins the sha256 of that listing (the tree's digest). A changed byte, an added or
missing file, or a link is refused before a worker loads, in one line naming the file.

The tsctl engine checks the whole tree at start (``--tree_digest`` or ``TSCTL_TREE_DIGEST``) and each
archive it opens, through the opened file (``Tree.check_archive``). For KServe's TorchServe runtime the
export runs this file, as it is, before ``torchserve`` starts: the predictor's command is ``sh -c 'python -c
"$0" /mnt/models DIGEST && exec ENTRYPOINT "$@"' SOURCE`` (archiver/export/kserve/targets.py), so it is standard
library only.

This complements signatures: a signature says who built an archive; the digest says that the pod's tree is
the one exported.
"""

import hashlib
import json
import os
import stat
import sys

LISTING = "config/tree-digests.json"  # inside the tree; every file but itself
FOLDERS = ("config", "model-store", "transformer")  # what the export writes into the tree
MAX_LISTING_BYTES = 16 << 20
CHUNK = 1 << 20
ENVIRONMENT = "TSCTL_TREE_DIGEST"  # where the engine finds the pinned digest, unless --tree_digest gives it


class TreeChanged(Exception):
    """The tree is not the one exported; ``str()`` is one line naming the file."""


def file_digest(source) -> str:
    """The sha256 of what the open binary file ``source`` holds, read from its start."""
    source.seek(0)
    digest = hashlib.sha256()
    for block in iter(lambda: source.read(CHUNK), b""):
        digest.update(block)
    return digest.hexdigest()


def listing_bytes(files: dict) -> bytes:
    """The listing of ``files`` (relative path -> sha256 hex), as the export writes it: one canonical text."""
    return (json.dumps({"sha256": files}, sort_keys=True, indent=1) + "\n").encode("utf-8")


def tree_files(root: str) -> dict:
    """Every file under the tree FOLDERS of ``root`` but the listing: relative path -> its sha256. A link, a
    pipe or a device anywhere is a TreeChanged (the export writes none), the FOLDERS themselves included; so is a
    folder the check cannot list (what it holds could not be compared)."""

    def unlisted(error: OSError):
        relative = os.path.relpath(error.filename, root).replace(os.sep, "/")
        raise TreeChanged(
            f"{relative} cannot be listed ({error.strerror}), so what it holds cannot be checked: copy the tree again"
        )

    found = {}
    for top in FOLDERS:
        try:
            mode = os.lstat(os.path.join(root, top)).st_mode
        except FileNotFoundError:  # transformer/ without a transformer; a missing file of the others is named
            continue
        if not stat.S_ISDIR(mode):
            raise TreeChanged(f"{top} is not a folder (a link or a file), which the export never writes: copy the tree")
        for folder, folders, names in os.walk(os.path.join(root, top), onerror=unlisted):
            for name in sorted(folders + names):
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, root).replace(os.sep, "/")
                mode = os.lstat(path).st_mode
                if stat.S_ISDIR(mode):
                    continue
                if not stat.S_ISREG(mode):
                    raise TreeChanged(f"{relative} is not a regular file, which the export never writes: copy the tree")
                if relative != LISTING:
                    found[relative] = digest_of(path, relative)
    return found


def digest_of(path: str, relative: str) -> str:
    """The sha256 of the file at ``path`` (``relative`` in the tree); one it cannot read is a TreeChanged."""
    try:
        with open(path, "rb") as opened:
            return file_digest(opened)
    except OSError as error:
        raise TreeChanged(f"{relative} cannot be read ({error.strerror}): copy the tree again") from None


class Tree:
    """A tree whose listing matched the pinned digest (``pinned``): what each of its files must hold."""

    def __init__(self, root: str, files: dict):
        self.root, self.files = root, files

    @classmethod
    def pinned(cls, root: str, expected: str) -> "Tree":
        """The tree at ``root`` whose listing has the sha256 ``expected`` (sha256:HEX), else TreeChanged."""
        path = os.path.join(root, LISTING)
        try:
            with open(path, "rb") as opened:
                data = opened.read(MAX_LISTING_BYTES + 1)
        except OSError as exc:
            raise TreeChanged(f"{LISTING} cannot be read ({exc.strerror or exc}): copy the export tree again") from None
        found = "sha256:" + hashlib.sha256(data).hexdigest()
        if found != expected.strip():
            raise TreeChanged(
                f"{LISTING} is {found}, not the {expected.strip()} the InferenceService pins: copy the "
                "export tree again, or export again and apply its InferenceService"
            )
        files = json.loads(data.decode("utf-8"))["sha256"]
        return cls(root, files)

    def check_all(self):
        """Every file of the tree as listed, no more and no fewer, else TreeChanged naming the first."""
        found = tree_files(self.root)
        for relative in sorted(set(found) | set(self.files)):
            self.compare(relative, found.get(relative))

    def compare(self, relative: str, digest):
        if relative not in self.files:
            raise TreeChanged(f"{relative} is not in {LISTING}: the tree holds a file the export did not write")
        if digest is None:
            raise TreeChanged(f"{relative} is missing: the export wrote it (copy the tree again)")
        if digest != self.files[relative]:
            raise TreeChanged(f"{relative} differs from what the export wrote: copy the tree again")

    def check_archive(self, name: str, digest=None, folder=None):
        """A model store entry as the engine opens it: ``digest``, the sha256 of the open .mar or .tar.gz, or
        ``folder``, the copy made of an unpacked directory archive (every file of it listed)."""
        relative = "model-store/" + name
        if folder is None:
            self.compare(relative, digest)
            return
        copied = {}
        for parent, _, names in os.walk(folder):
            for each in names:
                path = os.path.join(parent, each)
                with open(path, "rb") as source:
                    copied[relative + "/" + os.path.relpath(path, folder).replace(os.sep, "/")] = file_digest(source)
        for listed in sorted(set(copied) | {f for f in self.files if f.startswith(relative + "/")}):
            self.compare(listed, copied.get(listed))


def main(argv) -> int:
    """``ROOT DIGEST``: exit 0 when the tree at ROOT is the one DIGEST pins, else 1 and one line on stderr."""
    root, expected = argv
    try:
        Tree.pinned(root, expected).check_all()
    except (TreeChanged, ValueError, KeyError, OSError) as exc:
        print(f"tsctl tree check: {root}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
