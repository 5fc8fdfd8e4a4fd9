"""What the Hugging Face handlers share: a model directory, a tokenizer, text requests, dynamic padding.

The archive's serialized file is a directory written by ``save_pretrained`` (config.json, weights,
tokenizer files). Each text is tokenised on its own in ``decode`` (so a text the tokenizer chokes
on fails its own request) and truncated to ``max_length`` tokens; a batch is padded to its longest
text, not to ``max_length``. Only what the model reads is tokenised (``read_prefix``): a 100,000
character text is cut where its first ``max_length`` tokens surely end, with the same tokens, ids
and offsets as the whole text gives (8 requests of 32 such texts tokenised for 52 s).

A ``text/*`` body is one text, even when it looks like JSON: it is never parsed
(``decoding.text_request``, with the body's Content-Type from the request's headers, so both
``decode_input_request`` settings read it the same). ``application/json`` bodies are JSON.

model-config.yaml, all optional::

    handler:
      max_length: 256   # default: sentence_bert_config.json's max_seq_length, else the tokenizer's, at most 512
      padding: longest  # or max_length (every text padded to max_length: only for comparisons)
      max_text_chars: 100000  # a longer text is refused with 413 (the tokenizer reads all of it)
"""

import json
import os
from dataclasses import dataclass
from typing import Any, List, Sequence

from .base import Job, ToolkitHandler, client_error, request_headers
from .catalogue import ONNX_FILE, TRANSFORMERS
from .decoding import text_request
from .errors import too_large
from .items import to_text
from .loading import ModelLoadError, to_device, with_precision
from .onnx_runtime import OnnxModel
from .settings import TextSettings
from .v2_binary import header_length

MAX_LENGTH_CAP = 512
CHARS_PER_TOKEN = 8  # read_prefix's first cut: max_length x this many characters, then 4x more each time
CUTS = (" ", "\n", "\t")  # where every tokenizer's pre-tokenizer splits: a cut there changes no token before it


def read_prefix(text: str, tokenize, count, window: int):
    """``tokenize(text)`` (truncating to ``window`` tokens), paying only for the part of ``text`` the
    window holds: ``tokenize`` a prefix cut at whitespace after ``window x CHARS_PER_TOKEN``
    characters; when its encoding already fills the window (``count(encoding) >= window``), the
    whole text's is the same (tokens before a whitespace cut do not depend on what follows), else
    try a prefix 4 times longer, up to the whole text. A text without whitespace near the cut is
    tokenised whole (it is within max_text_chars)."""
    limit = window * CHARS_PER_TOKEN
    while limit < len(text):
        cut = max(text.rfind(c, 0, limit) for c in CUTS)
        if cut <= 0:
            break
        encoding = tokenize(text[:cut])
        if count(encoding) >= window:
            return encoding
        limit *= 4
    return tokenize(text)


@dataclass
class Encoded:
    """One tokenised text: the model's inputs (unpadded lists) and anything a handler keeps with them."""

    text: str
    features: dict
    extra: Any = None


class TextHandler(ToolkitHandler):
    """Base for the transformers handlers; subclasses set ``auto_class`` and the post-processing."""

    Settings = TextSettings
    item_keys = ("text", "inputs", "data")
    input_kind = "text"
    requirements = (TRANSFORMERS,)
    auto_class = "AutoModel"

    def load_model(self):
        import transformers

        transformers.utils.logging.disable_progress_bar()
        self.hf_dir = self.hf_directory()
        onnx = os.path.join(self.hf_dir, ONNX_FILE)
        if os.path.isfile(onnx):  # the same directory exported to ONNX: ONNX Runtime runs it
            config = transformers.AutoConfig.from_pretrained(
                self.hf_dir, local_files_only=True, trust_remote_code=False
            )
            return with_precision(OnnxModel(onnx, config), self.settings.precision)  # fp32 only: said at load
        model = getattr(transformers, self.auto_class).from_pretrained(
            self.hf_dir, local_files_only=True, trust_remote_code=False
        )
        return with_precision(model.to(self.device).eval(), self.settings.precision)

    def setup(self):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.hf_dir, local_files_only=True, trust_remote_code=False)
        self.max_length = self.settings.max_length or self.default_max_length()

    directory_files = ("config.json",)  # the serialized directory holds one of these

    def hf_directory(self) -> str:
        serialized = self.manifest.get("model", {}).get("serializedFile")
        path = os.path.join(self.model_dir, serialized or "")
        if not serialized or not any(os.path.isfile(os.path.join(path, name)) for name in self.directory_files):
            raise ModelLoadError(
                f"{serialized or 'the serialized file'} is not a Hugging Face model directory (no "
                f"{' or '.join(self.directory_files)}): package the directory save_pretrained wrote "
                "with --serialized-file"
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

    # ---- requests ------------------------------------------------------------------------------
    def read(self, row, index: int = 0) -> Job:
        """A text body (``text/*``, or text TorchServe decoded already) is one text, never JSON;
        anything else is read as every handler reads it (JSON shapes, KServe v1/v2, binary v2)."""
        try:
            headers = request_headers(self.context, index)
            request = None if header_length(headers) is not None else text_request(row, headers, self.limits)
        except Exception as exc:  # noqa: BLE001 - one request's problem, whatever it is
            return Job(None, client_error(exc, "the request could not be read"))
        return super().read(row, index) if request is None else Job(request)

    def text(self, item) -> str:
        """One item as a text within ``max_text_chars``, or the ClientError its request gets."""
        text = to_text(item, "text")
        if len(text) > self.settings.max_text_chars:
            raise too_large("the text is", len(text), "characters", "max_text_chars", self.settings.max_text_chars)
        return text

    def features(self, encoding) -> dict:
        """The model's inputs from a tokenizer's answer (what ``pad`` takes)."""
        return {name: encoding[name] for name in self.tokenizer.model_input_names if name in encoding}

    def decode(self, item) -> Encoded:
        text = self.text(item)
        encoding = read_prefix(
            text,
            lambda part: self.tokenizer(part, truncation=True, max_length=self.max_length),
            lambda encoding: len(encoding["input_ids"]),
            self.max_length,
        )
        return Encoded(text, self.features(encoding))

    def pad(self, features: Sequence[dict]):
        """One batch of tensors, padded to the longest text (or to max_length with padding: max_length)."""
        batch = self.tokenizer.pad(
            list(features), padding=self.settings.padding, max_length=self.max_length, return_tensors="pt"
        )
        for name, value in batch.items():  # tokenized in decode's threads; here only the copy (pinned, to a GPU)
            batch[name] = to_device(value, self.device)
        return batch

    def preprocess(self, items: List[Encoded]):
        return self.pad([item.features for item in items])

    def inference(self, batch, *args, **kwargs):
        return self.model(**batch)
