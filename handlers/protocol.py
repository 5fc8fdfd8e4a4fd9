"""The wire, in one place: request bodies decoded into items, answers encoded back, and the status
every failure gets. No torch; numpy is imported only when a numeric tensor is read or written (tsctl's
CLI imports this module, through ``handlers.requests``, and loads no numpy).

**Requests** (``parse_request`` for a TorchServe row, ``decode_request`` for a body and its HTTP
headers) are decoded once into a ``Request``: its items and the shape its answer must take.

    raw bytes / plain text                       -> one item,   answer
    {"data"|"b64"|<handler key>: item}           -> one item,   answer
    [item, ...]                                  -> N items,    [answer, ...]
    {"instances": [item, ...]}      (KServe v1)  -> N items,    {"predictions": [answer, ...]}
    {"inputs": [{"name", "shape", "datatype", "data"}]}  (KServe v2)
                                                 -> N items,    {"model_name", "outputs": [...]}

A KServe v2 request may come in the binary tensor extension (Triton's binary data; tritonclient's
``set_data_from_numpy`` default, kserve's ``InferInput(binary_data=True)``): the HTTP header
``Inference-Header-Content-Length: L``, L bytes of the JSON above, then the raw data of each input
that has ``"parameters": {"binary_data_size": K}`` instead of ``data``, input after input:

    BYTES     each element as a 4-byte little-endian unsigned length, then its bytes
    numeric   the values raw, little-endian, row-major (FP16/32/64, INT8-64, UINT8-64; BOOL: 1 byte)

A v2 tensor of shape ``[N, ...]`` is N items. BYTES elements are ``bytes`` (binary) or the JSON value
(JSON). A numeric row is an ``np.ndarray`` of shape ``[...]`` and the declared datatype: read from
the wire's bytes with ``np.frombuffer`` (a view of the body, no copy) or from JSON's numbers in one
``np.asarray``, never a list of Python numbers. Sizes are checked before anything is built from them:
one that does not add up (a lying header length or ``binary_data_size``, a truncated body, an element
length past the end, numeric bytes that are not a whole number of values) is that request's 400.

**Limits** (``Limits``; each breach is a 413 naming the ``handler:`` setting): the body's size
before it is parsed, the JSON's depth and number of values, the number of items, and a binary
tensor's element count (from its shape, before its data is read).

**Answers** are encoded once (``encode_answers``) into the body and headers of the protocol the
question came in: JSON (an ``np.ndarray`` answer becomes lists there, at the very end), or, when a
v2 request asks (``binary_data_output``, or the ``binary_data`` of the output it names), the binary
extension: the JSON header with each output's ``binary_data_size`` and no ``data``, then each
output's raw bytes (``ndarray.tobytes()``), and the header's length in the response's
``Inference-Header-Content-Length``.

**Errors.** ``ClientError(message, status)`` is one request's refusal, answered with its status and
``{"code", "type", "message"}``. Any other exception gets its status from ``STATUS``, by where it
was raised (``error_for``): reading or decoding a request (400; 413 for input too deep or too big to
hold), the model failing on one request (500 ``InferenceError``; 507 out of memory), a handler's
entry point failing for a whole batch (TorchServe's 503 "Prediction failed", 507 "Out of
resources") or a worker dying (500 "Worker died.").

**The client side** (the KServe transformer calling its predictor, ``tsctl verify`` calling a
server): ``encode_request`` builds a v1/v2 request (an array as a v2 tensor in the binary extension)
and ``decode_answers`` reads the answers back, numeric outputs as arrays.
"""

import base64
import binascii
import json
import mimetypes
import re
import secrets
import struct
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

SINGLE, LIST, V1, V2 = "single", "list", "v1", "v2"
JSON_TYPE = "application/json"
OCTET_STREAM = "application/octet-stream"
HEADER = "Inference-Header-Content-Length"
NUMERIC = {  # v2 datatype -> numpy dtype of its binary form
    "BOOL": "|b1",
    "UINT8": "|u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "INT8": "|i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
}
DIGITS = re.compile(r"[0-9]{1,18}")
MAX_DIMS = 64  # numpy's own limit on a shape's dimensions
MAX_DIM = (1 << 63) - 1  # one dimension: what an int64 holds (a shape of 1,000-digit numbers is refused unmultiplied)
MAX_DIGITS = 4300  # a JSON number of more digits costs quadratic time to parse (Python's own int limit)
LONG_INT = re.compile(r"[0-9]{19}")
LONG_NUMBER = re.compile(r"(?<![0-9])[0-9]{%d}" % (MAX_DIGITS + 1))  # from a run's start: linear
JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
NUMBER_LIST = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|\[[-+0-9.eE,\s]+\]')  # a string, or a list of numbers
JSON_SCALARS = frozenset((str, int, float, bool, type(None)))
SURROGATE = re.compile("[\ud800-\udfff]")


