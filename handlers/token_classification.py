"""Token classification (NER): a text in, entities with character offsets out.

The answer is transformers' TokenClassificationPipeline's with the same ``aggregation_strategy``
(``handler.aggregation``):

- ``none``: every token but the O ones, ``{"entity", "score", "index", "word", "start", "end"}``
  (``index``: the token's position, [CLS] being 0);
- ``simple``: consecutive tokens grouped into entities (below);
- ``first``, ``average`` (the default), ``max``: tokens grouped into words first (a token starts a new
  word unless the tokenizer marks it as a continuation: WordPiece's ``##``, whose text in the request
  is not as long as the token), each word labelled from its first token, its tokens' mean scores or
  its highest scoring token, then words grouped into entities.

Grouping is the pipeline's ``group_entities``: a word joins the entity before it when its label is
of the same type and not a ``B-`` (``B-PER I-PER``, ``PER PER``); the entity is named by its first
label after its first '-' and scored by its words' mean score:

    [{"entity_group": "PER", "score": 0.98, "word": "Ada Lovelace", "start": 0, "end": 12}, ...]

Where tsctl differs on purpose (docs/handlers.md): a BIOES ``E-`` word ends its entity and an ``S-``
word is one of its own (the pipeline reads neither prefix and splits ``B-PER I-PER E-PER`` in two);
``word`` is the request's own text, ``text[start:end]`` (the pipeline's is rebuilt from the tokens:
lower-cased, accents stripped, spaces around punctuation); an empty or whitespace-only text is a 400
(the pipeline answers ``[]``). Prefixes are read as the pipeline reads them: only upper-case ``B-``
and ``I-`` (and ``E-``, ``S-``) mark a span's start or continuation, so ``b-per i-per`` is two
entities named ``per``, and ``b-per b-per`` one.

A text longer than ``max_length`` tokens is tagged up to there, unless ``stride`` is set: then it
is split into windows of ``max_length`` tokens, each overlapping the one before by ``stride``
tokens, every window runs through the model (in batches of at most batchSize windows), and of the
entities found in overlapping windows the longest (then the highest scoring) is kept, as the
pipeline does with ``stride`` (which, as the pipeline, needs an aggregation other than ``none``).
A request's windows together count against ``max_items``, so one long text costs its request what
that many short texts would, and its neighbours wait no longer.

model-config.yaml, all optional::

    handler:
      aggregation: average   # none | simple | first | average | max
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
        """The window's entities: tokens (``none``, ``simple``) or words, each with its label and score,
        then (but for ``none``) grouped into spans as the pipeline's ``group_entities`` does."""
        token_level = self.settings.aggregation in ("none", "simple")
        if token_level:
            groups = [[position] for position, special in enumerate(window.special) if not special]
        else:
            groups = self.words(text, window)
        tagged = []  # (label, score, start, end, first token) per token or word
        for tokens in groups:
            scores = self.word_scores(probabilities[tokens])
            label = int(scores.argmax())
            start, end = window.offsets[tokens[0]][0], window.offsets[tokens[-1]][1]
            tagged.append((self.labels[label], float(scores[label]), start, end, tokens[0]))
        ignore = set(self.settings.ignore_labels)
        if self.settings.aggregation == "none":
            return [
                {"entity": label, "score": score, "index": index, "word": text[start:end], "start": start, "end": end}
                for label, score, start, end, index in tagged
                if label not in ignore
            ]
        return group_entities(text, [entry[:4] for entry in tagged], ignore)

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
        if self.settings.aggregation == "average":
            return token_scores.mean(dim=0)
        if self.settings.aggregation == "max":
            return token_scores[int(token_scores.max(dim=-1).values.argmax())]
        return token_scores[0]  # first; none and simple: one token


def split_tag(label: str) -> Tuple[str, str]:
    """A label as the pipeline's ``get_tag`` reads it: 'B-PER' -> ('B', 'PER'), 'I-PER' -> ('I', 'PER'),
    anything else -> ('I', label), lower-case prefixes too ('b-per' -> ('I', 'b-per')). tsctl also
    reads BIOES's 'E-PER' -> ('E', 'PER') and 'S-PER' -> ('S', 'PER')."""
    if label[:2] in ("B-", "I-", "E-", "S-"):
        return label[0], label[2:]
    return "I", label


def group_entities(text: str, words, ignore) -> List[dict]:
    """Consecutive words (or tokens) as the pipeline's ``group_entities`` merges them: one of the same
    type (``split_tag``) joins the span before it unless it is a ``B-`` (``PER PER``, ``B-PER I-PER``
    and ``b-per b-per`` merge, ``B-PER B-PER`` and ``b-per i-per`` do not); the span is named by its
    first label after its first '-' (``b-per`` -> ``per``), scored by its words' mean, and left out when
    that name is in ``ignore``. Unlike the pipeline, an ``E-`` word ends its span (it joins the span
    before it, and the next word starts a new one) and an ``S-`` word is a span of its own."""
    entities: List[dict] = []
    kind, closed = None, True
    for label, score, start, end in words:
        tag, word_kind = split_tag(label)
        if not closed and word_kind == kind and tag in "IE":
            entities[-1]["end"] = end
            entities[-1]["scores"].append(score)
        else:
            entities.append({"entity_group": label.split("-", 1)[-1], "scores": [score], "start": start, "end": end})
        kind, closed = word_kind, tag in "ES"
    for entity in entities:
        scores = entity.pop("scores")
        entity["score"] = sum(scores) / len(scores)
        entity["word"] = text[entity["start"] : entity["end"]]
    keys = ("entity_group", "score", "word", "start", "end")
    return [{key: e[key] for key in keys} for e in entities if e["entity_group"] not in ignore]


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
