"""Token classification (NER): a text in, entity spans with character offsets out.

Token scores are aggregated per word (``first``, ``average`` or ``max``, as transformers' pipeline
names them), then consecutive words of one entity type (``B-PER I-PER`` or ``PER PER``) merge into
one span. Every span's ``start``/``end`` index the request's text: ``text[start:end] == word``.

    [{"entity_group": "PER", "score": 0.98, "word": "Ada Lovelace", "start": 0, "end": 12}, ...]

model-config.yaml, all optional::

    handler:
      aggregation: average   # first | average | max
      ignore_labels: [O]
      max_length: 256
"""

from dataclasses import dataclass
from typing import List, Tuple

import torch

from .base import entry_point
from .loading import ModelLoadError
from .text import Encoded, TextHandler, TextSettings

AGGREGATIONS = ("first", "average", "max")


@dataclass
class TokenSettings(TextSettings):
    aggregation: str = "average"
    ignore_labels: Tuple[str, ...] = ("O",)

    def check(self):
        if self.aggregation not in AGGREGATIONS:
            return f"'handler.aggregation' must be one of {', '.join(AGGREGATIONS)}, got {self.aggregation!r}"
        return super().check()


class TokenClassifier(TextHandler):
    Settings = TokenSettings
    auto_class = "AutoModelForTokenClassification"
    with_offsets = True

    def setup(self):
        super().setup()
        if not self.tokenizer.is_fast:
            raise ModelLoadError("token classification needs a fast tokenizer (tokenizer.json) for character offsets")
        config = self.model.config
        self.labels = [config.id2label.get(i, str(i)) for i in range(config.num_labels)]

    def preprocess(self, items: List[Encoded]):
        return items, self.pad(items)

    def inference(self, batch, *args, **kwargs):
        items, encoding = batch
        probabilities = torch.softmax(self.model(**encoding).logits.float(), dim=-1)
        return items, probabilities.cpu()

    def postprocess(self, output):
        items, probabilities = output
        return [self.entities(item.text, item.offsets, item.word_ids, probabilities[i]) for i, item in enumerate(items)]

    def entities(self, text: str, offsets, word_ids, probabilities) -> List[dict]:
        spans = []  # (label, score, start, end) per word
        for word, tokens in group_tokens(word_ids):
            scores = self.word_scores(probabilities[tokens])
            label = int(scores.argmax())
            spans.append((self.labels[label], float(scores[label]), offsets[tokens[0]][0], offsets[tokens[-1]][1]))
        return merge_words(text, spans, set(self.settings.ignore_labels))

    def word_scores(self, token_scores: torch.Tensor) -> torch.Tensor:
        if self.settings.aggregation == "first":
            return token_scores[0]
        if self.settings.aggregation == "max":
            return token_scores[int(token_scores.max(dim=-1).values.argmax())]
        return token_scores.mean(dim=0)


def group_tokens(word_ids) -> List[Tuple[int, List[int]]]:
    """(word id, its token positions) in order; special tokens (word id None) are skipped."""
    groups: List[Tuple[int, List[int]]] = []
    for position, word in enumerate(word_ids):
        if word is None:
            continue
        if groups and groups[-1][0] == word:
            groups[-1][1].append(position)
        else:
            groups.append((word, [position]))
    return groups


def split_tag(label: str) -> Tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'PER' -> ('I', 'PER')."""
    if len(label) > 2 and label[1] in "-_" and label[0] in "BIES":
        return label[0], label[2:]
    return "I", label


def merge_words(text: str, words, ignore) -> List[dict]:
    entities: List[dict] = []
    current = None
    for label, score, start, end in words:
        if label in ignore:
            current = None
            continue
        tag, kind = split_tag(label)
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


handle = entry_point(TokenClassifier)