def numpy():
    """numpy, imported on first use (see the module docstring)."""
    import numpy

    return numpy


# ---- errors and their statuses -------------------------------------------------------------------------
class ClientError(Exception):
    """A problem with one request: answered with ``status`` and a JSON body, never a worker crash."""

    kind = "ClientError"
    headers: Dict[str, str] = {}  # sent with the answer (Busy: Retry-After)

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status

    def body(self) -> dict:
        return {"code": self.status, "type": self.kind, "message": self.message}


class InferenceError(ClientError):
    """The model failed on one request's inputs (the 500 that request gets, not a client mistake)."""

    kind = "InferenceError"

    def __init__(self, message: str, status: int = 500):
        super().__init__(message, status)


class ServerError(ClientError):
    """A batch or a worker that failed as a whole, in the words of TorchServe's frontend."""

    kind = "InternalServerException"


class Busy(ClientError):
    """A request within its own limits that does not fit beside the rest of its batch (the batch's
    budget, handlers/base.py): 503 with ``Retry-After``; sent again, it is read in another batch."""

    kind = "ServiceUnavailable"
    headers = {"Retry-After": "1"}

    def __init__(self, message: str, status: int = 503):
        super().__init__(message, status)


READ, INFERENCE, BATCH, WORKER = "read", "inference", "batch", "worker"

# Where an exception was raised -> (exception type, status, error class, message or None for the
# exception's own words); the first row whose type matches wins. A ClientError keeps its own status.
STATUS = {
    READ: (  # parsing a request or decoding one of its items: the input is at fault
        (RecursionError, 413, ClientError, "it is nested too deeply"),
        (MemoryError, 413, ClientError, "it needs more memory than the worker has"),
        (BaseException, 400, ClientError, None),
    ),
    INFERENCE: (  # preprocess/inference/postprocess failed for one request run alone
        (MemoryError, 507, InferenceError, "out of memory"),
        (BaseException, 500, InferenceError, None),
    ),
    BATCH: (  # a handler's entry point failed for a whole batch (TorchServe's Service.predict)
        (MemoryError, 507, ServerError, "Out of resources"),
        (BaseException, 503, ServerError, "Prediction failed"),
    ),
    WORKER: ((BaseException, 500, ServerError, "Worker died."),),  # what would end a worker process
}


def out_of_memory(exc: BaseException) -> bool:
    """MemoryError, or torch's (CUDA) OutOfMemoryError, which TorchServe answers 507 as well."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or "CUDA out of memory" in str(exc)


def error_for(exc: BaseException, stage: str = READ, what: str = "") -> ClientError:
    """The error a request gets for ``exc`` raised at ``stage`` (``STATUS``); ``what`` prefixes the
    message (``"the request could not be read"``)."""
    if isinstance(exc, ClientError):
        return forget(exc)
    kind = MemoryError if out_of_memory(exc) else type(exc)
    _, status, error_class, words = next(row for row in STATUS[stage] if issubclass(kind, row[0]))
    message = words or f"{type(exc).__name__}: {exc}"
    return error_class(f"{what}: {message}" if what else message, status)


def forget(error: BaseException) -> BaseException:
    """``error`` without its traceback and chained exceptions: a refusal kept until its batch is
    answered must not keep the frames that read the request, and with them its parsed body (770 MB
    for a 32 MiB ``[[],[],...]``)."""
    error.__traceback__ = error.__context__ = error.__cause__ = None
    return error


def encode_error(error: ClientError) -> Tuple[bytes, Dict[str, str]]:
    """A refused request's body and headers."""
    return to_json(error.body()), {"Content-Type": JSON_TYPE, **error.headers}


def too_large(subject: str, value: int, unit: str, setting: str, limit: int) -> ClientError:
    """The 413 for a request above one of its limits, naming the ``handler:`` setting that sets it:
    ``too_large("the text is", 200000, "characters", ...)``."""
    return ClientError(f"{subject} {value:,} {unit}, above the limit of {limit:,} (handler.{setting})", 413)


def too_deep(limit: int) -> ClientError:
    return ClientError(f"the JSON body is nested deeper than the limit of {limit} levels (handler.max_json_depth)", 413)


# ---- limits --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """What one request may hold; each is a ``handler:`` setting of the same name."""

    max_items: int = 64
    max_body_bytes: int = 32 << 20
    max_json_depth: int = 32
    max_json_values: int = 100_000
    max_batch_bytes: int = 1 << 30  # what a whole batch's requests may take in memory once read


VALUES, MEMORY = "values", "bytes once read"  # the units decode_request meters
VALUE_BYTES = 160  # what one parsed JSON value may take (an object of one member: about 190 bytes for two)
NUMBER_BYTES = 8  # one number read into an array (parse_numeric)


