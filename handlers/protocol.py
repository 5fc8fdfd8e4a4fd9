"""The wire, as handler code has imported it: every name of the toolkit's request and answer
modules, from one place. Each lives in the module named for what it does:

    errors.py         ClientError and its kinds, STATUS and error_for, the error bodies
    limits.py         Limits (the ``handler:`` settings) and the checks and meters of each
    rows.py           the body inside a TorchServe row, media types, a file's Content-Type
    json_body.py      a body read as JSON within its limits (numbers into arrays), values written as JSON
    v2_tensors.py     KServe v2 tensors in JSON: shapes, datatypes, the outputs a request asks for
    v2_binary.py      KServe v2's binary tensor extension, read and written
    decoding.py       a request decoded once into a Request (its items and its answer's shape)
    answers.py        answers and refusals encoded once, in the protocol the question came in
    kserve_client.py  the client side: a KServe v1/v2 request built, its answers read back
    items.py          one item's value: to_bytes, to_text

No torch; numpy is imported only when a numeric tensor is read or written (tsctl's CLI imports this
module, through ``handlers.requests``, and loads no numpy). Archives built before this split carry
their own protocol.py, whole; a user's handler file imports from here or ``handlers.requests``.
"""

from .answers import answer_body, encode_answers, encode_error, jsonable, wants_binary
from .decoding import LIST, SINGLE, V1, V2, Form, Request, decode_request, parse_request, text_request
from .errors import (
    BATCH,
    INFERENCE,
    READ,
    STATUS,
    WORKER,
    Busy,
    ClientError,
    InferenceError,
    ServerError,
    error_body,
    error_for,
    forget,
    out_of_memory,
    too_deep,
    too_large,
)
from .items import SURROGATE, to_bytes, to_text, unwrap
from .json_body import LONG_INT, NUMBER_LIST, json_text, maybe_json, numpy, parse_numeric, read_json, to_json
from .kserve_client import decode_answers, encode_request, kserve_protocol
from .limits import (
    JSON_SCALARS,
    JSON_STRING,
    LONG_NUMBER,
    MAX_DIGITS,
    MEMORY,
    NUMBER_BYTES,
    VALUE_BYTES,
    VALUES,
    Limits,
    Meter,
    check_count,
    check_json,
    check_size,
    json_values,
    may_hold_long_number,
    within,
)
from .rows import IMAGE_TYPES, JSON_TYPE, OCTET_STREAM, content_type, media_type, row_field, row_payload
from .v2_binary import (
    DIGITS,
    attach,
    decode_tensor,
    encode_binary,
    encode_tensor,
    header_length,
    read_header,
    split_body,
    split_bytes,
)
from .v2_tensors import (
    HEADER,
    MAX_DIM,
    MAX_DIMS,
    NUMERIC,
    Binary,
    as_shape,
    datatype_of,
    element_count,
    flatten,
    json_tensor,
    shown_shape,
    whole_numbers,
)

__all__ = [
    "answer_body",
    "encode_answers",
    "encode_error",
    "jsonable",
    "wants_binary",
    "LIST",
    "SINGLE",
    "V1",
    "V2",
    "Form",
    "Request",
    "decode_request",
    "parse_request",
    "text_request",
    "BATCH",
    "INFERENCE",
    "READ",
    "STATUS",
    "WORKER",
    "Busy",
    "ClientError",
    "InferenceError",
    "ServerError",
    "error_body",
    "error_for",
    "forget",
    "out_of_memory",
    "too_deep",
    "too_large",
    "SURROGATE",
    "to_bytes",
    "to_text",
    "unwrap",
    "LONG_INT",
    "NUMBER_LIST",
    "json_text",
    "maybe_json",
    "numpy",
    "parse_numeric",
    "read_json",
    "to_json",
    "decode_answers",
    "encode_request",
    "kserve_protocol",
    "JSON_SCALARS",
    "JSON_STRING",
    "LONG_NUMBER",
    "MAX_DIGITS",
    "MEMORY",
    "NUMBER_BYTES",
    "VALUE_BYTES",
    "VALUES",
    "Limits",
    "Meter",
    "check_count",
    "check_json",
    "check_size",
    "json_values",
    "may_hold_long_number",
    "within",
    "IMAGE_TYPES",
    "JSON_TYPE",
    "OCTET_STREAM",
    "content_type",
    "media_type",
    "row_field",
    "row_payload",
    "DIGITS",
    "attach",
    "decode_tensor",
    "encode_binary",
    "encode_tensor",
    "header_length",
    "read_header",
    "split_body",
    "split_bytes",
    "HEADER",
    "MAX_DIM",
    "MAX_DIMS",
    "NUMERIC",
    "Binary",
    "as_shape",
    "datatype_of",
    "element_count",
    "flatten",
    "json_tensor",
    "shown_shape",
    "whole_numbers",
]
