"""One item's value, as a handler reads it: raw bytes (``to_bytes``: bytes as they are, base64 decoded)
or text (``to_text``: UTF-8 decoded, checked), unwrapped from ``{"b64": ...}``, ``{"text": ...}``.
"""

import base64
import binascii
import re
from typing import Any, Sequence

from .errors import ClientError

SURROGATE = re.compile("[\ud800-\udfff]")


def unwrap(item: Any, keys: Sequence[str], what: str, wanted: str) -> Any:
    """``{"b64": {"data": x}}`` -> x: the value under the first of ``keys``, as deep as it goes."""
    while isinstance(item, dict):
        key = next((k for k in keys if k in item), None)
        if key is None:
            found = ", ".join(sorted(map(str, item))) or "none"
            raise ClientError(f"{what} object must hold {wanted}, got keys: {found}")
        item = item[key]
    return item


def to_bytes(item: Any, what: str = "input") -> bytes:
    """Raw bytes of one binary item: bytes as is; a base64 string (or ``{"b64": ...}``) decoded."""
    item = unwrap(item, ("b64", "data", "bytes"), what, "'b64' or 'data'")
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if isinstance(item, str):
        text = item.strip()
        if text.startswith("data:") and "," in text:  # data URL
            text = text.split(",", 1)[1]
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ClientError(f"{what} is a string but not valid base64") from None
    raise ClientError(f"{what} must be bytes or a base64 string, got {type(item).__name__}")


def to_text(item: Any, what: str = "input", keys: Sequence[str] = ("text", "data", "inputs")) -> str:
    """One text item as ``str``: UTF-8 bytes decoded, ``{"text": ...}`` unwrapped."""
    item = unwrap(item, keys, what, "'text'")
    if isinstance(item, (bytes, bytearray)):
        try:
            item = bytes(item).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ClientError(f"{what} is not valid UTF-8 text (byte {exc.start})") from None
    if not isinstance(item, str):
        raise ClientError(f"{what} must be a string, got {type(item).__name__}")
    if not item.strip():
        raise ClientError(f"{what} is empty")
    surrogate = SURROGATE.search(item)
    if surrogate:  # JSON's "\ud800" escapes can carry them; no UTF-8 encoder takes them
        raise ClientError(f"{what} holds an unpaired surrogate (U+{ord(surrogate.group()):04X}) at {surrogate.start()}")
    return item
