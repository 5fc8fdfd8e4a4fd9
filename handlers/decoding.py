"""A request decoded once, into a ``Request``: its items and the shape its answer must take
(``parse_request`` for a TorchServe row, ``decode_request`` for a body and its HTTP headers).

    raw bytes / plain text                       -> one item,   answer
    {"data"|"b64"|<handler key>: item}           -> one item,   answer
    [item, ...]                                  -> N items,    [answer, ...]
    {"instances": [item, ...]}      (KServe v1)  -> N items,    {"predictions": [answer, ...]}
    {"inputs": [{"name", "shape", "datatype", "data"}]}  (KServe v2)
                                                 -> N items,    {"model_name", "outputs": [...]}

A KServe v2 body may come in the binary tensor extension (v2_binary.py); its tensor is read by
v2_tensors.py. Each of the request's limits (limits.py) is checked as it is read. Which of these shapes
a request came in is its ``form``: a ``Form`` member, compared by identity (``request.form is V2``).
"""

import enum
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from .errors import ClientError
from .json_body import is_list, read_json
from .limits import Limits, Meter, check_count, check_size, within
from .rows import JSON_TYPE, media_type, row_field, row_payload
from .v2_binary import attach, header_length, read_header, split_body
from .v2_tensors import NUMERIC, read_tensor, v2_outputs


class Form(enum.Enum):
    """The shape a request came in, and its answer goes back in (plain ``enum``: archives run on Python 3.8)."""

    SINGLE = "single"  # one item: its answer alone
    LIST = "list"  # a JSON list of items: the list of answers
    V1 = "v1"  # KServe v1 instances: {"predictions": [...]}
    V2 = "v2"  # KServe v2 inputs: {"model_name", "outputs": [...]}


SINGLE, LIST, V1, V2 = Form.SINGLE, Form.LIST, Form.V1, Form.V2


@dataclass
class Request:
    """One HTTP request: its items, the shape the answer must take, and for KServe v2 its id and
    how it wants its outputs: ``v2_binary_output`` is the request's ``binary_data_output``,
    ``v2_outputs`` the outputs it names, each with its ``binary_data`` (None: not said)."""

    items: List[Any]
    form: Form = SINGLE
    v2_id: Optional[str] = None
    v2_binary_output: bool = False
    v2_outputs: Optional[Dict[str, Optional[bool]]] = None


def parse_request(
    row: Any,
    item_keys: Sequence[str],
    v2_datatypes: Sequence[str] = ("BYTES",),
    limits: Limits = Limits(),
    headers: Optional[Mapping] = None,
    meter: Meter = within,
) -> Request:
    """Split one TorchServe row, of a request with these HTTP ``headers``, into items."""
    return decode_request(row_payload(row), headers, item_keys, v2_datatypes, limits, meter)


def decode_request(
    payload: Any,
    headers: Optional[Mapping],
    item_keys: Sequence[str],
    v2_datatypes: Sequence[str] = ("BYTES",),
    limits: Limits = Limits(),
    meter: Meter = within,
) -> Request:
    """A request body (bytes, text, or JSON TorchServe parsed already) and its HTTP headers, split
    into items. ``item_keys`` name the JSON fields that hold one item; ``v2_datatypes`` the KServe v2
    datatypes the handler takes (a numeric one: lists of numbers are read straight into arrays);
    ``limits`` bound the request; ``meter`` counts its values before they are parsed (``Meter``)."""
    check_size(payload, limits)
    length = header_length(headers)
    numeric = any(datatype in NUMERIC for datatype in v2_datatypes)
    if length is None:
        body = read_json(payload, limits, meter, numeric)
    else:
        header, binary = split_body(payload, length)
        body = read_header(header, limits, meter)
        attach(body["inputs"], binary, limits, "input", meter)
    request = _split(body, item_keys, v2_datatypes, limits)
    check_count(request.items, limits)
    return request


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


def _split(body: Any, item_keys: Sequence[str], v2_datatypes: Sequence[str], limits: Limits = Limits()) -> Request:
    if isinstance(body, dict):
        if "instances" in body:
            return Request(_item_list(body["instances"], "instances", limits), V1)
        if "inputs" in body and _looks_like_v2(body["inputs"]):
            return v2_request(body, v2_datatypes)
        for key in item_keys:
            if key in body:
                value = body[key]
                if is_list(value):
                    return Request(_item_list(value, key, limits), LIST)
                return Request([value], SINGLE)
        keys = ", ".join(sorted(body)) or "none"
        wanted = ", ".join(repr(k) for k in item_keys)
        raise ClientError(
            f"the JSON body has no input field (found keys: {keys}); send one of {wanted}, "
            "'instances' (KServe v1) or 'inputs' (KServe v2)"
        )
    if is_list(body):
        return Request(_item_list(body, "the body list", limits), LIST)
    if body is None:
        raise ClientError("the request body is empty")
    return Request([body], SINGLE)


def _item_list(value: Any, where: str, limits: Limits = Limits()) -> list:
    if not is_list(value):
        raise ClientError(f"{where} must be a list, got {type(value).__name__}")
    if not len(value):
        raise ClientError(f"{where} is empty: send at least one input")
    if not isinstance(value, list):  # an array of numbers: its rows, once they are known to be few
        check_count(value, limits)
        return list(value)
    return value


def _looks_like_v2(inputs: Any) -> bool:
    return isinstance(inputs, list) and bool(inputs) and all(isinstance(i, dict) for i in inputs)


def v2_request(body: dict, datatypes: Sequence[str]) -> Request:
    """A KServe v2 body's request: its input tensor's items, its id and how it wants its outputs."""
    items = read_tensor(body, datatypes)
    binary_output, outputs = v2_outputs(body)
    return Request(items, V2, v2_id=body.get("id"), v2_binary_output=binary_output, v2_outputs=outputs)
