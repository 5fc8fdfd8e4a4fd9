"""KServe v2's binary tensor extension (Triton's binary data; tritonclient's ``set_data_from_numpy``
default, kserve's ``InferInput(binary_data=True)``): the HTTP header
``Inference-Header-Content-Length: L``, L bytes of JSON, then the raw data of each tensor that has
``"parameters": {"binary_data_size": K}`` instead of ``data``, tensor after tensor:

    BYTES     each element as a 4-byte little-endian unsigned length, then its bytes
    numeric   the values raw, little-endian, row-major (FP16/32/64, INT8-64, UINT8-64; BOOL: 1 byte)

Read (``split_body``, ``read_header``, ``attach``, ``decode_tensor``): sizes are checked before
anything is built from them; one that does not add up (a lying header length or
``binary_data_size``, a truncated body, an element length past the end, numeric bytes that are not a
whole number of values) is that request's 400, and a tensor's element count is metered from its
shape before its data is read. Written (``encode_binary``): the JSON header with each tensor's
``binary_data_size`` and no ``data``, then each tensor's raw bytes (``ndarray.tobytes()``).
"""

import json
import re
import struct
from typing import Any, Mapping, Optional, Tuple

from .errors import ClientError, too_deep, too_large
from .json_body import numpy, to_json
from .limits import MEMORY, VALUES, Limits, Meter, check_json, json_values, within
from .v2_tensors import HEADER, NUMERIC, Binary, element_count

DIGITS = re.compile(r"[0-9]{1,18}")


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
