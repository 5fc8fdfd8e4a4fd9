"""Sequence classification: a text in, ``{label: probability}`` for the top k labels out.

Labels come from the model's ``id2label``. Softmax for single-label models; sigmoid (independent
probabilities) when the model's ``problem_type`` is ``multi_label_classification`` or
``handler.function: sigmoid`` says so.

model-config.yaml, all optional::

    handler:
      top_k: 5            # 0: every label
      function: auto      # auto | softmax | sigmoid
      max_length: 256
"""

from dataclasses import dataclass

import torch

from .base import entry_point
from .text import TextHandler, TextSettings

FUNCTIONS = ("auto", "softmax", "sigmoid")


@dataclass
class ClassifierSettings(TextSettings):
    top_k: int = 5
    function: str = "auto"

    def check(self):
        if self.function not in FUNCTIONS:
            return f"'handler.function' must be one of {', '.join(FUNCTIONS)}, got {self.function!r}"
        if self.top_k < 0:
            return "'handler.top_k' must be 0 (every label) or more"
        return super().check()


class TextClassifier(TextHandler):
    Settings = ClassifierSettings
    auto_class = "AutoModelForSequenceClassification"

    def setup(self):
        super().setup()
        config = self.model.config
        self.labels = [config.id2label.get(i, str(i)) for i in range(config.num_labels)]
        function = self.settings.function
        if function == "auto":
            function = "sigmoid" if config.problem_type == "multi_label_classification" else "softmax"
        self.function = function

    def postprocess(self, output):
        logits = output.logits.float()
        if self.function == "sigmoid":
            probabilities = torch.sigmoid(logits)
        else:
            probabilities = torch.softmax(logits, dim=-1)
        k = self.settings.top_k or probabilities.shape[-1]
        values, indices = probabilities.topk(min(k, probabilities.shape[-1]), dim=-1)
        return [
            {self.labels[i]: p for i, p in zip(row_indices, row_values)}
            for row_indices, row_values in zip(indices.tolist(), values.tolist())
        ]


handle = entry_point(TextClassifier)
