"""What one request may hold (``Limits``, each a ``handler:`` setting of the same name) and where each
is checked, before what it bounds is built: the body's size before it is parsed (``check_size``),
the JSON's depth and number of values (``json_values`` counts them in the text, ``check_json`` in
what TorchServe parsed), the number of items (``check_count``); a binary tensor's element count is
metered from its shape before its data is read (v2_binary.py). Each breach is a 413 naming its
setting (``too_large``); what a request would take in memory is metered against its share of the
batch's budget too (``Meter``; handlers/base.py).
"""

import re
from dataclasses import dataclass
from typing import Any, Callable

from .errors import ClientError, too_deep, too_large

MAX_DIGITS = 4300  # a JSON number of more digits costs quadratic time to parse (Python's own int limit)
LONG_NUMBER = re.compile(r"(?<![0-9])[0-9]{%d}" % (MAX_DIGITS + 1))  # from a run's start: linear
JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
JSON_SCALARS = frozenset((str, int, float, bool, type(None)))


@dataclass(frozen=True)
class Limits:
    """What one request may hold; each is a ``handler:`` setting of the same name, whose default is
    the one here (settings.py reads these)."""

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
        if may_hold_long_number(bare) and LONG_NUMBER.search(bare):
            raise ClientError(f"the JSON body holds a number of more than {MAX_DIGITS:,} digits")
    return count


def check_count(items: list, limits: Limits):
    if len(items) > limits.max_items:
        raise too_large("the request holds", len(items), "inputs", "max_items", limits.max_items)