Meter = Callable[[int, str, str, int], None]
"""``meter(amount, unit, setting, limit)`` counts ``amount`` of ``unit`` (values, pixels...) for the
request being read and raises once it passes ``limit``, the ``handler:`` setting named ``setting``
(413), or its share of the batch's budget (503, ``Busy``: handlers/base.py)."""


def within(amount: int, unit: str, setting: str, limit: int):
    """The meter of a request read on its own: its own limit only."""
    if amount > limit:
        raise too_large("the request holds", amount, unit, setting, limit)


def check_size(payload: Any, limits: Limits):
    if isinstance(payload, (bytes, bytearray, str)) and len(payload) > limits.max_body_bytes:
        raise too_large("the request body is", len(payload), "bytes", "max_body_bytes", limits.max_body_bytes)


def check_json(value: Any, limits: Limits) -> int:
    """Refuse JSON nested deeper than ``max_json_depth`` or holding more than ``max_json_values``
    values; the values it holds. Walked without recursion; a container is counted before its
    children are visited, so a list of millions is refused at once. (Arrays the numeric reader made,
    ``read_json``, were counted before parsing.)"""
    if not isinstance(value, (list, dict)):
        return 0
    count, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limits.max_json_depth:
            raise too_deep(limits.max_json_depth)
        count += len(node)
        if count > limits.max_json_values:
            raise too_large("the JSON body holds", count, "values", "max_json_values", limits.max_json_values)
        children = node.values() if isinstance(node, dict) else node
        if set(map(type, children)) <= JSON_SCALARS:  # no containers: not walked value by value
            continue
        stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))
    return count


def may_hold_long_number(text: str) -> bool:
    """Whether ``text`` has digits enough for a number of more than ``MAX_DIGITS`` digits: counted in C,
    a third of the time of the regex that finds one (most bodies of millions of values are lists)."""
    return sum(map(text.count, "0123456789")) > MAX_DIGITS


def json_values(text: str, limits: Limits) -> int:
    """How many values (list items, object members) the JSON ``text`` holds, at most, counted before
    it is parsed: its commas plus its containers, outside strings. The count over the raw text is
    exact enough unless it passes the limit; then strings (whose commas are text) are left out and it
    is counted again. A number of more than ``MAX_DIGITS`` digits (quadratic to parse) is refused."""
    count = text.count(",") + text.count("[") + text.count("{") - text.count("[]") - text.count("{}")
    if count > limits.max_json_values or may_hold_long_number(text) and LONG_NUMBER.search(text):
        bare = JSON_STRING.sub('""', text)
        count = bare.count(",") + bare.count("[") + bare.count("{") - bare.count("[]") - bare.count("{}")
        if LONG_NUMBER.search(bare):
            raise ClientError(f"the JSON body holds a number of more than {MAX_DIGITS:,} digits")
    return count


def check_count(items: list, limits: Limits):
    if len(items) > limits.max_items:
        raise too_large("the request holds", len(items), "inputs", "max_items", limits.max_items)


# ---- TorchServe rows and headers -----------------------------------------------------------------------
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


def header_length(headers: Optional[Mapping]) -> Optional[int]:
    """The ``Inference-Header-Content-Length`` among a request's headers (any letter case: clients
    send it as they like and TorchServe keeps their spelling), or None when it is not there."""
    value = next(
        (v for k, v in (headers or {}).items() if isinstance(k, str) and k.lower() == HEADER.lower()),
        None,
    )
    if value is None:
        return None
    text = str(value).strip()
    if not DIGITS.fullmatch(text):
        raise ClientError(f"the {HEADER} header must be the JSON header's length in bytes, got {value!r}")
    return int(text)


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


# ---- requests ------------------------------------------------------------------------------------------
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


def read_json(payload: Any, limits: Limits = Limits(), meter: Meter = within, numeric: bool = False) -> Any:
    """A body as JSON, within the limits, its values metered before it is parsed; anything that is
    not JSON as it is (``maybe_json``). JSON TorchServe parsed already is checked as it is."""
    text = json_text(payload)
    if text is None:
        if isinstance(payload, (list, dict)):  # parsed by TorchServe (decode_input_request)
            meter(check_json(payload, limits), VALUES, "max_json_values", limits.max_json_values)
        return payload
    values = json_values(text, limits)
    meter(values, VALUES, "max_json_values", limits.max_json_values)
    if numeric:
        body = parse_numeric(text, limits, values, meter)
    else:
        meter(len(text) + VALUE_BYTES * values, MEMORY, "max_batch_bytes", limits.max_batch_bytes)
        body = _loads(text, limits)
    if body is None:
        return payload  # not JSON after all
    check_json(body, limits)
    return body


