"""Token classification (NER): a text in, entity spans with character offsets out.

Tokens are grouped into words and words into entities as transformers' TokenClassificationPipeline
does with the same ``aggregation_strategy``: a token starts a new word unless the tokenizer marks it
as a continuation (WordPiece's ``##``: its text in the request is not as long as the token), word
scores are aggregated over its tokens (``first``, ``average`` or ``max``), then consecutive words of
one entity type (``B-PER I-PER`` or ``PER PER``) merge into one span whose score is the words'
mean. Every span's ``start``/``end`` index the request's text: ``text[start:end] == word``.

    [{"entity_group": "PER", "score": 0.98, "word": "Ada Lovelace", "start": 0, "end": 12}, ...]

A text longer than ``max_length`` tokens is tagged up to there, unless ``stride`` is set: then it
is split into windows of ``max_length`` tokens, each overlapping the one before by ``stride``
tokens, every window runs through the model (in batches of at most batchSize windows), and of the
entities found in overlapping windows the longest (then the highest scoring) is kept, as the
pipeline does with ``stride``. A request's windows together count against ``max_items``, so one
long text costs its request what that many short texts would, and its neighbours wait no longer.

model-config.yaml, all optional::

    handler:
      aggregation: average   # first | average | max
      ignore_labels: [O]     # entity groups left out of the answer
      max_length: 256
      stride: 64             # tag all of a long text, in windows overlapping by 64 tokens (default: truncate)
"""

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from . import log_text
from .base import entry_point
from .loading import ModelLoadError
from .settings import TokenSettings
from .text import Encoded, TextHandler, read_prefix

logger = log_text.logger(__name__)


@dataclass
class Window:
    """Up to ``max_length`` tokens of a text: the model's inputs and where each token is in the text."""

    features: dict
    ids: list
    offsets: list  # (start, end) characters per token
    special: list  # 1 for the tokenizer's special tokens ([CLS], [SEP])


