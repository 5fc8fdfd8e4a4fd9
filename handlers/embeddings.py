"""Sentence embeddings: a text in, a vector out, as sentence-transformers computes it.

A sentence-transformers directory (one with a modules.json) runs through the sentence-transformers
library itself, so every module it lists counts: Pooling in any mode (mean, cls, max,
mean_sqrt_len_tokens, weightedmean, lasttoken, or several at once), Dense layers, Normalize, and the
Transformer's own settings (sentence_bert_config.json's max_seq_length and do_lower_case, a default
prompt): the answer is what ``SentenceTransformer.encode`` answers. Each text is still tokenised on
its own in ``decode`` (with the model's own tokenisation) and a batch padded to its longest text.
The archive's requirements then ask for sentence-transformers too (``requirements_for``). Without
the package installed, a directory whose modules the plain path below computes exactly (Transformer,
one mean/cls/max Pooling, Normalize) still loads, on that path; any other is refused, naming it.

Any other Hugging Face directory: pooling over the last hidden state (mean over real tokens by
default) and, if asked, L2 normalisation.

model-config.yaml, all optional::

    handler:
      pooling: mean      # plain directories: mean | cls | max (default: 1_Pooling/config.json's, else mean)
      normalize: true    # default: true when modules.json has a Normalize module, else false
      max_length: 256    # default: the model's max_seq_length
"""

import os
from typing import List

import torch

from . import log_text
from .base import entry_point
from .catalogue import ONNX_FILE, SENTENCE_TRANSFORMERS
from .fit import pooling_modes, sentence_modules_problem
from .loading import ModelLoadError, with_precision
from .settings import POOLINGS, EmbedderSettings
from .text import Encoded, TextHandler, read_prefix

logger = log_text.logger(__name__)


