"""KServe v2 tensors in JSON: a request's one input tensor read into items (``read_tensor``), its shape
checked before anything is counted from it (``element_count``), a numeric tensor's ``data`` read into
one array of its datatype (``json_tensor``), and how the request wants its outputs (``v2_outputs``).

A v2 tensor of shape ``[N, ...]`` is N items. BYTES elements are ``bytes`` (binary) or the JSON value
(JSON). A numeric row is an ``np.ndarray`` of shape ``[...]`` and the declared datatype: read from
the wire's bytes with ``np.frombuffer`` (a view of the body, no copy: v2_binary.py) or from JSON's
numbers in one ``np.asarray``, never a list of Python numbers.
"""

from dataclasses import dataclass
from typing import Any, List, Sequence

from .errors import ClientError
from .json_body import is_list, numpy

HEADER = "Inference-Header-Content-Length"  # the binary tensor extension's header (v2_binary.py)
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
MAX_DIMS = 64  # numpy's own limit on a shape's dimensions
MAX_DIM = (1 << 63) - 1  # one dimension: what an int64 holds (a shape of 1,000-digit numbers is refused unmultiplied)


@dataclass
class Binary:
    """A tensor's data read from the binary extension: an array of its shape, or BYTES elements."""

    value: Any


def read_tensor(body: dict, datatypes: Sequence[str]) -> list:
    """The items of a KServe v2 JSON body's one input tensor: its BYTES elements, or each row of a
    numeric tensor's first dimension as an array (``datatypes``: those the handler takes)."""
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
    if is_list(data):
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
    return values if datatype == "BYTES" else [values[i, ...] for i in range(shape[0])]


def as_shape(shape: Any) -> Any:
    """A shape the numeric reader made an int64 array (``parse_numeric``) as the list it was sent as."""
    if isinstance(shape, list) or not is_list(shape) or shape.ndim != 1 or len(shape) > MAX_DIMS:
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


def v2_outputs(body: dict):
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


def flat_tensors(body: dict, key: str) -> dict:
    """A v2 body whose tensors' array ``data`` is flat (a view), as v2 JSON sends it."""
    flat = [{**t, "data": t["data"].reshape(-1)} if hasattr(t.get("data"), "reshape") else t for t in body[key]]
    return {**body, key: flat}


def datatype_of(array) -> str:
    """The KServe v2 datatype of an array's dtype (in any byte order)."""
    np = numpy()
    for datatype, name in NUMERIC.items():
        if (np.dtype(name).kind, np.dtype(name).itemsize) == (array.dtype.kind, array.dtype.itemsize):
            return datatype
    raise ValueError(f"arrays of {array.dtype} have no KServe v2 datatype")
