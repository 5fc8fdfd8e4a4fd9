"""Tensors in, raw model outputs out: the predictor behind a KServe transformer.

Each input is one example as a tensor: a nested list (``{"instances": [[[...]]]}``, KServe v1) or a
row of a KServe v2 FP32/FP16/INT tensor (``shape: [N, ...]``). The answer is the model's output row
as a list (v2: one FP32 tensor ``[N, ...]``). The transformer (kserve_transformer.py) runs a toolkit
handler's decode/preprocess before and its postprocess after.

model-config.yaml, all optional::

    handler:
      input_shape: [3, 224, 224]   # refuse inputs of another shape with 400, before they reach the batch
      max_body_bytes: 67108864     # JSON tensors are large: 64 MiB, 16 M values by default
      max_json_values: 16777216
"""

import torch

from .base import ToolkitHandler, entry_point
from .requests import ClientError
from .settings import TensorSettings


class TensorPredictor(ToolkitHandler):
    Settings = TensorSettings
    item_keys = ("data", "tensor")
    input_kind = "tensor"
    v2_datatypes = ("FP32", "FP16", "FP64", "INT64", "INT32", "INT16", "INT8", "UINT8")

    def decode(self, item) -> torch.Tensor:
        shape = None
        if isinstance(item, dict) and "data" in item:  # a row of a KServe v2 tensor
            shape, item = item.get("shape"), item["data"]
        try:
            tensor = torch.tensor(item, dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise ClientError(f"tensor input is not a rectangular list of numbers: {exc}") from None
        if shape is not None:
            try:
                tensor = tensor.reshape(shape)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise ClientError(f"tensor input of {tensor.numel()} values cannot take shape {shape}: {exc}") from None
        if tensor.numel() == 0:
            raise ClientError(f"tensor input of shape {list(tensor.shape)} holds no values")
        expected = self.settings.input_shape
        if expected is not None and tuple(tensor.shape) != tuple(expected):
            raise ClientError(f"tensor input has shape {list(tensor.shape)}, this model takes {list(expected)}")
        return tensor

    def preprocess(self, inputs):
        shapes = sorted({tuple(t.shape) for t in inputs})
        if len(shapes) > 1:  # inputs of one request (a batch of several runs each request alone)
            raise ClientError(f"tensor inputs of one request must share one shape, got {[list(s) for s in shapes]}")
        return super().preprocess(inputs)

    def inference(self, batch, *args, **kwargs):
        try:
            output = self.model(batch)
        except RuntimeError as exc:  # raw tensors in: a shape or type the model cannot take
            raise ClientError(
                f"the model cannot take a tensor of shape {list(batch.shape[1:])}: {str(exc).splitlines()[-1]} "
                "(set handler.input_shape to refuse such inputs early)"
            ) from None
        rows = (output.shape[0] if output.dim() else 0) if isinstance(output, torch.Tensor) else len(batch)
        if rows != len(batch):  # e.g. v2 shape [4] read as 4 scalars by a model that takes rows of 4
            raise ClientError(
                f"the model answered {rows} rows for {len(batch)} inputs of shape {list(batch.shape[1:])}: it does "
                "not take inputs of that shape (v2: one row per example, shape [N, ...]; set handler.input_shape "
                "to refuse such inputs early)"
            )
        return output

    def postprocess(self, output, inputs=None):
        return output.float().tolist()

    def v2_output(self, answers):
        shape = list(torch.tensor(answers).shape)
        flat = torch.tensor(answers).flatten().tolist()
        return {"name": self.v2_output_name, "shape": shape, "datatype": "FP32", "data": flat}


handle = entry_point(TensorPredictor)
