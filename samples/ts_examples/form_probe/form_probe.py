"""A handler answering what each parameter of its request holds: its name, the type the worker decoded it
to and its value (bytes as hex), as TorchServe's frontend split a form body into fields
(serving/engine/form_bodies.py)."""

import json


def handle(data, context):
    if data is None:
        return None
    answers = []
    for row in data:
        fields = {}
        for name, value in row.items():
            shown = value.hex() if isinstance(value, (bytes, bytearray)) else value
            fields[str(name)] = [type(value).__name__, shown]
        answers.append(json.dumps(fields, sort_keys=True, default=str))
    return answers