def json_text(payload: Any) -> Optional[str]:
    """The text of bytes or text that look like a JSON object or array, else None."""
    if isinstance(payload, (bytes, bytearray)):
        head = bytes(payload[:64]).lstrip()
        if head[:1] not in (b"{", b"["):
            return None
        try:
            return str(payload, "utf-8")  # no copy of a bytearray first
        except UnicodeDecodeError:
            return None
    if isinstance(payload, str) and payload.lstrip()[:1] in ("{", "["):
        return payload
    return None


def _loads(text: str, limits: Limits, **hooks) -> Any:
    """``json.loads``, or None when the text is not JSON; too deep for the parser is a 413."""
    try:
        return json.loads(text, **hooks)
    except RecursionError:
        raise too_deep(limits.max_json_depth) from None
    except ValueError:
        return None


def parse_numeric(text: str, limits: Limits = Limits(), values: int = 0, meter: Meter = within) -> Any:
    """JSON whose lists of numbers become float64 or int64 arrays as they are parsed, never a Python
    number per value (15 M floats: 120 MB instead of 480 MB): each such list is read by numpy from
    the text, and the rest of the JSON parsed around it. A list numpy cannot read exactly (not JSON
    numbers, an int above int64) is left to the JSON parser. What it will take in memory is metered
    before any of it is built: ``values`` (``json_values``), of which the listed numbers as arrays."""
    np = numpy()
    spans = [m.span() for m in NUMBER_LIST.finditer(text) if text[m.start()] == "["]
    numbers = sum(text.count(",", start, end) + 1 for start, end in spans)
    estimate = len(text) + NUMBER_BYTES * numbers + VALUE_BYTES * max(0, values - numbers)
    meter(estimate, MEMORY, "max_batch_bytes", limits.max_batch_bytes)
    arrays, pieces, last = [], [], 0
    mark = "tsctl:" + secrets.token_hex(16)  # the key of a placeholder object; no body can guess it
    for start, end in spans:
        array = _number_list(np, text[start:end])
        if array is None:
            continue
        pieces += [text[last:start], '{"%s":%d}' % (mark, len(arrays))]
        arrays.append(array)
        last = end
    if not arrays:
        return _loads(text, limits)
    pieces.append(text[last:])

    def placeholder(members: dict):
        return arrays[members[mark]] if len(members) == 1 and mark in members else members

    return _loads("".join(pieces), limits, object_hook=placeholder)


def _number_list(np, text: str):
    """``[1, 2.5, -3e2]`` as the array ``np.asarray`` makes of the list (int64 when every value is a
    whole number, else float64), or None when numpy cannot read it as JSON would (a number of 19 or
    more digits, text that is not JSON numbers)."""
    inner = text[1:-1].strip()
    if not inner or inner.endswith(",") or inner.startswith(","):
        return None
    if LONG_INT.search(inner):  # an int beyond int64 (numpy would make objects of the list): Python's
        return None
    whole = not any(c in inner for c in ".eE")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns, and stops, at what it cannot read
        try:
            array = np.fromstring(inner, dtype=np.int64 if whole else np.float64, sep=",")
        except (ValueError, DeprecationWarning):
            return None
    return array if array.size == inner.count(",") + 1 else None


def maybe_json(payload: Any, limits: Limits = Limits()) -> Any:
    """Parse bytes or text that look like a JSON object or array; anything else is returned as is.
    JSON nested too deep for the parser is refused (413), never a RecursionError."""
    text = json_text(payload)
    body = None if text is None else _loads(text, limits)
    return payload if body is None else body


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
            return _parse_v2(body, v2_datatypes)
        for key in item_keys:
            if key in body:
                value = body[key]
                if _is_list(value):
                    return Request(_item_list(value, key, limits), LIST)
                return Request([value], SINGLE)
        keys = ", ".join(sorted(body)) or "none"
        wanted = ", ".join(repr(k) for k in item_keys)
        raise ClientError(
            f"the JSON body has no input field (found keys: {keys}); send one of {wanted}, "
            "'instances' (KServe v1) or 'inputs' (KServe v2)"
        )
    if _is_list(body):
        return Request(_item_list(body, "the body list", limits), LIST)
    if body is None:
        raise ClientError("the request body is empty")
    return Request([body], SINGLE)


def _is_list(value: Any) -> bool:
    """A JSON list: a list, or a list of numbers read as an array (``parse_numeric``)."""
    return isinstance(value, list) or (getattr(value, "ndim", 0) >= 1 and hasattr(value, "dtype"))


