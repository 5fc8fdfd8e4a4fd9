"""What a handler receives (written for tsctl's conformance suite): a ``handle(data, context)`` entry
point answering, per request, the row's keys and the type and value of its body, as TorchServe's worker
decoded it by the request's Content-Type (``ts/protocol/otf_message_handler.py``): the decoded JSON for
application/json, a str for text/..., the bytes otherwise or when it cannot decode them. Bytes are
answered in base64, everything else as it came."""

import base64


def handle(data, context):
    if data is None:  # TorchServe's first call, when the worker starts
        return None
    answers = []
    for row in data:
        value = row["body"] if "body" in row else row.get("data")
        shown = base64.b64encode(value).decode("ascii") if isinstance(value, (bytes, bytearray)) else value
        answers.append({"keys": sorted(row), "type": type(value).__name__, "value": shown})
    return answers
