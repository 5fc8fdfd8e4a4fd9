"""Turning one TorchServe request row into items, and answers back into one response body.

Pure functions, no torch: every request shape TorchServe hands a worker ends up here.

A row is the dict TorchServe builds per HTTP request: ``{"body": ...}`` for a plain POST,
``{"data": ...}`` (or other field names) for multipart forms. The value is ``bytes``, ``str`` for
``text/*`` bodies, or already-parsed JSON for ``application/json`` bodies (with
``decode_input_request=false``: always ``bytes``, the type in the request's headers). The text
handlers read a text body as one text, never as JSON (``text_request``).

Every request is bounded before it costs anything (``Limits``; each breach is a 413 naming the
``handler:`` setting): the body's size before it is parsed, the JSON's depth and number of values,
and the number of items.

Accepted bodies (the answer's shape follows the question's):
    raw bytes / plain text                       -> one item,   answer
    {"data"|"b64"|<handler key>: item}           -> one item,   answer
    [item, ...]                                  -> N items,    [answer, ...]
    {"instances": [item, ...]}      (KServe v1)  -> N items,    {"predictions": [answer, ...]}
    {"inputs": [{"name", "shape", "datatype", "data"}]}  (KServe v2)
                                                 -> N items,    {"model_name", "outputs": [...]}

KServe v2 requests in the binary tensor extension (JSON header + raw tensor bytes) are split by
v2binary.py and then read here like their JSON form (``parse_body``).
"""

import base64
import binascii
import json
import mimetypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

SINGLE, LIST, V1, V2 = "single", "list", "v1", "v2"
JSON_TYPE = "application/json"
SURROGATE = re.compile("[\ud800-\udfff]")


class ClientError(Exception):
    """A problem with one request: answered with ``status`` and a JSON body, never a worker crash."""

    kind = "ClientError"

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status

    def body(self) -> dict:
        return {"code": self.status, "type": self.kind, "message": self.message}


def too_large(subject: str, value: int, unit: str, setting: str, limit: int) -> ClientError:
    """The 413 for a request above one of its limits, naming the ``handler:`` setting that sets it:
    ``too_large("the text is", 200000, "characters", ...)``."""
    return ClientError(f"{subject} {value:,} {unit}, above the limit of {limit:,} (handler.{setting})", 413)


@dataclass(frozen=True)
class Limits:
    """What one request may hold; each is a ``handler:`` setting of the same name."""

    max_items: int = 64
    max_body_bytes: int = 32 << 20
    max_json_depth: int = 32
    max_json_values: int = 100_000


@dataclass
class Request:
    """One HTTP request: its items, the shape the answer must take, and for KServe v2 its id and
    how it wants its outputs: ``v2_binary_output`` is the request's ``binary_data_output``,
    ``v2_outputs`` the outputs it names, each with its ``binary_data`` (None: not said)."""

    items: List[Any]
    form: str = SINGLE
    v2_id: Optional[str] = None
    v2_binary_output: bool = False
    v2_outputs: Optional[Dict[str, Optional[bool]]] = None


def row_payload(row: Any) -> Any:
    """The request body inside a TorchServe row (``data`` or ``body``, else the only field)."""
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


def text_request(row: Any, headers: Optional[Mapping], limits: Limits = Limits()) -> Optional[Request]:
    """The request of a body that is one text, never to be read as JSON, or None for other bodies.

    A ``str`` is a body TorchServe decoded itself (``decode_input_request=true``): a ``text/*`` one,
    or the JSON string of an ``application/json`` one; reading it as JSON again would parse a text
    that happens to look like JSON. ``bytes`` (``decode_input_request=false``) are text when the
    body's Content-Type is ``text/*``; an ``application/json`` body holding a JSON string is that
    string, as TorchServe would have decoded it. Everything else (JSON bodies, raw bytes without a
    text type, forms) is read by ``parse_request``."""
    field, payload = row_field(row)
    if isinstance(payload, str):
        text = payload
    elif isinstance(payload, (bytes, bytearray)):
        kind = media_type(headers, field)
        if kind.startswith("text/"):
            text = payload
        elif kind == JSON_TYPE and bytes(payload[:64]).lstrip()[:1] == b'"':
            check_size(payload, limits)
            try:
                text = json.loads(bytes(payload).decode("utf-8"))
            except ValueError:  # not JSON after all: read as before
                return None
            if not isinstance(text, str):
                return None
        else:
            return None
    else:
        return None
    check_size(text, limits)
    return Request([text], SINGLE)


