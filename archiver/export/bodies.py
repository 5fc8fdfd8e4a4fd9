"""The request bodies DEPLOY.md builds for each served model (``Served``), by the kind of input its
handler takes: the python3 commands writing them, the files under OUT/inputs/ they are built from (a
picture drawn here, a golden input of the archive), and DEPLOY.md's sections saying so
(templates/body-*.md)."""

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .archive_facts import ArchiveFacts
from .core import render


@dataclass
class Served:
    """A model clients call through the InferenceService, and what its requests hold."""

    name: str
    handler: str
    kind: Optional[str]  # "image", "text", "tensor"; None for a handler of the user's own
    shape: Optional[List[int]] = None  # a tensor model's handler.input_shape
    golden: Optional[dict] = None  # the golden answers of the archive serving it (package --golden), if any
    sample: Optional[str] = None  # the file (relative to OUT) its request body is built from: sample_inputs()

    @property
    def input_file(self) -> str:
        return f"input-{self.kind}.json" if self.kind in ("image", "text") else f"input-{self.name}.json"


# Request bodies, built by python3 from a file, a text or a shape (the variable x in the body), each command
# writing its file itself, after reading its input: a missing input is one line on stderr, and no empty body.
INPUTS_DIR = "inputs"  # OUT/inputs/: the files DEPLOY.md's request bodies are built from
SAMPLE_IMAGE = f"{INPUTS_DIR}/sample.png"
FILE_READER = (
    "import base64, json, os, sys; "
    'os.path.isfile(sys.argv[1]) or sys.exit("error: no file at " + repr(sys.argv[1]) + ": set {variable} to {what}"); '
    'x = base64.b64encode(open(sys.argv[1], "rb").read()).decode()'
)
READERS = {  # kind: (variable, python reading it into x)
    "image": ("IMAGE", FILE_READER.format(variable="IMAGE", what="an image file (JPEG, PNG, ...)")),
    "text": ("TEXT", "import json, sys; x = sys.argv[1]"),
    None: ("INPUT", FILE_READER.format(variable="INPUT", what="a file your handler reads")),
}
V1_FILE = '{"instances": [{"data": x}]}'
V1_BODIES = {"image": V1_FILE, "text": '{"instances": [x]}', None: V1_FILE}
V2_BODY = '{"inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": [x]}]}'
WRITE = 'open(sys.argv[-1], "w").write(json.dumps({body}))'


def input_command(protocol: str, model: Served) -> str:
    """A shell line writing ``model.input_file`` (from $IMAGE, $TEXT, $INPUT or $SHAPE, as the model takes)."""
    if model.kind == "tensor":
        if model.shape:
            shape = f"s = {[int(n) for n in model.shape]}"
        else:
            shape = (
                's = [int(n) for n in sys.argv[1].split()] or sys.exit("error: set SHAPE to the input shape of one '
                'row of your model, e.g. 3 224 224")'
            )
        if protocol == "v2":
            body = (
                '{"inputs": [{"name": "input-0", "shape": [1, *s], "datatype": "FP32", "data": [0.0] * math.prod(s)}]}'
            )
        else:
            body = '{"instances": [functools.reduce(lambda t, n: [t] * n, s[::-1], 0.0)]}'
        code = f"import functools, json, math, sys; {shape}; {WRITE.format(body=body)}"
        argument = "" if model.shape else '"$SHAPE" '
        return f"python3 -c '{code}' {argument}{model.input_file}"
    kind = model.kind if model.kind in READERS else None
    variable, read = READERS[kind]
    body = V2_BODY if protocol == "v2" else V1_BODIES[kind]
    return f"python3 -c '{read}; {WRITE.format(body=body)}' \"${variable}\" {model.input_file}"


def sample_png(size: int = 64) -> bytes:
    """A small RGB gradient as a PNG (zlib and struct: no image library), the image DEPLOY.md sends when it
    has none of the user's."""
    import struct
    import zlib

    rows = b"".join(b"\0" + bytes(v for x in range(size) for v in (4 * x % 256, 4 * y % 256, 128)) for y in range(size))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def sample_answers(facts: ArchiveFacts) -> Optional[dict]:
    """The golden answers a served model's sample input may come from: a handler of the user's own (no input
    kind) is sent the first of them (``sample_inputs``); the toolkit's get a drawn picture, and theirs are
    not looked at."""
    return facts.golden_answers() if facts.input is None else None


