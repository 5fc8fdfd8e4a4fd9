"""The client side of KServe's protocols (the KServe transformer calling its predictor, ``tsctl
verify`` calling a server): ``encode_request`` builds a v1/v2 request (an array as a v2 tensor in the
binary extension) and ``decode_answers`` reads the answers back, numeric outputs as arrays.
"""

import json
from typing import Any, Dict, Mapping, Optional, Tuple

from .decoding import V1, V2, Form
from .errors import ClientError
from .json_body import numpy, to_json
from .rows import JSON_TYPE, OCTET_STREAM
from .v2_binary import attach, encode_binary, header_length, split_body
from .v2_tensors import HEADER, NUMERIC, Binary, datatype_of, flat_tensors, flatten


def kserve_protocol(protocol: Any) -> Form:
    """``V1`` or ``V2`` for ``protocol``: the member, or its value as a command line gives it ("v1", "v2");
    a ValueError for anything else."""
    try:
        form = Form(protocol)
    except ValueError:
        form = None
    if form is not V1 and form is not V2:
        raise ValueError(f"protocol {protocol!r} must be v1 or v2")
    return form


def encode_request(
    inputs: Any, protocol: Any, binary: bool = False, name: str = "input-0", request_id: Optional[str] = None
) -> Tuple[bytes, Dict[str, str]]:
    """A KServe request's body and headers. ``protocol``: ``V1``/``V2`` (or "v1"/"v2"). ``inputs``: a list of
    items (v1 ``instances``; v2 one BYTES tensor of them), or one array (v1 its rows as instances; v2 one
    tensor of its shape and dtype). ``binary``: v2 in the binary tensor extension, asking for binary outputs
    too."""
    is_array = hasattr(inputs, "dtype") and hasattr(inputs, "shape")
    if kserve_protocol(protocol) is V1:
        return to_json({"instances": inputs}), {"Content-Type": JSON_TYPE}
    if is_array:
        tensor = {"name": name, "shape": list(inputs.shape), "datatype": datatype_of(inputs), "data": inputs}
    else:
        tensor = {"name": name, "shape": [len(inputs)], "datatype": "BYTES", "data": list(inputs)}
    body = {"inputs": [tensor]}
    if request_id is not None:
        body["id"] = request_id
    if not binary:
        return to_json(flat_tensors(body, "inputs")), {"Content-Type": JSON_TYPE}
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
