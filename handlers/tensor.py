"""Tensors in, raw model outputs out: the predictor behind a KServe transformer.

Each input is one example as a tensor: a nested list (``{"instances": [[[...]]]}``, KServe v1) or a
row of a KServe v2 numeric tensor (``shape: [N, ...]``, FP32/FP16/FP64/INT*/UINT8, JSON or the binary
tensor extension). A v2 row arrives as the ``np.ndarray`` decoding.py read off the wire (binary: a
view of the request's bytes), is cast to float32 only when it is another type, and is copied once,
when ``preprocess`` stacks the batch. The answer is the model's output row (v2: one FP32 tensor
``[N, ...]``, in binary when the request asks). The transformer (serving/runtimes/kserve_transformer.py) runs a
toolkit handler's decode/preprocess before and its postprocess after.

model-config.yaml, all optional::

    handler:
      input_shape: [3, 224, 224]   # refuse inputs of another shape with 400, before they reach the batch
      max_body_bytes: 67108864     # JSON tensors are large: 64 MiB, 16 M values by default
      max_json_values: 16777216
"""

import numpy as np
import torch

from .base import ToolkitHandler, entry_point
from .errors import ClientError
from .settings import TensorSettings


class TensorPredictor(ToolkitHandler):
    Settings = TensorSettings
    item_keys = ("data", "tensor")
    input_kind = "tensor"
    v2_datatypes = ("FP32", "FP16", "FP64", "INT64", "INT32", "INT16", "INT8", "UINT8")
    v2_metadata = {
        "inputs": [{"name": "input-0", "datatype": "FP32", "shape": [-1, -1]}],
        "outputs": [{"name": "output-0", "datatype": "FP32", "shape": [-1, -1]}],
    }

    def decode(self, item) -> np.ndarray:
        """One input as a float32 array of its own shape: a v2 row as it came, a v1 list converted."""
        if isinstance(item, np.ndarray):  # a row of a KServe v2 tensor
            array = item
        else:
            try:
                array = np.asarray(item)
            except (ValueError, TypeError, OverflowError) as exc:
                raise ClientError(f"tensor input is not a rectangular list of numbers: {exc}") from None
            if array.dtype.kind not in "biuf":
                raise ClientError("tensor input is not a rectangular list of numbers")
        with np.errstate(over="ignore"):
            array = array.astype(np.float32, copy=False)
        if array.size == 0:
            raise ClientError(f"tensor input of shape {list(array.shape)} holds no values")
        expected = self.settings.input_shape
        if expected is not None and tuple(array.shape) != tuple(expected):
            raise ClientError(f"tensor input has shape {list(array.shape)}, this model takes {list(expected)}")
        return array

    def preprocess(self, inputs):
        shapes = sorted({a.shape for a in inputs})
        if len(shapes) > 1:  # inputs of one request (a batch of several runs each request alone)
            raise ClientError(f"tensor inputs of one request must share one shape, got {[list(s) for s in shapes]}")
        return torch.from_numpy(np.stack(inputs)).to(self.device)  # the one copy: the batch

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
        return list(output.float().cpu().numpy())  # rows of one array: encoded from it, never as lists

    def v2_output(self, answers):
        data = np.stack(answers)
        return {"name": self.v2_output_name, "shape": list(data.shape), "datatype": "FP32", "data": data}


handle = entry_point(TensorPredictor)
