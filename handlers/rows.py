"""What TorchServe hands a handler for one request, and the media types bodies are sent with: the body
inside a row (``row_payload``, ``row_field``), a field's media type from the request's headers
(``media_type``), and the Content-Type a file is sent with (``content_type``).
"""

import mimetypes
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

from .errors import ClientError

JSON_TYPE = "application/json"
OCTET_STREAM = "application/octet-stream"


def row_payload(row: Any) -> Any:
    """The request body inside a TorchServe row (``data`` or ``body``, else the only field).

    A row is the dict TorchServe builds per HTTP request: ``{"body": ...}`` for a plain POST,
    ``{"data": ...}`` (or other field names) for multipart forms. The value is ``bytes``, ``str`` for
    ``text/*`` bodies, or already-parsed JSON for ``application/json`` bodies (with
    ``decode_input_request=false``: always bytes, the type in the request's headers)."""
    return row_field(row)[1]


def row_field(row: Any) -> Tuple[Optional[str], Any]:
    """(field name, value) of the request body inside a TorchServe row; no name for a bare value."""
    if not isinstance(row, dict):
        return None, row
    for key in ("data", "body"):
        if row.get(key) is not None:
            return key, row[key]
    fields = [(k, v) for k, v in row.items() if v is not None]
    if len(fields) == 1:
        return fields[0]
    raise ClientError("the request has no body: send the input as the request body or a 'data' form field")


def media_type(headers: Optional[Mapping], field: Optional[str] = None) -> str:
    """The media type of a row's ``field``, lower-case and without parameters ('' when unknown).
    TorchServe records each field's own type in the request's headers under the field's name
    (``{"body": {"content-type": "text/plain"}}``); the request's Content-Type header (any letter
    case) is the fallback."""
    if not headers:
        return ""
    value = None
    own = headers.get(field) if field else None
    if isinstance(own, Mapping):
        value = next((v for k, v in own.items() if str(k).lower() == "content-type"), None)
    if not value:
        value = next((v for k, v in headers.items() if isinstance(k, str) and k.lower() == "content-type"), None)
    return str(value or "").split(";", 1)[0].strip().lower()


def content_type(path) -> str:
    """The Content-Type a file is sent with (``tsctl predict``, ``run``, ``bench``, ``--golden``):
    what its suffix says (``.jpg`` image/jpeg, ``.webp`` image/webp, ``.txt`` text/plain, ``.json``
    application/json), else ``application/octet-stream``."""
    name = Path(path).name
    return IMAGE_TYPES.get(Path(name).suffix.lower()) or mimetypes.guess_type(name)[0] or OCTET_STREAM


# The formats the image handler opens (settings.SAFE_FORMATS), by suffix, the same on every machine: Python's
# own table (all mimetypes has without a system mime.types, as in slim containers) lacks .webp before 3.13
# and says image/x-ms-bmp for .bmp before 3.11, and a system mime.types may say otherwise again.
IMAGE_TYPES = {
    **dict.fromkeys((".jpg", ".jpeg", ".jpe", ".jfif"), "image/jpeg"),
    ".png": "image/png",
    ".gif": "image/gif",
    ".bmp": "image/bmp",
    ".webp": "image/webp",
    ".tif": "image/tiff",
    ".tiff": "image/tiff",
    ".ico": "image/vnd.microsoft.icon",
    ".tga": "image/x-tga",
    ".ppm": "image/x-portable-pixmap",
    ".pgm": "image/x-portable-graymap",
    ".pbm": "image/x-portable-bitmap",
    ".pnm": "image/x-portable-anymap",
}
