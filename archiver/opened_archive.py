"""An archive opened for a command: the toolkit's ``Archive`` (handlers/archives.py, every check it makes on
opening), its ``ArchiveError`` raised again as the CLI's one-line ``UserError``. What a command reads of an
archive it reads from the ``Archive`` this yields, opened once."""

import contextlib
from typing import Iterator

from handlers import archives

from .errors import UserError


@contextlib.contextmanager
def opened(archive, within=None) -> Iterator[archives.Archive]:
    """``archive`` (a path, opened for the block, or an Archive) with its ArchiveError turned into a UserError;
    ``within``: the folder (a model store) it must lie in, its links not followed out of it."""
    try:
        with archives.opened(archive, within) as found:
            yield found
    except archives.ArchiveError as exc:
        raise UserError(str(exc)) from None
