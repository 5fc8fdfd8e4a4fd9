"""KServe v2's binary tensor extension (Triton's binary data): tensors as raw bytes after a JSON header.

A request in the extension carries the HTTP header ``Inference-Header-Content-Length: N``; its body
is N bytes of JSON (a KServe v2 request) followed by raw tensor data, input after input in order.
An input sent that way has ``"parameters": {"binary_data_size": K}`` instead of ``data``:

    BYTES     each element as a 4-byte little-endian unsigned length, then its bytes
    numeric   the values raw, little-endian, row-major (FP16/32/64, INT8-64, UINT8-64; BOOL: 1 byte)

tritonclient's ``set_data_from_numpy`` sends this by default, kserve's ``InferInput`` with
``binary_data=True``. The inputs become the items their JSON form gives (``requests.parse_body``);
sizes are checked before anything is built from them, and one that does not add up (a lying header
length or ``binary_data_size``, a truncated body, an element length past the end, numeric bytes that
are not a whole number of values) is that request's 400 naming it.

The answer's output is sent back in binary when the request asks: ``"parameters":
{"binary_data_output": true}`` (tritonclient sets it when it names no outputs), or ``"outputs":
[{"name": ..., "parameters": {"binary_data": true}}]``. The body is then the JSON header (the
output with ``"parameters": {"binary_data_size": K}`` and no ``data``) followed by the output's raw
bytes, and the response's ``Inference-Header-Content-Length`` header holds the JSON header's length.
"""

import json
import re
import struct
from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np

from .requests import (
    V2,
    ClientError,
    Limits,
    Request,
    check_json,
    check_size,
    parse_body,
    row_payload,
    too_deep,
    too_large,
)

HEADER = "Inference-Header-Content-Length"
OCTET_STREAM = "application/octet-stream"
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


def parse_request(
    row: Any,
    length: int,
    item_keys: Sequence[str],
    v2_datatypes: Sequence[str] = ("BYTES",),
    limits: Limits = Limits(),
) -> Request:
    """One row of a request with ``Inference-Header-Content-Length: length`` split into items, as
    ``requests.parse_request`` splits its JSON form; the same limits bound it."""
    payload = row_payload(row)
    check_size(payload, limits)
    header, binary = split_body(payload, length)
    body = read_header(header, limits)
    attach(body, binary, limits)
    return parse_body(body, item_keys, v2_datatypes, limits)


def split_body(payload: Any, length: int) -> Tuple[Any, memoryview]:
    """The JSON header and the binary data after it. A body TorchServe already parsed as JSON (a
    JSON content type without ``decode_input_request=false``) had nothing after its JSON."""
    if isinstance(payload, str):  # a text/* content type: TorchServe decoded it as UTF-8
        payload = payload.encode("utf-8")
    if not isinstance(payload, (bytes, bytearray)):
        return payload, memoryview(b"")
    if length > len(payload):
        raise ClientError(
            f"the {HEADER} header says the JSON header is {length:,} bytes, but the body holds only {len(payload):,}"
        )
    return bytes(payload[:length]), memoryview(payload)[length:]


def read_header(header: Any, limits: Limits) -> dict:
    """The JSON header as a KServe v2 request, within the JSON limits."""
    what = f"the JSON header (the first bytes of the body, as many as {HEADER} says)"
    if isinstance(header, bytes):
        try:
            header = json.loads(header.decode("utf-8"))
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


def attach(body: dict, binary: memoryview, limits: Limits):
    """Give each input sent as binary data its ``data``, read from its share of ``binary``; the
    shares must add up to exactly what follows the JSON header."""
    offset = 0
    for tensor in body["inputs"]:
        parameters = tensor.get("parameters")
        if not isinstance(parameters, dict):
            continue
        if "shared_memory_region" in parameters:
            raise ClientError("KServe v2 input in shared memory: the shared-memory extension is not supported")
        if "binary_data_size" not in parameters:
            continue
        name, size = tensor.get("name"), parameters["binary_data_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ClientError(f"KServe v2 input {name!r}: 'binary_data_size' must be a byte count, got {size!r}")
        if "data" in tensor:
            raise ClientError(f"KServe v2 input {name!r} has both 'data' and 'binary_data_size': send one")
        if offset + size > len(binary):
            raise ClientError(
                f"KServe v2 input {name!r}: 'binary_data_size' says {size:,} bytes, but only "
                f"{len(binary) - offset:,} bytes of binary data are left after the JSON header"
            )
        tensor["data"] = decode_tensor(
            tensor.get("datatype"), tensor.get("shape"), binary[offset : offset + size], limits
        )
        tensor["parameters"] = {k: v for k, v in parameters.items() if k != "binary_data_size"}
        offset += size
    if offset != len(binary):
        raise ClientError(
            f"{len(binary):,} bytes of binary data follow the JSON header, but the inputs' 'binary_data_size' "
            f"add up to {offset:,}"
        )


def element_count(shape: Any) -> int:
    if not (isinstance(shape, list) and shape and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise ClientError(f"KServe v2 input 'shape' must be a list of non-negative integers, got {shape!r}")
    count = 1
    for dim in shape:
        count *= dim
    return count


def decode_tensor(datatype: Any, shape: Any, raw: memoryview, limits: Limits = Limits()) -> list:
    """One input's binary data as the flat ``data`` list its JSON form holds: bytes per BYTES
    element, numbers otherwise. The shape is counted against the limits before anything is read."""
    count = element_count(shape)
    if datatype == "BYTES":
        if count > limits.max_items:
            raise too_large("the request holds", count, "inputs", "max_items", limits.max_items)
        return split_bytes(raw, count)
    dtype = NUMERIC.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        known = ", ".join(["BYTES", *NUMERIC])
        raise ClientError(f"KServe v2 datatype {datatype!r} cannot be read as binary data; send one of {known}")
    if count > limits.max_json_values:
        raise too_large("the request holds", count, "values", "max_json_values", limits.max_json_values)
    itemsize = np.dtype(dtype).itemsize
    if len(raw) != count * itemsize:
        raise ClientError(
            f"KServe v2 input of shape {shape} and datatype {datatype} needs {count * itemsize:,} bytes "
            f"({count:,} values of {itemsize}), but its 'binary_data_size' is {len(raw):,}"
        )
    return np.frombuffer(raw, dtype=dtype).tolist()


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


# ---- answers ---------------------------------------------------------------------------------------
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


def encode_response(body: dict) -> Tuple[bytes, int]:
    """A v2 response body with its outputs' ``data`` moved to binary: the whole body and the length
    of its JSON header (the response's ``Inference-Header-Content-Length``)."""
    outputs, raws = [], []
    for output in body["outputs"]:
        raw = encode_tensor(output["datatype"], output["data"])
        described = {k: v for k, v in output.items() if k != "data"}
        described["parameters"] = {**output.get("parameters", {}), "binary_data_size": len(raw)}
        outputs.append(described)
        raws.append(raw)
    header = json.dumps({**body, "outputs": outputs}).encode("utf-8")
    return b"".join([header, *raws]), len(header)


def encode_tensor(datatype: str, data: list) -> bytes:
    """A flat ``data`` list as binary tensor data (BYTES: str or bytes elements)."""
    if datatype == "BYTES":
        parts = []
        for value in data:
            value = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            parts += [struct.pack("<I", len(value)), value]
        return b"".join(parts)
    return np.asarray(data, dtype=NUMERIC[datatype]).tobytes()
