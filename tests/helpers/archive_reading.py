"""What a test reads of a built archive, through the toolkit's own ``Archive`` (handlers/archives.py), opened
for each call: its members, its manifest, one member's bytes, its handler record, its kind."""

from typing import List, Optional, Tuple

from handlers import archives, identity


def members(path) -> List[Tuple[str, int]]:
    with archives.opened(path) as found:
        return found.members


def manifest(path) -> dict:
    with archives.opened(path) as found:
        return found.manifest


def member(path, name: str, limit: int = archives.MAX_CONFIG_BYTES) -> Optional[bytes]:
    with archives.opened(path) as found:
        return found.read(name, limit)


def record(path) -> Optional[dict]:
    with archives.opened(path) as found:
        return identity.read(found)


def kind(path) -> str:
    with archives.opened(path) as found:
        return found.kind


def unpack(path, into):
    """The archive unpacked into ``into`` (``Archive.unpack``, with every check of a worker's unpacking)."""
    with archives.opened(path) as found:
        return found.unpack(into)