class TextEmbedder(TextHandler):
    Settings = EmbedderSettings
    auto_class = "AutoModel"
    v2_output_name = "embedding"
    v2_metadata = {
        "inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, -1]}],
    }
    directory_files = ("config.json", "modules.json")
    requirements_if_present = (("modules.json", SENTENCE_TRANSFORMERS),)

    # ---- loading ---------------------------------------------------------------------------------
    def load_model(self):
        self.hf_dir = self.hf_directory()
        self.modules = self.read_json("modules.json")
        self.sentence_model = None
        if self.modules is not None and os.path.isfile(os.path.join(self.hf_dir, ONNX_FILE)):
            # ONNX Runtime runs the transformer; the modules are the handler's to compute
            unsupported = sentence_modules_problem(self.hf_dir)
            if unsupported:
                raise ModelLoadError(f"{ONNX_FILE} beside modules.json: {unsupported} needs sentence-transformers")
        elif self.modules is not None:
            self.sentence_model = self.load_sentence_transformer()
        return self.sentence_model if self.sentence_model is not None else super().load_model()

    def load_sentence_transformer(self):
        """The directory as a SentenceTransformer, or None when the package is missing and the plain
        path computes the same embeddings."""
        types = [str(module.get("type", "")) for module in self.modules]
        foreign = [name for name in types if not name.startswith("sentence_transformers.")]
        if foreign:
            raise ModelLoadError(
                f"modules.json names the module {foreign[0]!r}, which is not one of sentence-transformers' own: "
                "the handler does not import code named by the model directory"
            )
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            unsupported = sentence_modules_problem(self.hf_dir)
            if unsupported:
                raise ModelLoadError(
                    f"this sentence-transformers directory needs the sentence-transformers package ({unsupported}): "
                    f"install {SENTENCE_TRANSFORMERS} (the archive's requirements.txt asks for it)"
                ) from None
            logger.warning("tsctl: sentence-transformers is not installed; its modules are computed without it")
            return None
        if self.settings.pooling is not None:
            raise ModelLoadError(
                "'handler.pooling' applies to plain Hugging Face directories: this one's Pooling module "
                "(modules.json) decides; remove the setting"
            )
        if self.settings.normalize is False and any(name.endswith(".Normalize") for name in types):
            raise ModelLoadError(
                "'handler.normalize: false' contradicts the Normalize module in modules.json: remove the setting"
            )
        model = SentenceTransformer(
            self.hf_dir, device=str(self.device), local_files_only=True, trust_remote_code=False
        )
        return with_precision(model.eval(), self.settings.precision)

    def setup(self):
        if self.sentence_model is None:
            super().setup()
            self.pooling = self.settings.pooling or self.model_pooling()
            normalize = self.settings.normalize
            self.normalize = self.has_normalize_module() if normalize is None else normalize
            return
        model = self.sentence_model
        self.tokenizer = model.tokenizer
        if self.settings.max_length:
            model.max_seq_length = self.settings.max_length
        self.max_length = model.max_seq_length
        self.normalize = bool(self.settings.normalize)  # on top of the modules (a Normalize module is kept)
        self.truncate_dim = getattr(model, "truncate_dim", None)
        default = getattr(model, "default_prompt_name", None)
        self.prompt = (getattr(model, "prompts", None) or {}).get(default) if default else None
        self.prompt_length = None
        if self.prompt is not None and not hasattr(model, "preprocess"):  # as encode() of releases before 6
            self.prompt_length = model.tokenize([self.prompt])["input_ids"].shape[-1] - 1

    def model_pooling(self) -> str:
        modes = pooling_modes(self.read_json(os.path.join("1_Pooling", "config.json")) or {})
        return next((mode for mode in POOLINGS if mode in modes), "mean")

    def has_normalize_module(self) -> bool:
        return any(str(m.get("type", "")).endswith("Normalize") for m in self.modules or [])

    # ---- one batch -------------------------------------------------------------------------------
    def decode(self, item) -> Encoded:
        if self.sentence_model is None:
            return super().decode(item)
        text = self.text(item)
        model = self.sentence_model

        def tokenize(part: str) -> dict:
            if hasattr(model, "preprocess"):  # sentence-transformers 6: prompt and its length handled there
                return model.preprocess([part], prompt=self.prompt)
            return model.tokenize([part if self.prompt is None else self.prompt + part])

        window = getattr(model, "max_seq_length", None)  # what it truncates to: only that much is tokenised
        if window:
            features = read_prefix(text, tokenize, lambda f: int(f["input_ids"].shape[-1]), int(window))
        else:
            features = tokenize(text)
        if not hasattr(model, "preprocess") and self.prompt_length is not None:
            features["prompt_length"] = self.prompt_length
        lists, extra = {}, {}
        for name, value in features.items():
            if torch.is_tensor(value) and value.dim() == 2 and value.shape[0] == 1:
                lists[name] = value[0].tolist()  # one row of token ids, mask, ...: padded with the batch
            else:
                extra[name] = value  # the same for every text (modality, prompt length)
        return Encoded(text, lists, extra)

    def preprocess(self, items: List[Encoded]):
        batch = super().preprocess(items)
        if self.sentence_model is not None:
            batch = dict(batch)
            for name, value in (items[0].extra or {}).items():
                batch[name] = value.to(self.device) if torch.is_tensor(value) else value
        return batch

    def inference(self, batch, *args, **kwargs):
        if self.sentence_model is not None:
            pooled = self.sentence_model(batch)["sentence_embedding"]
            if self.truncate_dim:
                pooled = pooled[..., : self.truncate_dim]
        else:
            pooled = self.pool_tokens(self.model(**batch).last_hidden_state, batch["attention_mask"])
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled

    def pool_tokens(self, hidden, attention_mask):
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        if self.pooling == "cls":
            return hidden[:, 0]
        if self.pooling == "max":
            return hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min).max(dim=1).values
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)

    def postprocess(self, output, inputs=None):
        return output.float().tolist()

    def v2_output(self, answers):
        return {
            "name": self.v2_output_name,
            "shape": [len(answers), len(answers[0])],
            "datatype": "FP32",
            "data": [value for row in answers for value in row],
        }


handle = entry_point(TextEmbedder)
