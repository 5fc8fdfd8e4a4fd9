"""JSON in and out: a request body read as JSON within its limits, its values metered before it is
parsed (``read_json``), lists of numbers read straight into arrays (``parse_numeric``: never a
Python number per value), and a value written as JSON with arrays as lists, at the very end
(``to_json``). numpy is imported only when a numeric tensor is read or written (``numpy``): tsctl's
CLI imports the toolkit's request names and loads no numpy.
"""

import json
import re
import secrets
import sys
import warnings
from typing import Any, Optional

from .errors import too_deep
from .limits import MEMORY, NUMBER_BYTES, VALUE_BYTES, VALUES, Limits, Meter, check_json, json_values, within

LONG_INT = re.compile(r"[0-9]{19}")
NUMBER_LIST = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|\[[-+0-9.eE,\s]+\]')  # a string, or a list of numbers


def numpy():
    """numpy, imported on first use (see the module docstring)."""
    import numpy

    return numpy


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


def is_list(value: Any) -> bool:
    """A JSON list: a list, or a list of numbers read as an array (``parse_numeric``)."""
    return isinstance(value, list) or (getattr(value, "ndim", 0) >= 1 and hasattr(value, "dtype"))


def to_json(value: Any) -> bytes:
    """``value`` as JSON bytes; arrays become lists here, at the very end."""
    return json.dumps(value, default=plain).encode("utf-8")


def plain(value: Any) -> Any:
    """json.dumps' ``default``: numpy arrays as lists, numpy scalars as numbers."""
    np = sys.modules.get("numpy")  # no numpy loaded: nothing here is an array
    if np is not None:
        if isinstance(value, np.ndarray):
            return value.tolist()
        if isinstance(value, np.generic):
            return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
