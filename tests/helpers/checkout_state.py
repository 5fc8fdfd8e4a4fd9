"""The checkout's working state: what a user's own commands write in the repository's root (the README's
flow writes ``config/``, ``model-store/``, ``.tsctl/`` and the build folder in ``samples/``; the docs'
blocks ``deploy/`` and the rest of ``.gitignore``'s list), and any file a command leaves directly in the root.

No test may read or write it: each test runs in a directory of its own (``tests/conftest.py``), and a test
that changes it anyway fails, naming what it changed. ``make demo`` runs before ``make test`` in CI
(``.ci/run``), so a test that still reads the checkout's ``config/`` meets a real one there."""

import os
from pathlib import Path
from typing import Dict, List, Tuple

from helpers.paths import ROOT

# Directories of the root a user's commands write into (the README's flow, the docs' blocks)
SAMPLES_BUILD = os.path.join("samples", "build")  # make demo's models (a path, not cited: a fresh clone has none)
WORKING_STATE = ("config", "model-store", ".tsctl", "deploy", SAMPLES_BUILD, "logs", "golden", "seldon")
# What the suite itself may keep in the root: caches, the environment, build metadata
NOT_STATE = {".git", ".venv", ".runtimes", ".pytest_cache", ".ruff_cache", ".tox", "__pycache__"}

State = Dict[str, Tuple[int, int]]  # relative path -> (size, mtime in ns); directories with size -1


def snapshot(root: Path = ROOT) -> State:
    """Every entry directly in ``root`` (but the caches of NOT_STATE) and every file below WORKING_STATE's
    directories: cheap enough to take around every test (a few dozen stat calls)."""
    state: State = {}
    for entry in os.scandir(root):
        if entry.name in NOT_STATE or entry.name.endswith(".egg-info"):
            continue
        info = entry.stat(follow_symlinks=False)
        state[entry.name] = (-1 if entry.is_dir(follow_symlinks=False) else info.st_size, info.st_mtime_ns)
    for name in WORKING_STATE:
        top = root / name
        for folder, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d not in NOT_STATE]
            for file in files:
                path = Path(folder) / file
                try:
                    info = path.lstat()
                except FileNotFoundError:  # removed while we looked: the next snapshot sees it gone
                    continue
                state[str(path.relative_to(root))] = (info.st_size, info.st_mtime_ns)
    return state


def changes(before: State, after: State) -> List[str]:
    """What differs, one phrase per path: written, removed, changed. A file directly in the root that was
    there before only counts when it goes: it may be the user's own log of this very run
    (`make test > test.log`), which grows while the tests run."""
    found = [f"{path} written" for path in sorted(after.keys() - before.keys())]
    found += [f"{path} removed" for path in sorted(before.keys() - after.keys())]
    found += [
        f"{path} changed"
        for path in sorted(before.keys() & after.keys())
        if before[path] != after[path]
        and before[path][0] != -1  # a directory's mtime moves with its files
        and os.sep in path  # below WORKING_STATE; a root file's content is the user's (see above)
    ]
    return found
