"""Sentence embeddings: a text in, a vector out, as sentence-transformers computes it.

Pooling over the last hidden state (mean over real tokens by default) and L2 normalisation. For a
sentence-transformers model directory the defaults are read from its own files (1_Pooling/config.json,
a Normalize module in modules.json, sentence_bert_config.json's max_seq_length), so
all-MiniLM-L6-v2 answers what ``SentenceTransformer.encode`` answers.

model-config.yaml, all optional::

    handler:
      pooling: mean      # mean | cls | max (default: the model's 1_Pooling config, else mean)
      normalize: true    # default: true when modules.json has a Normalize module, else false
      max_length: 256
"""

import os
from dataclasses import dataclass
from typing import Optional

import torch

from .base import entry_point
from .text import TextHandler, TextSettings

POOLINGS = ("mean", "cls", "max")


@dataclass
class EmbedderSettings(TextSettings):
    pooling: Optional[str] = None
    normalize: Optional[bool] = None

    def check(self):
        if self.pooling is not None and self.pooling not in POOLINGS:
            return f"'handler.pooling' must be one of {', '.join(POOLINGS)}, got {self.pooling!r}"
        return super().check()


class TextEmbedder(TextHandler):
    Settings = EmbedderSettings
    auto_class = "AutoModel"
    v2_output_name = "embedding"

    def setup(self):
        super().setup()
        self.pooling = self.settings.pooling or self.model_pooling()
        normalize = self.settings.normalize
        self.normalize = self.has_normalize_module() if normalize is None else normalize

    def model_pooling(self) -> str:
        config = self.read_json(os.path.join("1_Pooling", "config.json")) or {}
        for mode in POOLINGS:
            if config.get(f"pooling_mode_{mode}_token" if mode == "cls" else f"pooling_mode_{mode}_tokens"):
                return mode
        return "mean"

    def has_normalize_module(self) -> bool:
        modules = self.read_json("modules.json") or []
        return any(str(m.get("type", "")).endswith("Normalize") for m in modules)

    def inference(self, batch, *args, **kwargs):
        hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "max":
            pooled = hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min).max(dim=1).values
        else:
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled

    def postprocess(self, output):
        return output.float().tolist()

    def v2_output(self, answers):
        return {
            "name": self.v2_output_name,
            "shape": [len(answers), len(answers[0])],
            "datatype": "FP32",
            "data": [value for row in answers for value in row],
        }


handle = entry_point(TextEmbedder)
