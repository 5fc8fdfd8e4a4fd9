"""Which of the fork server's modules a model's folder would shadow (``shadowed``): a worker forked from the
server has the server's modules imported already, so a module of the same name on the model's
``PYTHONPATH`` (or, for what the server imported since it started, anywhere in the model's folder) would
not be the one the worker's handler imports, as it would be in a new interpreter. Such a worker is
spawned instead (serving/worker/fork_server.py). Standard library only (run by path with the fork server)."""

import os
import sys
from typing import List, Optional

AT_START = ("sitecustomize", "usercustomize")  # imported from sys.path by a new interpreter as it starts
VENDOR_WALK = 20000  # entries of a model's folder looked through for a vendored extra; beyond: spawned


def shadows(folder: str, imported: set) -> List[str]:
    """The top-level modules and packages in ``folder`` whose names are in ``imported``."""
    names = set()
    for entry in os.listdir(folder):
        stem, dot, suffix = entry.partition(".")
        if (not dot and os.path.isdir(os.path.join(folder, entry))) or suffix in ("py", "pyc") or ".so" in entry:
            names.add(stem)
    return sorted(names & imported)


def vendored(folder: str, names: set) -> List[str]:
    """The top-level modules and packages of ``names`` anywhere under ``folder`` (a handler may put a
    subfolder first on ``sys.path``); ``[folder]`` when it holds more than ``VENDOR_WALK`` entries."""
    seen = 0
    for root, folders, files in os.walk(folder):
        seen += len(folders) + len(files)
        if seen > VENDOR_WALK:
            return [folder]
        stems = {
            entry.partition(".")[0] for entry in files if entry.partition(".")[2] in ("py", "pyc") or ".so" in entry
        } | {entry for entry in folders if "." not in entry}
        if stems & names:
            return sorted(stems & names)
    return []


def shadowed(env: dict, cwd: str, preloaded: Optional[set] = None) -> List[str]:
    """What of this process's modules (by top-level name, and what a new interpreter imports at start:
    ``AT_START``) a folder on ``env``'s ``PYTHONPATH`` would bring instead, or a file there (a zip: not
    looked into). A folder that cannot be listed is passed over, as the interpreter imports nothing from it.
    What the extras brought (imported since ``PRELOAD``: TorchServe's worker has not imported them before
    its handler; ``preloaded``: the top-level names imported once PRELOAD was) is looked for in the whole of
    ``cwd``, the model's folder, too (``vendored``)."""
    imported = {name.partition(".")[0] for name in sys.modules} | set(AT_START)
    if preloaded is not None and imported - preloaded - set(AT_START):
        found = vendored(cwd, imported - preloaded - set(AT_START))
        if found:
            return found
    for folder in python_path(env, cwd):
        try:
            if os.path.isfile(folder):
                return [folder]
            found = shadows(folder, imported) if os.path.isdir(folder) else []
        except OSError:
            continue
        if found:
            return found
    return []


def python_path(env: dict, cwd: str) -> List[str]:
    """``PYTHONPATH`` as a new interpreter started in ``cwd`` puts it on ``sys.path``: each entry made
    absolute (an empty one is ``cwd``), ``lib`` and ``./lib/`` alike."""
    value = env.get("PYTHONPATH", "")
    return [os.path.abspath(os.path.join(cwd, entry)) for entry in value.split(os.pathsep)] if value else []