def _item_list(value: Any, where: str, limits: Limits = Limits()) -> list:
    if not _is_list(value):
        raise ClientError(f"{where} must be a list, got {type(value).__name__}")
    if not len(value):
        raise ClientError(f"{where} is empty: send at least one input")
    if not isinstance(value, list):  # an array of numbers: its rows, once they are known to be few
        check_count(value, limits)
        return list(value)
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
            f"KServe v2 input has 'binary_data_size' but the request has no {HEADER} "
            "header: send the JSON header's length in it (binary tensor extension), or the values in 'data'"
        )
    missing = [k for k in ("name", "shape", "datatype", "data") if k not in tensor]
    if missing:
        raise ClientError(f"KServe v2 input is missing {', '.join(missing)}")
    shape, datatype, data = as_shape(tensor["shape"]), tensor["datatype"], tensor["data"]
    count = element_count(shape)
    if datatype not in datatypes:
        wanted = ", ".join(datatypes)
        raise ClientError(f"KServe v2 datatype {datatype!r} is not supported by this model; send {wanted}")
    if _is_list(data):
        values = flatten(data) if datatype == "BYTES" else data
    elif isinstance(data, Binary):  # the binary extension's data, read already
        values = data.value
    else:
        raise ClientError(f"KServe v2 input 'data' must be a list, got {type(data).__name__}")
    if datatype != "BYTES":  # a numeric tensor: one item per row of the first dimension
        values = values if isinstance(data, Binary) else json_tensor(values, datatype, shape, count)
    elif count != len(values):
        raise ClientError(f"KServe v2 input shape {shape} holds {count} values but 'data' has {len(values)}")
    if count == 0:
        raise ClientError("KServe v2 input 'data' is empty: send at least one input")
    items = values if datatype == "BYTES" else [values[i, ...] for i in range(shape[0])]
    binary_output, outputs = _v2_outputs(body)
    return Request(items, V2, v2_id=body.get("id"), v2_binary_output=binary_output, v2_outputs=outputs)


def as_shape(shape: Any) -> Any:
    """A shape the numeric reader made an int64 array (``parse_numeric``) as the list it was sent as."""
    if isinstance(shape, list) or not _is_list(shape) or shape.ndim != 1 or len(shape) > MAX_DIMS:
        return shape
    return shape.tolist() if shape.dtype.kind in "iu" else shape


def element_count(shape: Any) -> int:
    """The values a v2 ``shape`` holds. Its form is checked first, so the product is of at most 64
    numbers of at most 63 bits: a shape of 8,000 dimensions of 1,000 digits is refused, not multiplied."""
    if not (
        isinstance(shape, list)
        and 0 < len(shape) <= MAX_DIMS
        and all(type(d) is int and 0 <= d <= MAX_DIM for d in shape)
    ):
        raise ClientError(
            f"KServe v2 input 'shape' must be a list of 1 to {MAX_DIMS} non-negative integers below 2**63, "
            f"got {shown_shape(shape)}"
        )
    count = 1
    for dim in shape:
        count *= dim
    return count


def shown_shape(shape: Any) -> str:
    """A shape for an error message, cut short: an attacker's may be megabytes."""
    text = repr(shape) if not isinstance(shape, list) or len(shape) <= MAX_DIMS else f"a list of {len(shape):,} values"
    return text if len(text) <= 200 else text[:200] + "..."


def json_tensor(data: list, datatype: str, shape: List[int], count: int):
    """A numeric tensor's JSON ``data`` (flat, or nested as its shape) as one array of ``shape`` and
    the datatype's dtype. Values the datatype cannot hold (300 as INT8, 1.5 as INT32, text) are a 400."""
    np = numpy()
    if datatype not in NUMERIC:
        raise ClientError(f"KServe v2 datatype {datatype!r} cannot be read; send one of BYTES, {', '.join(NUMERIC)}")
    what = f"KServe v2 input of datatype {datatype}"
    try:
        values = np.asarray(data)
    except (ValueError, TypeError, OverflowError):
        raise ClientError(f"{what}: 'data' is not a list of numbers nested as its shape {shape}") from None
    if values.dtype.kind in "fO" and np.dtype(NUMERIC[datatype]).kind in "iu":
        values = whole_numbers(np, data, values, NUMERIC[datatype], what)
    if values.dtype.kind not in "biuf":
        raise ClientError(f"{what}: 'data' must hold numbers (or true/false), got {values.dtype.kind!r} values")
    if values.size != count:
        raise ClientError(f"KServe v2 input shape {shape} holds {count} values but 'data' has {values.size}")
    dtype = np.dtype(NUMERIC[datatype])
    with np.errstate(all="ignore"):
        array = values.astype(dtype, copy=False)
        exact = dtype.kind in "biu" and values.dtype.kind != "b"
        if exact and not np.array_equal(array, values):
            raise ClientError(f"{what}: 'data' holds values {datatype} cannot hold (fractions, or out of its range)")
    return array.reshape(shape)


def whole_numbers(np, data: list, values, dtype: str, what: str):
    """Whole numbers for an integer datatype exactly: numpy reads a list of small and big ints (0 and
    2**63 + 1) as floats, which round the big ones (to 2**63). Read as ``dtype`` when every value is a
    JSON integer (one out of its range is a 400); else ``values`` as numpy read them."""
    flat = []
    for value in flatten(data) if isinstance(data, list) else [data]:
        if type(value) is int:
            flat.append(value)
        elif isinstance(value, np.ndarray) and value.dtype.kind in "iu":  # a list parse_numeric read
            flat.extend(value.ravel().tolist())
        else:
            return values
    try:
        return np.array(flat, dtype=dtype)
    except OverflowError:
        raise ClientError(f"{what}: 'data' holds values out of its range") from None