def maybe_json(payload: Any, limits: Limits = Limits()) -> Any:
    """Parse bytes or text that look like a JSON object or array; anything else is returned as is.
    JSON nested too deep for the parser is refused (413), never a RecursionError."""
    if isinstance(payload, (bytes, bytearray)):
        head = bytes(payload[:64]).lstrip()
        if head[:1] not in (b"{", b"["):
            return payload
        try:
            text = bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            return payload
    elif isinstance(payload, str) and payload.lstrip()[:1] in ("{", "["):
        text = payload
    else:
        return payload
    try:
        return json.loads(text)
    except RecursionError:
        raise too_deep(limits.max_json_depth) from None
    except ValueError:
        return payload


def too_deep(limit: int) -> ClientError:
    return ClientError(f"the JSON body is nested deeper than the limit of {limit} levels (handler.max_json_depth)", 413)


def check_json(value: Any, limits: Limits):
    """Refuse JSON nested deeper than ``max_json_depth`` or holding more than ``max_json_values``
    values. Walked without recursion; a container is counted before its children are visited, so a
    list of millions is refused at once."""
    if not isinstance(value, (list, dict)):
        return
    count, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limits.max_json_depth:
            raise too_deep(limits.max_json_depth)
        count += len(node)
        if count > limits.max_json_values:
            raise too_large("the JSON body holds", count, "values", "max_json_values", limits.max_json_values)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))


def check_size(payload: Any, limits: Limits):
    if isinstance(payload, (bytes, bytearray, str)) and len(payload) > limits.max_body_bytes:
        raise too_large("the request body is", len(payload), "bytes", "max_body_bytes", limits.max_body_bytes)


def parse_request(
    row: Any, item_keys: Sequence[str], v2_datatypes: Sequence[str] = ("BYTES",), limits: Limits = Limits()
) -> Request:
    """Split one row into items. ``item_keys`` name the JSON fields that hold one item;
    ``v2_datatypes`` the KServe v2 datatypes the handler takes; ``limits`` bound the request."""
    payload = row_payload(row)
    check_size(payload, limits)
    body = maybe_json(payload, limits)
    check_json(body, limits)
    return parse_body(body, item_keys, v2_datatypes, limits)


def parse_body(body: Any, item_keys: Sequence[str], v2_datatypes: Sequence[str], limits: Limits) -> Request:
    """Split a body already read (and checked against the JSON limits) into items."""
    request = _split(body, item_keys, v2_datatypes)
    check_count(request.items, limits)
    return request


def check_count(items: list, limits: Limits):
    if len(items) > limits.max_items:
        raise too_large("the request holds", len(items), "inputs", "max_items", limits.max_items)


def _split(body: Any, item_keys: Sequence[str], v2_datatypes: Sequence[str]) -> Request:
    if isinstance(body, dict):
        if "instances" in body:
            return Request(_item_list(body["instances"], "instances"), V1)
        if "inputs" in body and _looks_like_v2(body["inputs"]):
            return _parse_v2(body, v2_datatypes)
        for key in item_keys:
            if key in body:
                value = body[key]
                if isinstance(value, list):
                    return Request(_item_list(value, key), LIST)
                return Request([value], SINGLE)
        keys = ", ".join(sorted(body)) or "none"
        wanted = ", ".join(repr(k) for k in item_keys)
        raise ClientError(
            f"the JSON body has no input field (found keys: {keys}); send one of {wanted}, "
            "'instances' (KServe v1) or 'inputs' (KServe v2)"
        )
    if isinstance(body, list):
        return Request(_item_list(body, "the body list"), LIST)
    if body is None:
        raise ClientError("the request body is empty")
    return Request([body], SINGLE)


def _item_list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ClientError(f"{where} must be a list, got {type(value).__name__}")
    if not value:
        raise ClientError(f"{where} is empty: send at least one input")
    return value


def _looks_like_v2(inputs: Any) -> bool:
    return isinstance(inputs, list) and bool(inputs) and all(isinstance(i, dict) for i in inputs)


