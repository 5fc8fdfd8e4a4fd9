"""A continuous-batching handler in the shape of pytorch/serve's (test/pytest/test_data/streaming/
stream_handler.py, written for this project without a language model): each step answers one "token" for
every request of the batch; a request's state is kept in ``context.cache`` under its request id (a request
sent again is in the cache and comes with no body), and ``context.stopping_criteria`` says, per request,
whether its answer is complete (TorchServe's worker then sets ``ts_stream_next``). A request:
``{"prompt": "...", "max_new_tokens": N}``; each chunk ``{"text": " WORDk"}``, WORD the prompt's first
word. A step takes the model-config.yaml's ``handler.step_seconds`` (a model's forward pass, the same
for 1 request or many)."""

import json
import time

from ts.torch_handler.base_handler import BaseHandler


class TokenHandler(BaseHandler):
    def initialize(self, ctx):
        ctx.cache = {}
        self.context = ctx
        self.step_seconds = float((ctx.model_yaml_config.get("handler") or {}).get("step_seconds", 0.02))
        self.initialized = True

    def preprocess(self, data):
        ids = list(self.context.request_ids.values())
        for request_id, row in zip(ids, data):
            if request_id not in self.context.cache:  # a newcomer: its body; one sent again has none
                body = row.get("body") if row.get("body") is not None else row.get("data")
                request = body if isinstance(body, dict) else json.loads(body)  # TorchServe decodes JSON bodies
                self.context.cache[request_id] = {
                    "word": (request["prompt"].split() or ["?"])[0],
                    "left": int(request["max_new_tokens"]),
                    "made": 0,
                }
        return ids

    def inference(self, ids, *args, **kwargs):
        time.sleep(self.step_seconds)
        chunks = []
        for request_id in ids:
            entry = self.context.cache[request_id]
            entry["made"] += 1
            entry["left"] -= 1
            chunks.append(json.dumps({"text": f" {entry['word']}{entry['made']}"}))
        return chunks

    def postprocess(self, chunks):
        self.context.stopping_criteria = [self.stops(i) for i in self.context.request_ids.values()]
        return chunks

    def stops(self, request_id):
        def stop(_answer):
            finished = self.context.cache[request_id]["left"] <= 0
            if finished:
                del self.context.cache[request_id]
            return finished

        return stop
