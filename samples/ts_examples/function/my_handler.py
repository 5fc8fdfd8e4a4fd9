"""A handler file with module-level functions, TorchServe's ``file.py:function`` entry point
(written for tsctl's conformance suite). TorchServe calls the entry point with ``data=None`` once
when the worker starts (``TsModelLoader._get_function_entry_point``), then with each batch:

- ``handle`` (``--handler my_handler.py``): the logits of a small MLP, per request;
- ``my_function`` (``--handler my_handler.py:my_function``): ``{"label", "probabilities"}``.

A request is a JSON body ``{"values": [four floats]}``; the model is the state_dict named by the
manifest's ``serializedFile``."""

import json
import os

import torch

LABELS = ("setosa", "versicolor", "virginica")
_model = None


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _initialize(context):
    global _model
    weights = os.path.join(context.system_properties["model_dir"], context.manifest["model"]["serializedFile"])
    model = mlp()
    model.load_state_dict(torch.load(weights, weights_only=True))
    _model = model.eval()


def _logits(data):
    rows = []
    for request in data:
        body = request.get("data") or request.get("body")
        if isinstance(body, (bytes, bytearray)):  # decode_input_request=false hands over the bytes
            body = json.loads(body)
        rows.append(body["values"])
    with torch.inference_mode():
        return _model(torch.tensor(rows, dtype=torch.float32))


def handle(data, context):
    if data is None:
        _initialize(context)
        return None
    return _logits(data).tolist()


def my_function(data, context):
    if data is None:
        _initialize(context)
        return None
    probabilities = torch.softmax(_logits(data), dim=-1)
    return [{"label": LABELS[int(p.argmax())], "probabilities": p.tolist()} for p in probabilities]
