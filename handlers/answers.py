"""Answers encoded once, into the body and headers of the protocol the question came in
(``encode_answers``): JSON (an ``np.ndarray`` answer becomes lists there, at the very end), or, when a
v2 request asks (``binary_data_output``, or the ``binary_data`` of the output it names:
``wants_binary``), the binary extension with the header's length in the response's
``Inference-Header-Content-Length``. A refused request's body and headers: ``encode_error``.
"""

import json
from typing import Any, Dict, Optional, Tuple

from .decoding import LIST, SINGLE, V1, V2, Request
from .errors import ClientError
from .json_body import plain, to_json
from .rows import JSON_TYPE, OCTET_STREAM
from .v2_binary import encode_binary
from .v2_tensors import HEADER, flat_tensors


def answer_body(
    request: Request, answers: list, model_name: str, v2_output: Optional[dict] = None, model_version=None
) -> Any:
    """The response body for one request, shaped like its question (before it is encoded)."""
    if request.form is SINGLE:
        return answers[0]
    if request.form is LIST:
        return answers
    if request.form is V1:
        return {"predictions": answers}
    output = v2_output or {
        "name": "output-0",
        "shape": [len(answers)],
        "datatype": "BYTES",
        "data": [json.dumps(a, default=plain) for a in answers],
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
    return to_json(flat_tensors(body, "outputs") if request.form is V2 else body), {"Content-Type": JSON_TYPE}


def wants_binary(request: Request, output_name: str) -> bool:
    """Whether this request's answer goes back in binary: the ``binary_data`` of the output it names,
    else its ``binary_data_output``. Naming an output the model does not have is a 400."""
    if request.form is not V2:
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


def encode_error(error: ClientError) -> Tuple[bytes, Dict[str, str]]:
    """A refused request's body and headers."""
    return to_json(error.body()), {"Content-Type": JSON_TYPE, **error.headers}


def jsonable(value: Any) -> Any:
    """An answer as JSON values (an array as lists), to compare with a recorded one."""
    return value.tolist() if hasattr(value, "tolist") else value