class TokenClassifier(TextHandler):
    Settings = TokenSettings
    auto_class = "AutoModelForTokenClassification"

    def setup(self):
        super().setup()
        if not self.tokenizer.is_fast:
            raise ModelLoadError("token classification needs a fast tokenizer (tokenizer.json) for character offsets")
        config = self.model.config
        self.labels = [config.id2label.get(i, str(i)) for i in range(config.num_labels)]
        stride = self.settings.stride
        room = self.max_length - self.tokenizer.num_special_tokens_to_add(pair=False)
        if stride is not None and stride >= room:
            raise ModelLoadError(
                f"'handler.stride' ({stride}) must be below {room} tokens: max_length ({self.max_length}) minus "
                "the special tokens each window holds"
            )
        # WordPiece-like tokenizers mark the tokens continuing a word ("##ing"); others get the
        # pipeline's fallback (a token not after a space continues the word)
        self.word_aware = bool(getattr(self.tokenizer.backend_tokenizer.model, "continuing_subword_prefix", None))
        self.truncation_noted = False

    def decode(self, item) -> Encoded:
        text = self.text(item)
        stride = self.settings.stride
        options = {"truncation": True, "max_length": self.max_length}
        options.update(return_offsets_mapping=True, return_special_tokens_mask=True)
        if stride is not None:
            options.update(return_overflowing_tokens=True, stride=stride)
        if stride is None:  # only the first max_length tokens are read: tokenise no more (text.read_prefix)
            tokenize = lambda part: self.tokenizer(part, **options)  # noqa: E731
            encoding = read_prefix(text, tokenize, lambda e: len(e["input_ids"]), self.max_length)
        else:  # every window of the text is read: all of it is tokenised (within max_text_chars)
            encoding = self.tokenizer(text, **options)
        if stride is None:
            windows = [self.window(encoding, None)]
            if encoding.encodings[0].overflowing and not self.truncation_noted:
                self.truncation_noted = True
                logger.warning(
                    "tsctl: a text is longer than max_length (%d tokens) and is tagged up to there; set "
                    "handler.stride to tag all of it",
                    self.max_length,
                )
        else:
            count = len(encoding["input_ids"])
            self.spend(count, "windows of max_length tokens", "max_items", self.limits.max_items)
            windows = [self.window(encoding, i) for i in range(count)]
        return Encoded(text, {}, windows)

    def window(self, encoding, index: Optional[int]) -> Window:
        def row(name):
            return encoding[name] if index is None else encoding[name][index]

        features = {name: row(name) for name in self.tokenizer.model_input_names if name in encoding}
        offsets = [tuple(offset) for offset in row("offset_mapping")]
        return Window(features, list(row("input_ids")), offsets, list(row("special_tokens_mask")))

    def preprocess(self, items: List[Encoded]):
        return items  # windows are padded in inference, at most batchSize of them at a time

    def inference(self, items, *args, **kwargs):
        windows = [window for item in items for window in item.extra]
        probabilities = []
        for start in range(0, len(windows), self.batch_size):
            part = windows[start : start + self.batch_size]
            batch = self.pad([window.features for window in part])
            scores = torch.softmax(self.model(**batch).logits.float(), dim=-1).cpu()
            for row, window in zip(scores, part):
                length = len(window.ids)
                probabilities.append(row[-length:] if self.tokenizer.padding_side == "left" else row[:length])
        return probabilities  # one row per window, in order

    def postprocess(self, output, inputs=None):
        if inputs is None:
            raise TypeError(
                f"{type(self).__name__}.postprocess needs the inputs (each text and its windows): write it as "
                "postprocess(self, output, inputs) and call super().postprocess(output, inputs)"
            )
        items, scores = inputs, iter(output)
        answers = []
        for item in items:
            found = [entity for window in item.extra for entity in self.entities(item.text, window, next(scores))]
            answers.append(drop_overlaps(found) if len(item.extra) > 1 else found)
        return answers

    def entities(self, text: str, window: Window, probabilities) -> List[dict]:
        spans = []  # (label, score, start, end) per word
        for tokens in self.words(text, window):
            scores = self.word_scores(probabilities[tokens])
            label = int(scores.argmax())
            start, end = window.offsets[tokens[0]][0], window.offsets[tokens[-1]][1]
            spans.append((self.labels[label], float(scores[label]), start, end))
        return merge_words(text, spans, set(self.settings.ignore_labels))

    def words(self, text: str, window: Window) -> List[List[int]]:
        """Token positions of each word, as the pipeline's ``gather_pre_entities`` tells words apart."""
        words: List[List[int]] = []
        tokens = self.tokenizer.convert_ids_to_tokens(window.ids)
        for position, (token, (start, end)) in enumerate(zip(tokens, window.offsets)):
            if window.special[position]:
                continue
            if window.ids[position] == self.tokenizer.unk_token_id:
                continues = False
            elif self.word_aware:
                continues = len(token) != end - start
            else:
                continues = start > 0 and " " not in text[start - 1 : start + 1]
            if continues and words:
                words[-1].append(position)
            else:
                words.append([position])
        return words

    def word_scores(self, token_scores: torch.Tensor) -> torch.Tensor:
        if self.settings.aggregation == "first":
            return token_scores[0]
        if self.settings.aggregation == "max":
            return token_scores[int(token_scores.max(dim=-1).values.argmax())]
        return token_scores.mean(dim=0)


def split_tag(label: str) -> Tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'PER' -> ('I', 'PER')."""
    if len(label) > 2 and label[1] in "-_" and label[0] in "BIES":
        return label[0], label[2:]
    return "I", label


def merge_words(text: str, words, ignore) -> List[dict]:
    entities: List[dict] = []
    current = None
    for label, score, start, end in words:
        tag, kind = split_tag(label)
        if label in ignore or kind in ignore:
            current = None
            continue
        if current is not None and current["entity_group"] == kind and tag in "IE":
            current["end"] = end
            current["scores"].append(score)
        else:
            current = {"entity_group": kind, "scores": [score], "start": start, "end": end}
            entities.append(current)
    for entity in entities:
        scores = entity.pop("scores")
        entity["score"] = sum(scores) / len(scores)
        entity["word"] = text[entity["start"] : entity["end"]]
    return [{k: e[k] for k in ("entity_group", "score", "word", "start", "end")} for e in entities]


def drop_overlaps(entities: List[dict]) -> List[dict]:
    """Entities of overlapping windows, each span once: of entities that overlap the one before
    (ordered by start) the longer wins, then the higher score (the pipeline's
    ``aggregate_overlapping_entities``)."""
    if not entities:
        return entities
    ordered = sorted(entities, key=lambda entity: entity["start"])
    kept, previous = [], ordered[0]
    for entity in ordered[1:]:
        if previous["start"] <= entity["start"] < previous["end"]:
            length, previous_length = entity["end"] - entity["start"], previous["end"] - previous["start"]
            if length > previous_length or (length == previous_length and entity["score"] > previous["score"]):
                previous = entity
        else:
            kept.append(previous)
            previous = entity
    kept.append(previous)
    return kept


handle = entry_point(TokenClassifier)
