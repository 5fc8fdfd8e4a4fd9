"""Sequence classification: a text in, ``{label: score}`` for the top k labels out.

Labels come from the model's ``id2label``. Scores follow transformers' TextClassificationPipeline
(``function_to_apply``): with ``function: auto`` a model whose ``problem_type`` is ``regression``
answers its raw scores; ``multi_label_classification``, or a single output without a problem type,
gets sigmoid (independent probabilities); ``single_label_classification``, or several outputs, gets
softmax. ``function: softmax | sigmoid | none`` forces one (``none``: the raw logits).

model-config.yaml, all optional::

    handler:
      top_k: 5            # 0: every label
      function: auto      # auto | softmax | sigmoid | none
      max_length: 256
"""

import torch

from .base import entry_point
from .settings import ClassifierSettings
from .text import TextHandler


def pipeline_function(config) -> str:
    """What transformers' TextClassificationPipeline applies by default to this model's logits."""
    problem = getattr(config, "problem_type", None)
    if problem == "regression":
        return "none"
    if problem == "multi_label_classification" or config.num_labels == 1:
        return "sigmoid"
    if problem == "single_label_classification" or config.num_labels > 1:
        return "softmax"
    return "none"


class TextClassifier(TextHandler):
    Settings = ClassifierSettings
    auto_class = "AutoModelForSequenceClassification"

    def setup(self):
        super().setup()
        config = self.model.config
        self.labels = [config.id2label.get(i, str(i)) for i in range(config.num_labels)]
        function = self.settings.function
        self.function = pipeline_function(config) if function == "auto" else function

    def postprocess(self, output, inputs=None):
        logits = output.logits.float()
        if self.function == "sigmoid":
            scores = torch.sigmoid(logits)
        elif self.function == "softmax":
            scores = torch.softmax(logits, dim=-1)
        else:
            scores = logits
        k = self.settings.top_k or scores.shape[-1]
        values, indices = scores.topk(min(k, scores.shape[-1]), dim=-1)
        return [
            {self.labels[i]: p for i, p in zip(row_indices, row_values)}
            for row_indices, row_values in zip(indices.tolist(), values.tolist())
        ]


handle = entry_point(TextClassifier)
