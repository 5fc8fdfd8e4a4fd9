"""Where things are: the repository's root, and short temporary directories."""

import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def short_tmp(prefix: str) -> Path:
    """A short path: TorchServe's worker sockets live under TEMP and unix socket paths are short."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
