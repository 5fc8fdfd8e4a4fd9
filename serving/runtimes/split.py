"""A toolkit handler run apart from its model: decode/preprocess a request into one tensor, postprocess the
model's raw output into answers. What a KServe transformer (serving/runtimes/kserve_transformer.py) and a Seldon
pipeline's pre- and postprocessing steps (serving/runtimes/mlserver_runtime.py) both run; no server library here.

Only handlers whose ``splits`` is true (MAR-INF/tsctl.json) can: their preprocess turns a request into one
batch tensor and their postprocess needs nothing but the model's output (the image classifier's).
"""

import importlib
import sys
import tempfile
from typing import List

import numpy as np
import torch
import ts
from ts.context import Context

from handlers import identity, protocol
from handlers.archives import ArchiveError, ArchiveLike, opened
from handlers.base import Job


def load_handler(archive: ArchiveLike, with_model: bool = False):
    """The archive's toolkit handler, initialised like a worker's (weights only if ``with_model``)."""
    with opened(archive) as found:
        record = identity.read(found) or {}
        if not record.get("splits"):
            raise ArchiveError(
                f"{found.path}: its handler ({record.get('class') or found.model['handler']}) cannot run apart from "
                "its model: its preprocess does not turn a request into one tensor (MAR-INF/tsctl.json 'splits')"
            )
        model_dir = found.model_dir(tempfile.mkdtemp(prefix="tsctl-transformer-"))
        manifest, config = found.manifest, found.config
    if str(model_dir) not in sys.path:  # a handler file of the user's own, as a worker imports it
        sys.path.insert(0, str(model_dir))
    handler_class = getattr(importlib.import_module(record["module"]), record["class"])
    model_name = manifest["model"]["modelName"]
    context = Context(model_name, str(model_dir), manifest, 1, None, ts.__version__, model_yaml_config=config)
    handler = handler_class()
    handler.with_model = with_model
    handler.initialize(context)
    return handler


def batch(handler, job: Job) -> np.ndarray:
    """One request's items decoded and preprocessed as the handler would in a worker (same limits, same
    errors, raised as the ``protocol.ClientError`` with the status a worker would answer)."""
    handler.decode_jobs([job])
    if job.error is not None:
        raise job.error
    try:
        with torch.inference_mode():
            return handler.preprocess(job.inputs).cpu().numpy()
    except Exception as exc:  # noqa: BLE001 - a ClientError keeps its status; anything else is a 500
        raise protocol.error_for(exc, protocol.INFERENCE, "preprocess failed") from None


def answers(handler, outputs: np.ndarray) -> List:
    """The model's raw outputs (one row per input) postprocessed into the handler's answers."""
    try:
        with torch.inference_mode():
            return handler.call_postprocess(torch.from_numpy(np.ascontiguousarray(outputs)), None)
    except Exception as exc:  # noqa: BLE001 - a ClientError keeps its status; anything else is a 500
        raise protocol.error_for(exc, protocol.INFERENCE, "postprocess failed") from None