def flatten(data: list) -> list:
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


def wants_binary(request: Request, output_name: str) -> bool:
    """Whether this request's answer goes back in binary: the ``binary_data`` of the output it names,
    else its ``binary_data_output``. Naming an output the model does not have is a 400."""
    if request.form != V2:
        return False
    if request.v2_outputs is None:
        return request.v2_binary_output
    unknown = [name for name in request.v2_outputs if name != output_name]
    if unknown:
        raise ClientError(
            f"KServe v2 'outputs' names {', '.join(map(repr, unknown))}; this model's only output is {output_name!r}"
        )
    binary = request.v2_outputs.get(output_name)
    return request.v2_binary_output if binary is None else binary


# ---- the binary tensor extension -----------------------------------------------------------------------
@dataclass
class Binary:
    """A tensor's data read from the binary extension: an array of its shape, or BYTES elements."""

    value: Any


def split_body(payload: Any, length: int) -> Tuple[Any, memoryview]:
    """The JSON header and the binary data after it (a view of the body). A body TorchServe already
    parsed as JSON (a JSON content type without ``decode_input_request=false``) had nothing after it."""
    if isinstance(payload, str):  # a text/* content type: TorchServe decoded it as UTF-8
        payload = payload.encode("utf-8")
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        return payload, memoryview(b"")
    if length > len(payload):
        raise ClientError(
            f"the {HEADER} header says the JSON header is {length:,} bytes, but the body holds only {len(payload):,}"
        )
    view = memoryview(payload)
    return bytes(view[:length]), view[length:]


def read_header(header: Any, limits: Limits, meter: Meter = within) -> dict:
    """The JSON header as a KServe v2 request, within the JSON limits."""
    what = f"the JSON header (the first bytes of the body, as many as {HEADER} says)"
    if isinstance(header, bytes):
        try:
            text = header.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ClientError(f"{what} is not valid JSON: {exc}") from None
        meter(json_values(text, limits), VALUES, "max_json_values", limits.max_json_values)
        try:
            header = json.loads(text)
        except RecursionError:
            raise too_deep(limits.max_json_depth) from None
        except ValueError as exc:
            raise ClientError(f"{what} is not valid JSON: {exc}") from None
    check_json(header, limits)
    inputs = header.get("inputs") if isinstance(header, dict) else None
    if not (isinstance(inputs, list) and inputs and all(isinstance(i, dict) for i in inputs)):
        raise ClientError(
            f"{what} is not a KServe v2 request: it needs 'inputs', a list of tensors "
            f"(the {HEADER} header marks KServe v2's binary tensor extension)"
        )
    if len(inputs) != 1:  # as in the JSON form; checked before any binary data is read
        raise ClientError(f"KServe v2 'inputs' must hold exactly one tensor, got {len(inputs)}")
    return header


