"""A stand-in for pytorch/serve's examples/large_models/gpt_fast/handler.py, in its shape: a
BaseHandler whose ``inference`` generates tokens one at a time and sends each decoded token to the
client as it comes (``send_intermediate_predict_response``), whose ``postprocess`` answers "" when it
streamed, its settings in model-config.yaml's ``handler`` section (``max_new_tokens``, ``stream``).

The model is a toy written for this project (gpt_fast needs a GPU, sentencepiece and a Llama
checkpoint): a seeded embedding and linear layer over a 64-word vocabulary, decoded greedily, so the
same prompt always gives the same words. ``token_seconds`` (model-config.yaml) is the time one token
takes, standing in for a real model's decode step.
"""

import json
import logging
import time

import torch
from ts.handler_utils.utils import send_intermediate_predict_response
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)

WORDS = [f"w{n:02d}" for n in range(64)]


def tiny_lm() -> torch.nn.ModuleDict:
    """The toy model (no class of its own: TorchServe's loader wants one class in a handler file)."""
    torch.manual_seed(42 * 42)
    return torch.nn.ModuleDict({"embed": torch.nn.Embedding(len(WORDS), 16), "head": torch.nn.Linear(16, len(WORDS))})


class StreamingHandler(BaseHandler):
    def __init__(self):
        super().__init__()
        self.model = None
        self.stream = True
        self.token_seconds = 0.0
        self.initialized = False

    def initialize(self, ctx):
        self.context = ctx
        settings = (ctx.model_yaml_config or {}).get("handler", {})
        self.model = tiny_lm().eval()
        self.stream = settings.get("stream", True)
        self.token_seconds = float(settings.get("token_seconds", 0.0))
        self.max_new_tokens = int(settings.get("max_new_tokens", 50))
        self.initialized = True

    def preprocess(self, requests):
        assert len(requests) == 1, "this stand-in, as gpt_fast, is only supported with batch_size=1"
        input_data = requests[0].get("data") or requests[0].get("body")
        if isinstance(input_data, (bytes, bytearray)):
            input_data = input_data.decode("utf-8")
        if isinstance(input_data, str):
            input_data = json.loads(input_data)
        prompt = input_data["prompt"]
        encoded = torch.tensor([sum(map(ord, word)) % len(WORDS) for word in prompt.split()] or [0])
        return {"encoded": encoded, "max_new_tokens": int(input_data.get("max_new_tokens", self.max_new_tokens))}

    def inference(self, input_data):
        def call_me(token: int):
            text = " " + WORDS[token]
            send_intermediate_predict_response(
                [text], self.context.request_ids, "Intermediate Prediction success", 200, self.context
            )

        return self.generate(input_data["encoded"], input_data["max_new_tokens"], call_me if self.stream else None)

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, max_new_tokens: int, callback=None) -> list:
        generated = []
        for _ in range(max_new_tokens):
            time.sleep(self.token_seconds)
            token = int(self.model["head"](self.model["embed"](tokens).mean(dim=0)).argmax())
            generated.append(token)
            tokens = torch.cat([tokens[-7:], torch.tensor([token])])
            if callback is not None:
                callback(token)
        logger.info("Num tokens = %d", len(generated))
        return generated

    def postprocess(self, generated):
        return ["" if self.stream else "".join(" " + WORDS[token] for token in generated)]
