"""The names handler code has imported from here since the first release: ``ClientError`` (raise it
from a hook to refuse one request), ``too_large``, ``Limits``, ``to_bytes``, ``to_text`` and
``content_type``. Each lives in the module named for what it does (errors.py, limits.py, items.py,
rows.py; protocol.py lists them all); this file keeps the old import path working.
"""

from .errors import ClientError, too_large
from .items import to_bytes, to_text
from .limits import Limits
from .rows import content_type

__all__ = ["ClientError", "Limits", "content_type", "to_bytes", "to_text", "too_large"]
