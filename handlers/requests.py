"""The names handler code has imported from here since the first release: ``ClientError`` (raise it
from a hook to refuse one request), ``too_large``, ``Limits``, ``to_bytes``, ``to_text`` and
``content_type``. They live in ``protocol.py``, with everything else about request bodies and
answers; new code imports them from there.
"""

from .protocol import ClientError, Limits, content_type, to_bytes, to_text, too_large

__all__ = ["ClientError", "Limits", "content_type", "to_bytes", "to_text", "too_large"]
