"""Turning one TorchServe request row into items, and answers back into one response body.

Pure functions, no torch: every request shape TorchServe hands a worker ends up here.

A row is the dict TorchServe builds per HTTP request: ``{"body": ...}`` for a plain POST,
``{"data": ...}`` (or other field names) for multipart forms. The value is ``bytes``, ``str`` for
``text/*`` bodies, or already-parsed JSON for ``application/json`` bodies.

Accepted bodies (the answer's shape follows the question's):
    raw bytes / plain text                       -> one item,   answer
    {"data"|"b64"|<handler key>: item}           -> one item,   answer
    [item, ...]                                  -> N items,    [answer, ...]
    {"instances": [item, ...]}      (KServe v1)  -> N items,    {"predictions": [answer, ...]}
    {"inputs": [{"name", "shape", "datatype", "data"}]}  (KServe v2)
                                                 -> N items,    {"model_name", "outputs": [...]}
"""

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

SINGLE, LIST, V1, V2 = "single", "list", "v1", "v2"


class ClientError(Exception):
    """A problem with one request: answered with ``status`` and a JSON body, never a worker crash."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status

    def body(self) -> dict:
        return {"code": self.status, "type": "ClientError", "message": self.message}


@dataclass
class Request:
    """One HTTP request: its items, the shape the answer must take, and a v2 request's id."""

    items: List[Any]
    form: str = SINGLE
    v2_id: Optional[str] = None


def row_payload(row: Any) -> Any:
    """The request body inside a TorchServe row (``data`` or ``body``, else the only field)."""
    if not isinstance(row, dict):
        return row
    for key in ("data", "body"):
        if row.get(key) is not None:
            return row[key]
    values = [v for v in row.values() if v is not None]
    if len(values) == 1:
        return values[0]
    raise ClientError("the request has no body: send the input as the request body or a 'data' form field")


def maybe_json(payload: Any) -> Any:
    """Parse bytes or text that look like a JSON object or array; anything else is returned as is."""
    if isinstance(payload, (bytes, bytearray)):
        head = bytes(payload[:64]).lstrip()
        if head[:1] not in (b"{", b"["):
            return payload
        try:
            return json.loads(bytes(payload).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return payload
    if isinstance(payload, str) and payload.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(payload)
        except ValueError:
            return payload
    return payload


def parse_request(row: Any, item_keys: Sequence[str], v2_datatypes: Sequence[str] = ("BYTES",)) -> Request:
    """Split one row into items. ``item_keys`` name the JSON fields that hold one item;
    ``v2_datatypes`` the KServe v2 datatypes the handler takes."""
    body = maybe_json(row_payload(row))
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
    return Request(flat, V2, v2_id=body.get("id"))


def _flatten(data: list) -> list:
    out = []
    for value in data:
        if isinstance(value, list):
            out.extend(_flatten(value))
        else:
            out.append(value)
    return out


def to_bytes(item: Any, what: str = "input") -> bytes:
    """Raw bytes of one binary item: bytes as is; a base64 string (or ``{"b64": ...}``) decoded."""
    if isinstance(item, dict):
        for key in ("b64", "data", "bytes"):
            if key in item:
                return to_bytes(item[key], what)
        raise ClientError(f"{what} object must hold 'b64' or 'data', got keys: {', '.join(sorted(item)) or 'none'}")
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
    if isinstance(item, dict):
        for key in keys:
            if key in item:
                return to_text(item[key], what, keys)
        raise ClientError(f"{what} object must hold 'text', got keys: {', '.join(sorted(item)) or 'none'}")
    if isinstance(item, (bytes, bytearray)):
        try:
            item = bytes(item).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ClientError(f"{what} is not valid UTF-8 text (byte {exc.start})") from None
    if not isinstance(item, str):
        raise ClientError(f"{what} must be a string, got {type(item).__name__}")
    if not item.strip():
        raise ClientError(f"{what} is empty")
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
