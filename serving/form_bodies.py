"""A form body as TorchServe's frontend hands it to a worker (``InferenceRequestHandler.parseRequest``,
``NettyUtils.getFormData``): a ``multipart/form-data`` or ``application/x-www-form-urlencoded`` body is
one parameter per field, (name, content type, bytes): a file's with its part's content type, a plain
field's with none; any other body is one parameter, ``body`` (``ts_wire.Request.parameters``). So ``curl
-F data=@kitten.jpg`` reaches a handler's ``row["data"]`` as on TorchServe, and ``curl -d data=4`` its
``row["data"]`` = ``b"4"``. The body is bounded before it gets here (``max_request_size``,
serving/body_limit.py), and so is the number of its fields."""

import email.parser
import email.policy
from typing import List, Optional, Tuple
from urllib.parse import parse_qsl

URLENCODED, MULTIPART = "application/x-www-form-urlencoded", "multipart/form-data"
FILE_TYPE = "application/octet-stream"  # a file part without a Content-Type (Netty's default)


def parameters(content_type: str, body: bytes) -> Optional[List[Tuple[str, str, bytes]]]:
    """The body's fields as the worker's parameters, or None when it is not a form (``content_type``: the
    request's Content-Type header, parameters and all)."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == URLENCODED:
        pairs = "&".join(pair for pair in body.decode("utf-8", "replace").split("&") if "=" in pair)  # as Netty:
        fields = parse_qsl(pairs, keep_blank_values=True)  # a bare value ("curl -d 1") is no field at all
        return [(name, "", value.encode("utf-8")) for name, value in fields]
    if kind != MULTIPART:
        return None
    head = b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n"
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return []
    found = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name is None:
            continue
        data = part.get_payload(decode=True) or b""
        if part.get_filename() is None:
            found.append((str(name), "", data))
        else:
            found.append((str(name), part.get_content_type() if part.get("Content-Type") else FILE_TYPE, data))
    return found
