"""An Open Inference Protocol (KServe v2) request as the TorchServe requests a handler that is not the
toolkit's reads, and their answers as one v2 output: how MLServer serves such an archive
(serving/runtimes/mlserver_runtime.py). No MLServer here: requests and answers are plain dicts and bytes.

**What the handler receives.** TorchServe's worker hands a handler each request's body decoded by its
Content-Type (``_retrieve_input_data`` in ts/protocol/otf_message_handler.py; decode_input_request is
on for such archives, as TorchServe's default):

    application/json   the decoded JSON (a dict, a list, ...); the bytes when it is not JSON
    text/...           a str; the bytes when it is not UTF-8
    anything else      the bytes (no Content-Type too)

A v2 request has no body of its own: it holds one input tensor. Each element of a BYTES tensor is one
TorchServe request's body, of the type the tensor's ``parameters.content_type`` says:

    content_type   an element sent as a string (REST's JSON)           sent as bytes (gRPC)
    none           its UTF-8, as text/plain: a str                      the bytes, as application/octet-stream
    "str"          its UTF-8, as text/plain: a str (MLServer's StringCodec)   the same
    "base64"       base64-decoded, as application/octet-stream: bytes (MLServer's Base64Codec)   the same
    a media type   text/... and application/json: its UTF-8; any other: base64-decoded; as that type   the bytes

so a handler gets on MLServer what TorchServe's worker gives it for the same bytes sent with that
Content-Type (``tsctl predict FILE`` sends the file's type, ``--content-type`` another). A numeric
tensor is one request: its values nested to its shape, as a JSON body (the handler gets the nested
lists, as TorchServe's kservev2 envelope hands them).

**What a client reads.** The answers come back as one BYTES output ``output-0`` of shape ``[N]``, one
element per element asked, each the answer as JSON, as the toolkit's handlers answer: element i is
``json.dumps`` of what a client of TorchServe reads from request i's answer (its JSON when it is JSON,
else its text). An answer that is not UTF-8 (an image) cannot be JSON: then every element of the output
is an answer's bytes in base64, and the output's ``parameters.content_type`` says ``base64``. A request
fails as its first failing element did: that status and message.
"""

import base64
import binascii
import json
import re
from typing import Any, Dict, List

from handlers.errors import ClientError, error_message
from handlers.rows import JSON_TYPE, OCTET_STREAM
from handlers.v2_tensors import element_count, flatten

from ..worker.ts_wire import RequestInput, Response

TEXT = "text/plain"
CODECS = {"str": TEXT, "base64": OCTET_STREAM}  # MLServer's content types for a BYTES tensor
MEDIA_TYPE = re.compile(r"^[A-Za-z0-9][\w.+-]*/[\w.+-]+$")
OUTPUT = "output-0"


def decodes_as_text(media: str) -> bool:
    """Whether TorchServe's worker decodes a body of this type (to JSON, or to a str)."""
    return media == JSON_TYPE or media.startswith("text")


def requests_of(inputs: List[dict], headers: Dict[str, str]) -> List[RequestInput]:
    """The TorchServe requests of a v2 request's ``inputs`` (each a dict as the v2 JSON has it), each with
    ``headers`` and its Content-Type; a ClientError (400) for a request that is not one input tensor."""
    if len(inputs) != 1:
        raise ClientError(
            f"this archive's handler reads one input tensor, got {len(inputs)} (each element of it is one "
            "TorchServe request's body)"
        )
    tensor = inputs[0]
    shape = list(tensor.get("shape") or [])
    count = element_count(shape)
    data = tensor.get("data")
    values = flatten(list(data)) if isinstance(data, (list, tuple)) else [data]
    if len(values) != count:
        raise ClientError(f"input shape {shape} holds {count} elements, got {len(values)}")
    if tensor.get("datatype") != "BYTES":
        body = json.dumps(nested(values, shape)).encode("utf-8")
        return [RequestInput(body, {**headers, "Content-Type": JSON_TYPE})]
    declared = (tensor.get("parameters") or {}).get("content_type")
    return [element_request(value, declared, headers) for value in values]


def element_request(value: Any, declared: Any, headers: Dict[str, str]) -> RequestInput:
    """One BYTES element as the request TorchServe would get: its bytes and Content-Type (table above)."""
    if not isinstance(value, (str, bytes, bytearray)):
        raise ClientError(f"a BYTES element must be a string, got {type(value).__name__}")
    if declared is None:
        media = TEXT if isinstance(value, str) else OCTET_STREAM
    elif declared in CODECS:
        media = CODECS[declared]
    elif isinstance(declared, str) and MEDIA_TYPE.match(declared):
        media = declared
    else:
        raise ClientError(
            f"input parameters.content_type {str(declared)[:80]!r}: use 'str', 'base64' or a media type "
            "such as application/json"
        )
    if declared == "base64" or (isinstance(value, str) and not decodes_as_text(media)):
        try:
            body = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ClientError(f"a BYTES element of content_type {declared} must be base64") from None
    else:
        body = value.encode("utf-8", errors="surrogatepass") if isinstance(value, str) else bytes(value)
    return RequestInput(body, {**headers, "Content-Type": media})


def nested(values: list, shape: List[int]) -> list:
    """A flat list as nested lists of ``shape``."""
    for size in reversed(shape[1:]):
        values = [values[at : at + size] for at in range(0, len(values), size)]
    return values


def output_of(answers: List[Response]) -> dict:
    """The answers (each 200) as the one BYTES output ``output-0`` (module docstring)."""
    bodies = [bytes(answer.body or b"") for answer in answers]
    output = {"name": OUTPUT, "shape": [len(bodies)], "datatype": "BYTES"}
    try:
        texts = [body.decode("utf-8") for body in bodies]
    except UnicodeDecodeError:
        data = [base64.b64encode(body).decode("ascii") for body in bodies]
        return {**output, "data": data, "parameters": {"content_type": "base64"}}
    return {**output, "data": [json.dumps(read(text)) for text in texts]}


def read(text: str) -> Any:
    """An answer's text as a client of TorchServe reads it: its JSON when it is JSON, else the text."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def failure(answers: List[Response]) -> ClientError:
    """The first failed answer as an error of its status and message, or None when all are 200."""
    failed = next((answer for answer in answers if answer.status >= 400), None)
    return None if failed is None else ClientError(error_message(failed.body), failed.status)
