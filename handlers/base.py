"""The lifecycle every toolkit handler shares: one TorchServe batch in, one response per request out.

    rows ──parse_request──► Request(items) | ClientError          (requests.py)
    items ──decode(item)──► model-ready input | ClientError        per item, in the subclass
    valid inputs ──preprocess──► batch ──inference──► output ──postprocess──► one answer per input
    answers regrouped per request, errors at their index with a 4xx status and a JSON body

Subclasses set ``Settings`` (a dataclass, read from model-config.yaml's ``handler:`` section) and
``item_keys``, and override ``decode``, ``preprocess``, ``inference``, ``postprocess``; optionally
``load_model`` and ``setup``. Everything runs under ``torch.inference_mode()``.
"""

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
from ts.torch_handler.base_handler import BaseHandler

from . import envelopes
from .loading import load_model, pick_device
from .requests import ClientError, Request, encode_answer, parse_request
from .settings import read_settings

logger = logging.getLogger(__name__)

JSON = "application/json"


@dataclass
class Settings:
    """Settings every toolkit handler accepts."""

    allow_pickle: bool = False  # let torch.load unpickle whole models (runs code from the MAR)


class ToolkitHandler(BaseHandler):
    Settings = Settings
    item_keys = ("data",)
    v2_datatypes = ("BYTES",)
    with_model = True  # False: only decode/preprocess/postprocess are used (a KServe transformer)

    # ---- lifecycle -------------------------------------------------------------------------
    def initialize(self, context):
        properties = context.system_properties
        self.context = context
        self.manifest = context.manifest or {}
        self.model_dir = properties.get("model_dir")
        self.model_name = context.model_name
        self.model_version = self.manifest.get("model", {}).get("modelVersion")
        self.device = pick_device(properties.get("gpu_id"))
        config_file = self.manifest.get("model", {}).get("configFile", "model-config.yaml")
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        self.settings = read_settings(self.Settings, yaml_config.get("handler"), where=config_file)
        self.model = self.load_model() if self.with_model else None
        self.setup()
        self.initialized = True
        logger.info("tsctl %s ready on %s", type(self).__name__, self.device)

    def load_model(self):
        return load_model(self.model_dir, self.manifest.get("model", {}), self.device, self.settings.allow_pickle)

    def setup(self):
        """Load anything else the handler needs (labels, tokenizer) after the model."""

    # ---- hooks -----------------------------------------------------------------------------
    def decode(self, item: Any) -> Any:
        """One raw item (bytes, text, JSON value) to a model-ready input; raise ClientError if bad."""
        return item

    def preprocess(self, inputs: List[Any]) -> Any:
        return torch.stack(inputs).to(self.device)

    def inference(self, batch: Any, *args, **kwargs) -> Any:
        return self.model(batch)

    def postprocess(self, output: Any) -> List[Any]:
        return output.tolist()

    def v2_output(self, answers: list) -> Optional[dict]:
        """A KServe v2 output tensor for these answers; None means BYTES holding JSON."""
        return None

    # ---- one batch -------------------------------------------------------------------------
    def handle(self, data, context):
        started = time.perf_counter()
        self.context = context
        requests = [self._parse(row) for row in data]

        jobs = [
            (request, position, item)
            for request in requests
            if not isinstance(request, ClientError)
            for position, item in enumerate(request.items)
        ]
        decoded = iter(self.decode_map(self._decode, jobs))
        inputs, counts = [], []
        for index, request in enumerate(requests):
            if isinstance(request, ClientError):
                continue
            mine = [next(decoded) for _ in request.items]
            error = next((d for d in mine if isinstance(d, ClientError)), None)
            if error is not None:
                requests[index] = error
                continue
            inputs.extend(mine)
            counts.append(len(mine))

        answers: list = []
        if inputs:
            with torch.inference_mode():
                answers = self.postprocess(self.inference(self.preprocess(inputs)))

        responses, offset = [], 0
        valid = iter(counts)
        for index, request in enumerate(requests):
            if isinstance(request, ClientError):
                self._set_status(context, index, request.status, "Bad Request")
                responses.append(json.dumps(request.body()))
                logger.info("tsctl request %d rejected (%d): %s", index, request.status, request.message)
            else:
                count = next(valid)
                mine = answers[offset : offset + count]
                offset += count
                body = encode_answer(request, mine, self.model_name, self._v2(request, mine), self.model_version)
                responses.append(json.dumps(body))
            self._set_content_type(context, index)

        logger.info(
            "tsctl batch size=%d items=%d rejected=%d time_ms=%.1f",
            len(requests),
            len(inputs),
            sum(isinstance(r, ClientError) for r in requests),
            (time.perf_counter() - started) * 1000,
        )
        return responses

    def _parse(self, row):
        try:
            return parse_request(row, self.item_keys, self.v2_datatypes)
        except ClientError as error:
            return error

    def decode_map(self, function, jobs):
        """Run ``function`` over the decode jobs; a handler may spread them over threads."""
        return [function(job) for job in jobs]

    def _decode(self, job):
        """One item decoded, or the ClientError it raised (named by position in a multi-item request)."""
        request, position, item = job
        try:
            return self.decode(item)
        except ClientError as error:
            if len(request.items) > 1:
                return ClientError(f"input {position}: {error.message}", error.status)
            return error

    def _v2(self, request: Request, answers: list):
        return self.v2_output(answers) if request.form == "v2" else None

    @staticmethod
    def _set_status(context, index: int, status: int, phrase: str):
        processors = getattr(context, "request_processor", None)
        if processors is not None and index < len(processors):
            context.set_response_status(status, phrase, idx=index)

    @staticmethod
    def _set_content_type(context, index: int):
        processors = getattr(context, "request_processor", None)
        if processors is not None and index < len(processors):
            context.set_response_content_type(index, JSON)


def entry_point(handler_class):
    """A TorchServe ``module:handle`` function serving ``handler_class``, one instance per model dir."""
    instances = {}

    def handle(data, context):
        key = context.system_properties.get("model_dir")
        handler = instances.get(key)
        if handler is None:
            handler = handler_class()
            handler.initialize(context)
            instances[key] = handler
        if data is None:
            return None
        return handler.handle(data, context)

    handle.handler_class = handler_class
    handle.instances = instances
    return handle


def is_toolkit_entry(function) -> bool:
    """True for a toolkit ``module:handle`` function or the ``handle`` of a toolkit handler instance."""
    return hasattr(function, "handler_class") or isinstance(getattr(function, "__self__", None), ToolkitHandler)


envelopes.step_aside_for(is_toolkit_entry)
