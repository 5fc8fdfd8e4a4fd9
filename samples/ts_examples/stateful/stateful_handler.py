"""A stand-in for pytorch/serve's examples/stateful/sequence_batching/stateful_handler.py, written for
this project: the same BaseHandler subclass keeping a running sum per sequence id
(``context.get_sequence_id``) in a least-recently-used cache sized by the model-config.yaml's
``handler.cache.capacity``, its answers the sums. The example imports ``LRU`` from the ``lru-dict``
package; the stand-in from ``lru.py`` beside it (packaged with ``--extra-files``)."""

import logging

from lru import LRU
from ts.torch_handler.base_handler import BaseHandler

logger = logging.getLogger(__name__)


class StatefulHandler(BaseHandler):
    DEFAULT_CAPACITY = 10

    def __init__(self):
        super().__init__()
        self.cache = None
        self.context = None

    def initialize(self, ctx):
        super().initialize(ctx)
        self.context = ctx
        if self.context.model_yaml_config["handler"] is not None:
            try:
                self.cache = LRU(int(self.context.model_yaml_config["handler"]["cache"]["capacity"]))
            except KeyError:
                logger.error("No cache capacity was set! Using default value.")
                self.cache = LRU(StatefulHandler.DEFAULT_CAPACITY)
        self.initialized = True

    def preprocess(self, data):
        results = []
        for idx, row in enumerate(data):
            sequence_id = self.context.get_sequence_id(idx)
            prev = int(self.cache[sequence_id]) if self.cache.has_key(sequence_id) else 0
            request = row.get("data") or row.get("body")
            if isinstance(request, (bytes, bytearray)):
                request = request.decode("utf-8")
            val = prev + int(request)
            self.cache[sequence_id] = val
            results.append(val)
        return results

    def inference(self, data, *args, **kwargs):
        return data

    def postprocess(self, data):
        return data