def golden_input(recorded: Optional[dict]) -> Optional[Tuple[str, bytes]]:
    """The first golden input (package --golden) an archive answered with 200, when it is a file's bytes
    (not a JSON request body): (a file name for it, its bytes). None without one."""
    from handlers import golden

    for case in (recorded or {}).get("cases", []):
        if case["status"] == 200 and not case["content_type"].startswith("application/json"):
            name = re.sub(r"[^A-Za-z0-9._-]+", "_", case["name"]).strip("._-")[:64] or "input"
            return name, golden.body(case)
    return None


def sample_inputs(models: List[Served]) -> Dict[str, bytes]:
    """The files under OUT/inputs/ that the request bodies of ``models`` are built from, by path relative to
    OUT; sets each model's ``sample``. An image model gets a picture drawn here; a handler of the user's own
    the first input its golden answers were 200 for, else that picture too. Text and tensor models need none."""
    files: Dict[str, bytes] = {}
    for model in models:
        if model.kind in ("text", "tensor"):
            continue
        found = golden_input(model.golden) if model.kind is None else None
        if found:
            model.sample = f"{INPUTS_DIR}/{model.name}-{found[0]}"
            files[model.sample] = found[1]
        else:
            model.sample = SAMPLE_IMAGE
            files[SAMPLE_IMAGE] = sample_png()
    return files


def request_bodies(protocol: str, models: List[Served]) -> str:
    """DEPLOY.md's commands writing each model's request body (``protocol`` v1 or v2), by its handler's kind,
    from the files sample_inputs() chose (call it first)."""
    sections = []
    images = [m for m in models if m.kind == "image"]
    if images:
        first = images[0]
        sections.append(
            render(
                "body-image",
                names=", ".join(m.name for m in images),
                input_file=first.input_file,
                sample_image=SAMPLE_IMAGE,
                sample=first.sample or SAMPLE_IMAGE,
                command=input_command(protocol, first),
            )
        )
    texts = [m for m in models if m.kind == "text"]
    if texts:
        names = ", ".join(m.name for m in texts)
        sections.append(
            render("body-text", names=names, input_file=texts[0].input_file, command=input_command(protocol, texts[0]))
        )
    for model in models:
        if model.kind == "tensor":
            section = "body-tensor" if model.shape else "body-tensor-unknown-shape"
            command = input_command(protocol, model)
            sections.append(
                render(section, name=model.name, input_file=model.input_file, shape=model.shape, command=command)
            )
        elif model.kind not in ("image", "text"):
            sections.append(custom_body(protocol, model))
    return "".join(sections)


CUSTOM_V2 = (
    "a v2 BYTES tensor of one element, the file's bytes in base64: TorchServe's v2 envelope hands that string "
    "to the handler as the request's `data` (an FP32 tensor would reach it as nested lists, which a handler "
    "reading files refuses)"
)
CUSTOM_V1 = (
    '`{"instances": [{"data": ...}]}`, the file\'s bytes in base64, which the v1 envelope hands to the handler as a row'
)


def custom_body(protocol: str, model: Served) -> str:
    """A handler of the user's own: what it reads is its own, so its body carries a file's bytes, in base64,
    as TorchServe's KServe envelopes hand each request to a handler (``data``), which TorchServe's own
    handlers decode. From the first golden input the archive answered 200 for, else the drawn picture."""
    if model.sample and model.sample != SAMPLE_IMAGE:
        source = f"`{model.sample}` is the first input its golden answers (package --golden) answered 200 for"
    else:
        source = (
            f"`{SAMPLE_IMAGE}` is a picture tsctl drew (the archive has no golden answers to take one from): set INPUT "
            f"to a file of what your handler reads, what 'tsctl predict {model.name} FILE' would send"
        )
    return render(
        "body-custom",
        name=model.name,
        handler=model.handler,
        input_file=model.input_file,
        shape=CUSTOM_V2 if protocol == "v2" else CUSTOM_V1,
        source=source,
        sample=model.sample or SAMPLE_IMAGE,
        command=input_command(protocol, model),
    )
