"""Stand-in for pytorch/serve's examples/xgboost_classfication/xgboost_iris_handler.py (written for
tsctl's conformance suite), without xgboost: a ``BaseHandler`` subclass whose model is a linear
classifier read from the ``--serialized-file`` (``{"weights": 3x4, "bias": 3}``, JSON), labels from
``index_to_name.json``. Like the example it reads each request's body as CSV of four floats, when
it is bytes; unlike the example (whose other inputs reach xgboost and fail there with a
``TypeError`` or ``XGBoostError``) it refuses anything else itself, naming the type it got, so that
a runtime handing it a ``str`` or a decoded JSON object shows in the answer. Answers the label
(a ``str``) per request."""

import json
import logging
import os

import numpy as np
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException, load_label_mapping

logger = logging.getLogger(__name__)


class XGBIrisHandler(BaseHandler):
    def initialize(self, context):
        properties = context.system_properties
        self.manifest = context.manifest
        model_dir = properties.get("model_dir")
        weights = os.path.join(model_dir, self.manifest["model"]["serializedFile"])
        with open(weights) as file:
            model = json.load(file)
        self.weights, self.bias = np.asarray(model["weights"]), np.asarray(model["bias"])
        self.mapping = load_label_mapping(os.path.join(model_dir, "index_to_name.json"))
        logger.info("linear stand-in for XGBoost's iris classifier loaded from %s", weights)
        self.initialized = True

    def preprocess(self, requests):
        inputs = []
        for row in requests:
            value = row.get("data") or row.get("body")
            if not isinstance(value, (bytes, bytearray)):
                shown = repr(value)[:40]
                raise PredictionException(f"reads CSV bytes, got {type(value).__name__}: {shown}", 400)
            inputs.append([float(number) for number in value.decode("utf-8").split(",")])
        return np.array(inputs)

    def inference(self, data):
        return (data @ self.weights.T + self.bias).argmax(axis=1)

    def postprocess(self, result):
        return [self.mapping[str(index)] for index in result.tolist()]
