"""KServe v2 model metadata (``GET /v2/models/NAME``, gRPC ``ModelMetadata``): the inputs and outputs a model
declares, read once when its archive is opened (``declared``).

- A toolkit handler declares them (its class's ``v2_metadata``, recorded in MAR-INF/tsctl.json by
  ``tsctl package``).
- Any handler may declare them in its model-config.yaml, which wins over the record::

      v2_metadata:
        inputs:  [{name: input-0, datatype: FP32, shape: [-1, 3, 224, 224]}]
        outputs: [{name: output-0, datatype: FP32, shape: [-1, 1000]}]

  (TorchServe passes the section to the handler and ignores it.) ``tsctl package`` checks it (``check``).
- Otherwise the REST answer's ``inputs`` and ``outputs`` are empty and its ``note`` says they are not
  declared and how to declare them (gRPC's message has no field for it: empty lists).
"""

from typing import Optional

SECTION = "v2_metadata"
# KServe v2 (Open Inference Protocol) tensor datatypes
DATATYPES = (
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
)
MAX_TENSORS = 64  # declared inputs or outputs
MAX_RANK = 16
NOT_DECLARED = (
    f"the model declares no inputs or outputs: give its model-config.yaml a {SECTION} section "
    "(inputs and outputs, each name, datatype, shape), or package it with a tsctl handler"
)


class MetadataError(ValueError):
    """A v2_metadata section that cannot be served: one line naming the file, the key and the fix."""


def check(section, where: str) -> dict:
    """The section as served ({"inputs": [...], "outputs": [...]}), or MetadataError."""
    if not isinstance(section, dict) or set(section) - {"inputs", "outputs"}:
        raise MetadataError(f"{where}: {SECTION} must be a mapping of inputs and outputs")
    checked = {}
    for side in ("inputs", "outputs"):
        tensors = section.get(side, [])
        if not isinstance(tensors, list) or len(tensors) > MAX_TENSORS:
            raise MetadataError(f"{where}: {SECTION}.{side} must be a list of at most {MAX_TENSORS} tensors")
        checked[side] = [tensor(t, f"{where}: {SECTION}.{side}[{i}]") for i, t in enumerate(tensors)]
    return checked


def tensor(value, where: str) -> dict:
    if not isinstance(value, dict) or set(value) != {"name", "datatype", "shape"}:
        raise MetadataError(f"{where} must have name, datatype and shape, nothing else")
    name, datatype, shape = value["name"], value["datatype"], value["shape"]
    if not isinstance(name, str) or not name or len(name) > 256:
        raise MetadataError(f"{where}: name must be text of 1 to 256 characters")
    if datatype not in DATATYPES:
        raise MetadataError(f"{where}: datatype {str(datatype)[:40]!r} is not one of {', '.join(DATATYPES)}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or any(isinstance(d, bool) or not isinstance(d, int) or d < -1 for d in shape)
    ):
        raise MetadataError(f"{where}: shape must be a list of at most {MAX_RANK} sizes, each -1 (any) or more")
    return {"name": name, "datatype": datatype, "shape": list(shape)}


def declared(config: dict, record: Optional[dict], where: str) -> Optional[dict]:
    """What the archive declares: its model-config.yaml's section, else its toolkit record's, else None."""
    if SECTION in config:
        return check(config[SECTION], where)
    if record and isinstance(record.get("v2"), dict):
        try:
            return check(record["v2"], f"{where} (MAR-INF/tsctl.json)")
        except MetadataError:
            return None  # a record it cannot read declares nothing
    return None


def rest_body(name: str, versions: list, metadata: Optional[dict]) -> dict:
    """The REST answer (KServe's ModelMetadataResponse; ``note`` when nothing is declared)."""
    body = {"name": name, "versions": versions, "platform": "pytorch_torchserve"}
    if metadata is None:
        return {**body, "inputs": [], "outputs": [], "note": NOT_DECLARED}
    return {**body, "inputs": metadata["inputs"], "outputs": metadata["outputs"]}