def attach(tensors: list, binary: memoryview, limits: Optional[Limits], what: str = "input", meter: Meter = within):
    """Give each tensor sent as binary data its ``data`` (a ``Binary``), read from its share of
    ``binary``; the shares must add up to exactly what follows the JSON header."""
    offset = 0
    for tensor in tensors:
        parameters = tensor.get("parameters")
        if not isinstance(parameters, dict):
            continue
        if "shared_memory_region" in parameters:
            raise ClientError(f"KServe v2 {what} in shared memory: the shared-memory extension is not supported")
        if "binary_data_size" not in parameters:
            continue
        name, size = tensor.get("name"), parameters["binary_data_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ClientError(f"KServe v2 {what} {name!r}: 'binary_data_size' must be a byte count, got {size!r}")
        if "data" in tensor:
            raise ClientError(f"KServe v2 {what} {name!r} has both 'data' and 'binary_data_size': send one")
        if offset + size > len(binary):
            raise ClientError(
                f"KServe v2 {what} {name!r}: 'binary_data_size' says {size:,} bytes, but only "
                f"{len(binary) - offset:,} bytes of binary data are left after the JSON header"
            )
        raw = binary[offset : offset + size]
        tensor["data"] = Binary(decode_tensor(tensor.get("datatype"), tensor.get("shape"), raw, limits, meter))
        tensor["parameters"] = {k: v for k, v in parameters.items() if k != "binary_data_size"}
        offset += size
    if offset != len(binary):
        raise ClientError(
            f"{len(binary):,} bytes of binary data follow the JSON header, but the {what}s' 'binary_data_size' "
            f"add up to {offset:,}"
        )


def decode_tensor(
    datatype: Any, shape: Any, raw: memoryview, limits: Optional[Limits] = Limits(), meter: Meter = within
):
    """One tensor's binary data: a list of bytes (BYTES), else an array of ``shape`` viewing ``raw``
    (no copy). The shape is counted against the limits (None: no limits) before anything is read."""
    count = element_count(shape)
    if datatype == "BYTES":
        if limits is not None and count > limits.max_items:
            raise too_large("the request holds", count, "inputs", "max_items", limits.max_items)
        return split_bytes(raw, count)
    dtype = NUMERIC.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        known = ", ".join(["BYTES", *NUMERIC])
        raise ClientError(f"KServe v2 datatype {datatype!r} cannot be read as binary data; send one of {known}")
    np = numpy()
    itemsize = np.dtype(dtype).itemsize
    if limits is not None:
        meter(count, VALUES, "max_json_values", limits.max_json_values)
        meter(count * itemsize, MEMORY, "max_batch_bytes", limits.max_batch_bytes)  # a view now, copied later
    if len(raw) != count * itemsize:
        raise ClientError(
            f"KServe v2 tensor of shape {shape} and datatype {datatype} needs {count * itemsize:,} bytes "
            f"({count:,} values of {itemsize}), but its 'binary_data_size' is {len(raw):,}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def split_bytes(raw: memoryview, count: int) -> list:
    """``count`` BYTES elements, each a 4-byte little-endian length and then that many bytes."""
    items, offset, end = [], 0, len(raw)
    for index in range(count):
        if offset + 4 > end:
            raise ClientError(
                f"BYTES element {index} of {count}: the binary data ends before its 4-byte length "
                f"({end - offset} bytes left)"
            )
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > end:
            raise ClientError(
                f"BYTES element {index} of {count}: its length prefix says {length:,} bytes, past the end of the "
                f"input's binary data ({end - offset:,} bytes left)"
            )
        items.append(bytes(raw[offset : offset + length]))
        offset += length
    if offset != end:
        raise ClientError(f"{end - offset:,} bytes of the input's binary data follow its last BYTES element ({count})")
    return items


def encode_tensor(datatype: str, data: Any) -> bytes:
    """A tensor's data (an array, or a list of values) as binary tensor data (BYTES: str or bytes
    elements)."""
    if datatype == "BYTES":
        parts = []
        for value in data:
            value = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            parts += [struct.pack("<I", len(value)), value]
        return b"".join(parts)
    return numpy().asarray(data, dtype=NUMERIC[datatype]).tobytes()


def encode_binary(body: dict, key: str = "outputs") -> Tuple[bytes, int]:
    """A v2 body with its tensors' (``key``: outputs, or inputs) ``data`` moved to binary: the whole
    body and the length of its JSON header (the ``Inference-Header-Content-Length``)."""
    tensors, raws = [], []
    for tensor in body[key]:
        raw = encode_tensor(tensor["datatype"], tensor["data"])
        described = {k: v for k, v in tensor.items() if k != "data"}
        described["parameters"] = {**(tensor.get("parameters") or {}), "binary_data_size": len(raw)}
        tensors.append(described)
        raws.append(raw)
    header = to_json({**body, key: tensors})
    return b"".join([header, *raws]), len(header)


# ---- answers -------------------------------------------------------------------------------------------
def answer_body(
    request: Request, answers: list, model_name: str, v2_output: Optional[dict] = None, model_version=None
) -> Any:
    """The response body for one request, shaped like its question (before it is encoded)."""
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
        "data": [json.dumps(a, default=_plain) for a in answers],
    }
    body = {"model_name": model_name, "outputs": [output]}
    if model_version is not None:
        body["model_version"] = str(model_version)
    if request.v2_id is not None:
        body["id"] = request.v2_id
    return body


def encode_answers(
    request: Request,
    answers: list,
    model_name: str,
    v2_output: Optional[dict] = None,
    model_version=None,
    binary: bool = False,
) -> Tuple[bytes, Dict[str, str]]:
    """The response's body and headers for one request's answers, in the protocol it came in: JSON,
    or (``binary``: what ``wants_binary`` said) KServe v2's binary extension."""
    body = answer_body(request, answers, model_name, v2_output, model_version)
    if binary:
        data, length = encode_binary(body)
        return data, {"Content-Type": OCTET_STREAM, HEADER: str(length)}
    return to_json(_flat(body, "outputs") if request.form == V2 else body), {"Content-Type": JSON_TYPE}


def to_json(value: Any) -> bytes:
    """``value`` as JSON bytes; arrays become lists here, at the very end."""
    return json.dumps(value, default=_plain).encode("utf-8")


def _flat(body: dict, key: str) -> dict:
    """A v2 body whose tensors' array ``data`` is flat (a view), as v2 JSON sends it."""
    flat = [{**t, "data": t["data"].reshape(-1)} if hasattr(t.get("data"), "reshape") else t for t in body[key]]
    return {**body, key: flat}


def _plain(value: Any) -> Any:
    """json.dumps' ``default``: numpy arrays as lists, numpy scalars as numbers."""
    np = sys.modules.get("numpy")  # no numpy loaded: nothing here is an array
    if np is not None:
        if isinstance(value, np.ndarray):
            return value.tolist()
        if isinstance(value, np.generic):
            return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def jsonable(value: Any) -> Any:
    """An answer as JSON values (an array as lists), to compare with a recorded one."""
    return value.tolist() if hasattr(value, "tolist") else value


# ---- the client side -----------------------------------------------------------------------------------
def datatype_of(array) -> str:
    """The KServe v2 datatype of an array's dtype (in any byte order)."""
    np = numpy()
    for datatype, name in NUMERIC.items():
        if (np.dtype(name).kind, np.dtype(name).itemsize) == (array.dtype.kind, array.dtype.itemsize):
            return datatype
    raise ValueError(f"arrays of {array.dtype} have no KServe v2 datatype")


def encode_request(
    inputs: Any, protocol: str, binary: bool = False, name: str = "input-0", request_id: Optional[str] = None
) -> Tuple[bytes, Dict[str, str]]:
    """A KServe request's body and headers. ``inputs``: a list of items (v1 ``instances``; v2 one
    BYTES tensor of them), or one array (v1 its rows as instances; v2 one tensor of its shape and
    dtype). ``binary``: v2 in the binary tensor extension, asking for binary outputs too."""
    is_array = hasattr(inputs, "dtype") and hasattr(inputs, "shape")
    if protocol == V1:
        return to_json({"instances": inputs}), {"Content-Type": JSON_TYPE}
    if protocol != V2:
        raise ValueError(f"protocol {protocol!r} must be v1 or v2")
    if is_array:
        tensor = {"name": name, "shape": list(inputs.shape), "datatype": datatype_of(inputs), "data": inputs}
    else:
        tensor = {"name": name, "shape": [len(inputs)], "datatype": "BYTES", "data": list(inputs)}
    body = {"inputs": [tensor]}
    if request_id is not None:
        body["id"] = request_id
    if not binary:
        return to_json(_flat(body, "inputs")), {"Content-Type": JSON_TYPE}
    data, length = encode_binary({**body, "parameters": {"binary_data_output": True}}, "inputs")
    return data, {"Content-Type": OCTET_STREAM, HEADER: str(length)}


def decode_answers(body: Any, headers: Optional[Mapping] = None) -> list:
    """The answers in a server's response to a KServe request, one per input: v1 ``predictions``;
    v2 its first output, BYTES elements read as JSON (text that is not JSON stays text), numeric rows
    as arrays. ``body``: the response's bytes (JSON or the binary extension, as ``headers`` say) or
    its JSON already parsed. A body that is neither raises ValueError."""
    try:
        answer = _read_answer(body, header_length(headers))
    except (ValueError, TypeError, AttributeError, ClientError) as exc:
        raise ValueError(f"the answer is not a KServe v1/v2 response: {exc}") from None
    if isinstance(answer, dict) and isinstance(answer.get("predictions"), list):
        return answer["predictions"]
    outputs = answer.get("outputs") if isinstance(answer, dict) else None
    if not (isinstance(outputs, list) and outputs and isinstance(outputs[0], dict)):
        raise ValueError("the answer is not a KServe v1/v2 response (no 'predictions', no 'outputs')")
    output = outputs[0]
    datatype, shape, data = output.get("datatype"), output.get("shape"), output.get("data")
    values = data.value if isinstance(data, Binary) else data
    if datatype == "BYTES":
        return [_json_or_text(v) for v in (values if isinstance(data, Binary) else flatten(values or []))]
    if datatype not in NUMERIC or not isinstance(shape, list) or not shape:
        raise ValueError(f"the answer's output has datatype {datatype!r} and shape {shape!r}")
    try:
        array = values if isinstance(data, Binary) else numpy().asarray(values, dtype=NUMERIC[datatype]).reshape(shape)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"the answer's output is not a {datatype} tensor of shape {shape}: {exc}") from None
    return [array[i, ...] for i in range(shape[0])]


def _read_answer(body: Any, length: Optional[int]) -> Any:
    """A response body as its JSON, binary outputs' data attached; JSON already parsed as it is."""
    if not isinstance(body, (bytes, bytearray, memoryview)):
        return body
    if length is None:
        return json.loads(bytes(body))
    header, binary = split_body(body, length)
    answer = json.loads(header)
    attach(answer.get("outputs") or [], binary, None, "output")
    return answer


def _json_or_text(value: Any) -> Any:
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value.decode("utf-8", errors="replace") if isinstance(value, (bytes, bytearray)) else value


# ---- one item's value ----------------------------------------------------------------------------------
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
