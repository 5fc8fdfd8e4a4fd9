"""Stand-in for pytorch/serve's examples/Huggingface_Transformers/Transformer_handler_generalized.py
(written for tsctl's conformance suite), sequence classification only: a BaseHandler subclass that
reads ``setup_config.json`` (``model_name``, ``mode``, ``do_lower_case``, ``max_length``) from the
unpacked archive, loads ``AutoModelForSequenceClassification`` and ``AutoTokenizer`` from the model
directory (the weights are the archive's ``--serialized-file``, config and tokenizer files its
``--extra-files``) and answers ``{"label", "scores"}`` per text, labels from index_to_name.json. Like
the example, it prints the model's output and its size on stdout in ``inference``: a worker's stdout is
its log (TorchServe's model_log.log), never an answer."""

import json
import logging
import os

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)


class SequenceClassifierHandler(BaseHandler):
    def initialize(self, context):
        model_dir = context.system_properties["model_dir"]
        with open(os.path.join(model_dir, "setup_config.json")) as f:
            self.setup_config = json.load(f)
        if self.setup_config["mode"] != "sequence_classification":
            raise ValueError(f"mode {self.setup_config['mode']!r}: only sequence_classification is served here")
        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, do_lower_case=self.setup_config["do_lower_case"])
        with open(os.path.join(model_dir, "index_to_name.json")) as f:
            self.mapping = json.load(f)
        logger.info("loaded %s from %s", self.setup_config["model_name"], model_dir)
        self.initialized = True

    def preprocess(self, requests):
        texts = []
        for request in requests:
            text = request.get("data") or request.get("body")
            if isinstance(text, (bytes, bytearray)):
                text = text.decode("utf-8")
            texts.append(text)
        return self.tokenizer(
            texts,
            max_length=int(self.setup_config["max_length"]),
            padding=True,
            truncation=True,
            return_tensors="pt",
        )

    def inference(self, inputs):
        with torch.inference_mode():
            logits = self.model(**inputs).logits
        print("This the output size from the Seq classification model", logits.size())
        print("This the output from the Seq classification model", logits)
        return logits

    def postprocess(self, logits):
        scores = torch.softmax(logits, dim=-1)
        return [{"label": self.mapping[str(int(row.argmax()))], "scores": row.tolist()} for row in scores]
