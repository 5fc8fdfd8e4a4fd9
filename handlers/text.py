"""What the Hugging Face handlers share: a model directory, a tokenizer, text requests, dynamic padding.

The archive's serialized file is a directory written by ``save_pretrained`` (config.json, weights,
tokenizer files). Each text is tokenised on its own in ``decode`` (so a text the tokenizer chokes
on fails its own request) and truncated to ``max_length`` tokens; a batch is padded to its longest
text, not to ``max_length``.

model-config.yaml, all optional::

    handler:
      max_length: 256   # default: sentence_bert_config.json's max_seq_length, else the tokenizer's, at most 512
      padding: longest  # or max_length (every text padded to max_length: only for comparisons)
      max_text_chars: 100000  # a longer text is refused with 413 (the tokenizer reads all of it)
"""

import json
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence

from .base import Settings, ToolkitHandler
from .loading import ModelLoadError
from .requests import to_text, too_large

MAX_LENGTH_CAP = 512


PADDINGS = ("longest", "max_length")


@dataclass
class Encoded:
    """One tokenised text: the model's inputs (unpadded lists) and, if asked for, where tokens are."""

    text: str
    features: dict
    offsets: Optional[list] = None  # (start, end) characters per token
    word_ids: Optional[list] = None  # word index per token, None for special tokens


@dataclass
class TextSettings(Settings):
    max_length: Optional[int] = None
    padding: str = "longest"  # max_length: pad every text to max_length (only to compare; it is slower)
    max_text_chars: int = 100_000

    def check(self):
        if self.max_length is not None and self.max_length < 2:
            return "'handler.max_length' must be at least 2 tokens"
        if self.padding not in PADDINGS:
            return f"'handler.padding' must be one of {', '.join(PADDINGS)}, got {self.padding!r}"
        if self.max_text_chars < 1:
            return "'handler.max_text_chars' must be at least 1"
        return super().check()


class TextHandler(ToolkitHandler):
    """Base for the transformers handlers; subclasses set ``auto_class`` and the post-processing."""

    Settings = TextSettings
    item_keys = ("text", "inputs", "data")
    input_kind = "text"
    # What the archive's requirements.txt asks for: every release these handlers are tested on, from the
    # transformers in torchserve-kfs:0.9.0 (4.34, Python 3.9) to 5.x (see archiver/runtimes.py).
    requirements = ("transformers>=4.34,<6",)
    auto_class = "AutoModel"

    def load_model(self):
        import transformers

        transformers.utils.logging.disable_progress_bar()
        self.hf_dir = self.hf_directory()
        model = getattr(transformers, self.auto_class).from_pretrained(self.hf_dir, local_files_only=True)
        return model.to(self.device).eval()

    def setup(self):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.hf_dir, local_files_only=True)
        self.max_length = self.settings.max_length or self.default_max_length()

    def hf_directory(self) -> str:
        serialized = self.manifest.get("model", {}).get("serializedFile")
        path = os.path.join(self.model_dir, serialized or "")
        if not serialized or not os.path.isfile(os.path.join(path, "config.json")):
            raise ModelLoadError(
                f"{serialized or 'the serialized file'} is not a Hugging Face model directory (no config.json): "
                "package the directory save_pretrained wrote with --serialized-file"
            )
        return path

    def read_json(self, name):
        """A JSON file of the model directory (sentence-transformers' own settings), or None."""
        path = os.path.join(self.hf_dir, name)
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def default_max_length(self) -> int:
        length = (self.read_json("sentence_bert_config.json") or {}).get("max_seq_length")
        if length:
            return int(length)
        return min(int(getattr(self.tokenizer, "model_max_length", MAX_LENGTH_CAP)), MAX_LENGTH_CAP)

    with_offsets = False  # token classification: keep character offsets and word ids

    def decode(self, item) -> Encoded:
        text = to_text(item, "text")
        if len(text) > self.settings.max_text_chars:
            raise too_large("the text is", len(text), "characters", "max_text_chars", self.settings.max_text_chars)
        encoding = self.tokenizer(
            text, truncation=True, max_length=self.max_length, return_offsets_mapping=self.with_offsets
        )
        features = {name: encoding[name] for name in self.tokenizer.model_input_names if name in encoding}
        if not self.with_offsets:
            return Encoded(text, features)
        return Encoded(text, features, encoding["offset_mapping"], encoding.word_ids())

    def pad(self, items: Sequence[Encoded]):
        """One batch of tensors, padded to the longest text (or to max_length with padding: max_length)."""
        batch = self.tokenizer.pad(
            [item.features for item in items],
            padding=self.settings.padding,
            max_length=self.max_length,
            return_tensors="pt",
        )
        return batch.to(self.device)

    def preprocess(self, items: List[Encoded]):
        return self.pad(items)

    def inference(self, batch, *args, **kwargs):
        return self.model(**batch)
