"""Stand-in for pytorch/serve's examples/micro_batching/micro_batching_handler.py (written for tsctl's
conformance suite): the MNIST classifier of the mnist case whose ``handle`` is TorchServe's
``MicroBatching`` (ts/handler_utils/micro_batching.py). That object runs preprocess, inference and
postprocess in threads of its own, non-daemon threads started when the handler is made and again in
``initialize``, from model-config.yaml's ``micro_batching`` section, and never stopped: whatever runs
the archive must end without waiting for them (TorchServe's worker is a process that is killed)."""

import logging

from torchvision import transforms
from ts.handler_utils.micro_batching import MicroBatching
from ts.torch_handler.image_classifier import ImageClassifier

logger = logging.getLogger(__name__)


class MicroBatchingDigitClassifier(ImageClassifier):
    image_processing = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])

    def __init__(self):
        super().__init__()
        self.handle = MicroBatching(self)

    def initialize(self, context):
        super().initialize(context)
        settings = context.model_yaml_config.get("micro_batching", {})
        if settings.get("parallelism"):
            logger.info("micro batching parallelism: %s", settings["parallelism"])
            self.handle.parallelism = settings["parallelism"]
        self.handle.micro_batch_size = settings.get("micro_batch_size", 1)

    def postprocess(self, data):
        return data.argmax(1).tolist()
