"""A form body as TorchServe's frontend hands it to a worker (``InferenceRequestHandler.parseRequest``,
``NettyUtils.getFormData``): a ``multipart/form-data`` or ``application/x-www-form-urlencoded`` body is
one parameter per field, (name, content type, bytes): a file's with its part's content type, a plain
field's with none; any other body is one parameter, ``body`` (``ts_wire.RequestInput.parameters``). So ``curl
-F data=@kitten.jpg`` reaches a handler's ``row["data"]`` as on TorchServe, and ``curl -d data=4`` its
``row["data"]`` = ``b"4"``. The body is bounded before it gets here (``max_request_size``,
serving/engine/body_limit.py); its fields at most ``MAX_FIELDS``, counted before any is parsed (past it the
client gets 400: TorchServe has no such bound, and 60,000 fields take seconds to parse)."""

from typing import Dict, List, Optional, Tuple
from urllib.parse import parse_qsl

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

URLENCODED, MULTIPART = "application/x-www-form-urlencoded", "multipart/form-data"
MAX_FIELDS = 1000  # fields of one form body (Starlette's default max_fields): past it 400, nothing parsed
FILE_TYPE = "application/octet-stream"  # a file part without a Content-Type (Netty's default)


class FormError(ValueError):
    """A form body the engine does not read: one line for the client's 400."""


def parameters(content_type: str, body: bytes) -> Optional[List[Tuple[str, str, bytes]]]:
    """The body's fields as the worker's parameters, or None when it is not a form (``content_type``: the
    request's Content-Type header, parameters and all); FormError past ``MAX_FIELDS``. python-multipart's
    streaming parser: a 6 MB file part in 30 ms, 1,000 fields in about 60 ms."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind not in (URLENCODED, MULTIPART):
        return None
    boundary = parse_options_header(content_type)[1].get(b"boundary")
    fields = body.count(b"&") + 1 if kind == URLENCODED else body.count(b"--" + (boundary or b"-")) - 1
    if fields > MAX_FIELDS:  # counted before any is parsed: a parse of each costs time on the event loop
        raise FormError(
            f"the form body has {fields} fields, more than the {MAX_FIELDS} a request may have: send "
            "the data as one field or as the request's body"
        )
    if kind == URLENCODED:
        pairs = "&".join(pair for pair in body.decode("utf-8", "replace").split("&") if "=" in pair)  # as Netty:
        fields = parse_qsl(pairs, keep_blank_values=True)  # a bare value ("curl -d 1") is no field at all
        return [(name, "", value.encode("utf-8")) for name, value in fields]
    found = []
    for headers, data in parts(boundary, body):
        _, disposition = parse_options_header(headers.get(b"content-disposition", b""))
        name = disposition.get(b"name")
        if name is None:
            continue
        if b"filename" not in disposition:
            found.append((name.decode("utf-8", "replace"), "", data))
        else:
            given = parse_options_header(headers[b"content-type"])[0] if b"content-type" in headers else b""
            found.append((name.decode("utf-8", "replace"), given.decode("latin-1") or FILE_TYPE, data))
    return found


def parts(boundary: Optional[bytes], body: bytes) -> List[Tuple[Dict[bytes, bytes], bytes]]:
    """A multipart body's parts: (headers by lower-case name, data) each; none when it has no boundary or
    cannot be read (the handler then gets no parameter, and says what it missed)."""
    if not boundary:
        return []
    found: List[Tuple[Dict[bytes, bytes], bytes]] = []
    part: Dict[str, list] = {}

    def begin():
        part.update(headers={}, data=[], field=[], value=[])

    def header_end():
        part["headers"][b"".join(part["field"]).lower()] = b"".join(part["value"])
        part["field"], part["value"] = [], []

    callbacks = {
        "on_part_begin": begin,
        "on_header_field": lambda data, start, end: part["field"].append(data[start:end]),
        "on_header_value": lambda data, start, end: part["value"].append(data[start:end]),
        "on_header_end": header_end,
        "on_part_data": lambda data, start, end: part["data"].append(data[start:end]),
        "on_part_end": lambda: found.append((part["headers"], b"".join(part["data"]))),
    }
    try:
        parser = MultipartParser(boundary, callbacks)
        parser.write(body)
        parser.finalize()
    except MultipartParseError:
        return []
    return found
