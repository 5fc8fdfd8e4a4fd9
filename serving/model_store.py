"""The model store's boundary: the one function that decides whether a name is an archive inside the store.

Every path that loads an archive by name asks ``store_entry``: a register's ``url``
(management.archive_for, REST and gRPC), load_models' entries and model_snapshot's ``marName``
at startup (ts_config, so ``tsctl serve`` too), and every archive of a store served without a config.

TorchServe 0.12's rule is that archives come from the model store (or from a URL matching
``allowed_urls``, downloaded into it): ModelArchive.downloadModel (frontend/archive/.../model/ModelArchive.java
lines 57-59) refuses a url holding ``..`` ("Relative path is not allowed in url"), takes the url's file name
(ArchiveUtils.getFilenameFromUrl, lines 96-103: FilenameUtils.getName) and loads ``model_store/NAME``,
404 ``Model not found at: URL`` when there is none (line 118). It does not resolve links: a link in the store
to an archive elsewhere loads (File.isFile follows it), and a url naming a directory anywhere on the machine
loads too when the store has no such file name (``new File(url).isDirectory()``, lines 85-100). The engine
keeps the rule and closes both ways round it: a name with a directory part (``sub/x.mar``, ``/abs/x.mar``)
is refused rather than read as its file name, and the entry's real path (every link resolved) must lie
inside the store's real path; either refusal is TorchServe's 404 for a url it refuses, with the reason.

A link can be swapped between that look and the reads that follow, so the look is not the boundary alone:
each archive of the store is then opened once within it (``Archive(path, within=store)``: the real path of
what was opened must lie inside the store, ``handlers/confined.py``), everything is read from that
opening, and a directory archive is copied out of the store through it, its links followed only inside.
"""

from pathlib import Path


class NotInStore(Exception):
    """A name that is no archive inside the model store; ``str()`` says why (empty: there is no such entry)."""

    def message(self, url: str) -> str:
        """TorchServe's words for a url it cannot find (ModelArchive.java line 118), then why."""
        return f"Model not found at: {url}" + (f" ({self})" if str(self) else "")


def store_entry(store: Path, name: str) -> Path:
    """``store / name`` when ``name`` is a file name of the store (no directory part, no ``..``) whose entry
    exists and whose real path, every link resolved, lies inside the store's real path; else ``NotInStore``."""
    if "/" in name or "\\" in name or name in ("", ".", ".."):
        raise NotInStore("an archive of the model store is named by its file name alone, with no directory")
    entry = Path(store) / name
    try:
        real, top = entry.resolve(strict=True), Path(store).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # none, a loop of links, a name the file system cannot hold
        raise NotInStore("") from None
    if top not in real.parents:
        raise NotInStore(f"{name} is a link that leads outside the model store: copy the archive into the store")
    return entry
