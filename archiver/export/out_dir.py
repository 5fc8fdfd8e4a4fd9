"""An export's OUT directory (``export kserve``, ``export seldon``): checked before anything is written, then
written into a directory beside it and renamed into place. A failure leaves no OUT, or the previous one; an
OUT that already holds files is replaced only with --force, and never when an input of the export is in it."""

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Optional, Tuple

from ..errors import UserError


def check(out: Path, force: bool, inputs: Iterable[Tuple[str, Optional[str]]]):
    """Refuse an OUT that is a file or a link, one that holds files (without ``force``) and one that holds an
    input of the export (``(flag, path)`` pairs): replacing it would delete what is being exported."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UserError(f"{out} exists and is not a directory: choose another OUT")
    if not out.is_dir():
        return
    for flag, value in inputs:
        if value and Path(value).resolve().is_relative_to(out.resolve()):
            raise UserError(f"{flag} {value} is inside OUT {out}, which the export replaces: choose another OUT")
    if any(out.iterdir()) and not force:
        raise UserError(f"{out} exists and is not empty: pass --force to replace it, or choose another OUT")


@contextmanager
def written_beside(out: Path) -> Iterator[Path]:
    """A fresh directory beside ``out`` to write the export into; renamed to ``out`` when the block ends well,
    removed when it fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tsctl-", dir=out.parent))
    staging.chmod(0o777 & ~umask())  # mkdtemp's 0700 would become OUT's: a container's uid could not read it
    try:
        yield staging
        replace(out, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def umask() -> int:
    """The process's umask (read by setting it, then set back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def replace(out: Path, staging: Path):
    """Put ``staging`` where ``out`` is: renames on one filesystem, the previous OUT removed only after."""
    if not out.exists():
        staging.rename(out)
        return
    previous = Path(tempfile.mkdtemp(prefix=f".{out.name}.previous-", dir=out.parent))
    previous.rmdir()
    out.rename(previous)
    try:
        staging.rename(out)
    except BaseException:
        previous.rename(out)
        raise
    shutil.rmtree(previous, ignore_errors=True)


def moved(files: Iterable[Path], staging: Path, out: Path) -> list:
    """The written ``files``' paths once ``staging`` is ``out``."""
    return [out / Path(path).relative_to(staging) for path in files]