def _parse_v2(body: dict, datatypes: Sequence[str]) -> Request:
    inputs = body["inputs"]
    if len(inputs) != 1:
        raise ClientError(f"KServe v2 'inputs' must hold exactly one tensor, got {len(inputs)}")
    tensor = inputs[0]
    parameters = tensor.get("parameters")
    if isinstance(parameters, dict) and "binary_data_size" in parameters:
        raise ClientError(
            "KServe v2 input has 'binary_data_size' but the request has no Inference-Header-Content-Length "
            "header: send the JSON header's length in it (binary tensor extension), or the values in 'data'"
        )
    missing = [k for k in ("name", "shape", "datatype", "data") if k not in tensor]
    if missing:
        raise ClientError(f"KServe v2 input is missing {', '.join(missing)}")
    shape, datatype, data = tensor["shape"], tensor["datatype"], tensor["data"]
    if not (isinstance(shape, list) and shape and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise ClientError(f"KServe v2 input 'shape' must be a list of non-negative integers, got {shape!r}")
    if not isinstance(data, list):
        raise ClientError(f"KServe v2 input 'data' must be a list, got {type(data).__name__}")
    flat = _flatten(data)
    count = 1
    for dim in shape:
        count *= dim
    if count != len(flat):
        raise ClientError(f"KServe v2 input shape {shape} holds {count} values but 'data' has {len(flat)}")
    if datatype not in datatypes:
        wanted = ", ".join(datatypes)
        raise ClientError(f"KServe v2 datatype {datatype!r} is not supported by this model; send {wanted}")
    if not flat:
        raise ClientError("KServe v2 input 'data' is empty: send at least one input")
    if datatype != "BYTES":  # a numeric tensor: one item per row of the first dimension
        rows, size = shape[0], count // shape[0]
        flat = [{"shape": shape[1:], "data": flat[i * size : (i + 1) * size]} for i in range(rows)]
    binary_output, outputs = _v2_outputs(body)
    return Request(flat, V2, v2_id=body.get("id"), v2_binary_output=binary_output, v2_outputs=outputs)


def _v2_outputs(body: dict):
    """How a v2 request wants its outputs: its ``binary_data_output`` and the outputs it names, each
    with its ``binary_data`` (None when it does not say), or None when it names none."""
    parameters = {} if body.get("parameters") is None else body["parameters"]
    if not isinstance(parameters, dict):
        raise ClientError(f"KServe v2 'parameters' must be an object, got {type(parameters).__name__}")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise ClientError(f"KServe v2 parameter 'binary_data_output' must be true or false, got {binary_output!r}")
    outputs = body.get("outputs")
    if not outputs:
        return binary_output, None
    if not (isinstance(outputs, list) and all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs)):
        raise ClientError("KServe v2 'outputs' must be a list of objects, each with a 'name'")
    named = {}
    for output in outputs:
        what = f"KServe v2 output {output['name']!r}"
        options = {} if output.get("parameters") is None else output["parameters"]
        if not isinstance(options, dict):
            raise ClientError(f"{what}: 'parameters' must be an object")
        if "classification" in options:
            raise ClientError(f"{what}: 'classification' (the classification extension) is not supported")
        binary = options.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise ClientError(f"{what}: 'binary_data' must be true or false, got {binary!r}")
        named[output["name"]] = binary
    return binary_output, named


def _flatten(data: list) -> list:
    """Nested lists to one flat list, in order, without recursion."""
    out, stack = [], [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            out.append(value)
        else:
            stack.pop()
    return out


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


def encode_answer(
    request: Request, answers: list, model_name: str, v2_output: Optional[dict] = None, model_version=None
) -> Any:
    """The response body for one request, shaped like its question."""
    if request.form == SINGLE:
        return answers[0]
    if request.form == LIST:
        return answers
    if request.form == V1:
        return {"predictions": answers}
    output = v2_output or {
        "name": "output-0",
        "shape": [len(answers)],
        "datatype": "BYTES",
        "data": [json.dumps(a) for a in answers],
    }
    body = {"model_name": model_name, "outputs": [output]}
    if model_version is not None:
        body["model_version"] = str(model_version)
    if request.v2_id is not None:
        body["id"] = request.v2_id
    return body


def content_type(path) -> str:
    """The Content-Type a file is sent with (``tsctl predict``, ``run``, ``bench``, ``--golden``):
    what its suffix says (``.jpg`` image/jpeg, ``.webp`` image/webp, ``.txt`` text/plain, ``.json``
    application/json), else ``application/octet-stream``."""
    return mimetypes.guess_type(Path(path).name)[0] or "application/octet-stream"
