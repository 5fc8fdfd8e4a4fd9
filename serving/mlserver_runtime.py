"""An MLServer custom runtime that serves one TorchServe archive, as the other engines do.

    model-settings.json: {"name": "resnet18", "implementation": "serving.mlserver_runtime.ArchiveModel",
                          "parameters": {"uri": "./resnet18.mar", "version": "1.0",
                                         "extra": {"batchSize": 4, "maxBatchDelay": 50, ...}}}

MLServer (1.7, Seldon Core 2's server and one of KServe's runtimes) loads ``ArchiveModel`` for each
model folder; ``load`` starts the archive's workers exactly as the tsctl engine does
(``engine_workers.open_model``: TorchServe's own worker processes, its context and hooks, batches of
up to ``batchSize`` gathered within ``maxBatchDelay`` ms, a dead worker restarted). So any archive
TorchServe serves (the toolkit's, ``BaseHandler`` subclasses, pytorch/serve's examples) serves here.

**One request, one answer.** MLServer hands ``predict`` one Open Inference Protocol request, already
parsed. It goes to the handler as a KServe v2 body (``request_body``: JSON, or the binary tensor
extension when an input carries bytes, as gRPC's ``bytes_contents`` do) with the request's headers,
and the handler's v2 answer comes back as MLServer's ``InferenceResponse``. MLServer's own adaptive
batching is left off (``max_batch_size`` 1): it merges requests into one and fails them all when one
fails. Batching happens in ``ModelWorkers`` instead, where each request keeps its own answer: a bad
request gets its own 4xx (``MLServerError`` with the handler's status and message), its neighbours
their 200s.

**Archives that are not the toolkit's** read KServe v2 bodies through TorchServe's ``kservev2``
envelope, as on KServe's TorchServe runtime with ``protocolVersion: v2``; that envelope fails a batch
of several, so they run with ``batchSize`` 1. Toolkit archives read the bytes as they came
(``decode_input_request`` off) and batch as their settings say.

**A Seldon pipeline's transformer** (``parameters.extra.role``, ``tsctl export seldon
--transformer-archive``): an image archive's handler run apart from its model (``serving/split.py``, as
the KServe transformer runs it), in this process, without its weights. ``preprocess`` answers a request's
images as one FP32 tensor ``input-0`` (the batch the model step reads); ``postprocess`` reads the model
step's raw output (its first tensor, one row per image) and answers the handler's answers as BYTES
``output-0``, as the whole archive would.

``parameters.extra`` (written by ``tsctl serve --engine mlserver`` and ``tsctl export seldon`` from
config.properties or model-config.yaml): ``minWorkers``, ``batchSize``, ``maxBatchDelay``,
``responseTimeout``, ``jobQueueSize``, ``publicKey``, ``metricsConfig``, ``role``. (A request body's
limit is MLServer's REST app's, ``max_request_size`` in body_limit.py: mlserver_start.py reads it.)
"""

import asyncio
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Dict, Tuple

import numpy as np
from mlserver import MLModel
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri

from handlers import identity, protocol
from handlers.archives import Archive
from handlers.errors import error_message

from . import sockets
from .engine_workers import ModelWorkers, open_model
from .ts_config import Frontend, ModelSpec
from .ts_wire import Request, Response

logger = logging.getLogger("tsctl.mlserver")

# Request headers that describe MLServer's HTTP body, not the one the handler gets.
HOP_HEADERS = frozenset(
    ("content-length", "content-type", "transfer-encoding", "connection", "expect", "host", protocol.HEADER.lower())
)
ID = re.compile(r"^[\x21-\x7e]{1,256}$")  # a request id MLServer can put in its response headers (ce-id)
EXTRA = {  # parameters.extra key -> (ModelSpec field, smallest value)
    "minWorkers": ("min_workers", 1),
    "batchSize": ("batch_size", 1),
    "maxBatchDelay": ("max_batch_delay", 0),
    "responseTimeout": ("response_timeout", 1),
}


ROLES = ("preprocess", "postprocess")  # parameters.extra.role: a pipeline's transformer steps


class ArchiveModel(MLModel):
    """One archive's workers behind MLServer's model interface (or, with a role, its handler's split)."""

    async def load(self) -> bool:
        log_to_stderr()
        archive = Path(await get_model_uri(self.settings))
        extra: Dict[str, Any] = dict(self.settings.parameters.extra or {})
        self._role = extra.get("role")
        if self._role is not None:
            if self._role not in ROLES:
                raise ValueError(f"model-settings.json of {self.name}: parameters.extra.role is {self._role!r}, "
                                 f"not one of {', '.join(ROLES)}")  # fmt: skip
            from . import split  # torch, in this process: only a transformer step needs it here

            self._split = split
            self._transforms = asyncio.Semaphore(max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                                      else (os.cpu_count() or 1)))  # fmt: skip
            self._handler = await asyncio.get_running_loop().run_in_executor(None, split.load_handler, archive)
            return True
        spec, frontend = model_spec(self.name, self.version or "1.0", archive, extra)
        self._run_dir = sockets.run_dir(sockets.MLSERVER)
        try:
            with Archive(archive) as opened:  # read once: its record here, its files in open_model
                toolkit = identity.read(opened) is not None
                if not toolkit:
                    frontend.envelope = "kservev2"
                    spec.batch_size = 1
                model_dir = os.path.join(self._run_dir, "model")
                self._workers: ModelWorkers = open_model(
                    spec, frontend, model_dir, sockets.FIRST_PORT, lambda _: not toolkit, archive=opened
                )
            await self._workers.start()
        except BaseException:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            raise
        logger.info("%s: %s ready (%d workers, batchSize %d)", self.name, archive.name, spec.min_workers,
                    spec.batch_size)  # fmt: skip
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        check_id(payload.id)
        if self._role is not None:
            async with self._transforms:  # each holds a whole batch as JSON (16 images: 45 MB): a few at a time
                return await asyncio.get_running_loop().run_in_executor(None, self.transform, payload)
        body, headers = request_body(payload)
        answer = await self._workers.submit(Request(body, headers))
        return response_of(answer, self.name, self.version)

    def transform(self, payload: InferenceRequest) -> InferenceResponse:
        """A transformer step: the request's images as the model's input tensor, or the model's raw
        output as the handler's answers; a request it refuses gets the status a worker would give, and
        one that is not what the step reads 400. What a request may hold is the handler's own limits:
        ``max_items`` images (or output rows), ``max_json_values`` numbers."""
        from handlers.base import Job  # torch: only a transformer step imports it in this process

        split, handler = self._split, self._handler
        limits = handler.limits
        try:
            if len(payload.inputs) != 1:
                raise protocol.ClientError(f"{self.name} reads one input tensor, got {len(payload.inputs)}")
            tensor = payload.inputs[0]
            count = protocol.element_count(protocol.as_shape(list(tensor.shape)))
            if self._role == "preprocess":
                items = protocol.flatten(list(tensor.data))
                if len(items) != count:
                    raise protocol.ClientError(
                        f"input shape {list(tensor.shape)} holds {count} elements, got {len(items)}"
                    )
                protocol.check_count(items, limits)
                array = split.batch(handler, Job(protocol.Request(items, protocol.V2)))
                output = {"name": "input-0", "shape": list(array.shape), "datatype": "FP32",
                          "data": array.reshape(-1).tolist()}  # fmt: skip
            else:
                datatype = str(getattr(tensor.datatype, "value", tensor.datatype))
                if datatype not in protocol.NUMERIC:
                    raise protocol.ClientError(f"postprocess reads the model's numeric output, not {datatype}")
                shape = list(tensor.shape)
                if len(shape) != 2:  # the image classifier's logits: the one handler kind that splits
                    raise protocol.ClientError(
                        f"postprocess reads one output row per image (shape [N, K]), got {shape}"
                    )
                protocol.within(shape[0], "rows", "max_items", limits.max_items)
                protocol.within(count, "values", "max_json_values", limits.max_json_values)
                values = protocol.flatten(list(tensor.data))
                if len(values) != count:
                    raise protocol.ClientError(f"output shape {shape} holds {count} values, got {len(values)}")
                outputs = np.asarray(values, dtype=protocol.NUMERIC[datatype]).reshape(shape)
                answers = split.answers(handler, outputs)
                output = {"name": "output-0", "shape": [len(answers)], "datatype": "BYTES",
                          "data": [json.dumps(answer).encode("utf-8") for answer in answers]}  # fmt: skip
        except protocol.ClientError as error:
            raise MLServerError(error.message, status_code=error.status) from None
        except (ValueError, TypeError, OverflowError, IndexError) as exc:
            raise MLServerError(f"{self.name}: {type(exc).__name__}: {exc}", status_code=400) from None
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id, outputs=[output])

    async def unload(self) -> bool:
        if self._role is not None:
            return True
        self._workers.stop()
        shutil.rmtree(self._run_dir, ignore_errors=True)
        return True


def check_id(request_id):
    """A request ``id`` is echoed in MLServer's response headers: printable ASCII only, at most 256."""
    if request_id and not ID.match(request_id):  # tritonclient's gRPC sends ""
        raise MLServerError("the request's id must be 1 to 256 printable ASCII characters, no spaces", status_code=400)


def log_to_stderr():
    """The workers' lines (the handler's own log among them) and the runtime's in MLServer's output."""
    named = logging.getLogger("tsctl")
    if not named.handlers:
        output = logging.StreamHandler()
        output.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        named.setLevel(logging.INFO)
        named.addHandler(output)
        named.propagate = False


def model_spec(name: str, version: str, archive: Path, extra: Dict[str, Any]) -> Tuple[ModelSpec, Frontend]:
    """The worker settings ``parameters.extra`` names (each a whole number within bounds, else a
    ValueError naming the key, which MLServer reports as the model's load failure)."""
    spec = ModelSpec(name=name, version=str(version), archive=archive)
    for key, (attribute, least) in EXTRA.items():
        value = extra.get(key, getattr(spec, attribute))
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"model-settings.json of {name}: parameters.extra.{key} is {value!r}, not a whole "
                             f"number >= {least}")  # fmt: skip
        setattr(spec, attribute, value)
    spec.max_workers = spec.min_workers
    frontend = Frontend()
    frontend.job_queue_size = int(extra.get("jobQueueSize", frontend.job_queue_size))
    frontend.public_key = extra.get("publicKey") or None
    frontend.metrics_config = extra.get("metricsConfig") or None
    return spec, frontend


def request_body(payload: InferenceRequest) -> Tuple[bytes, Dict[str, str]]:
    """MLServer's parsed request as the KServe v2 body a handler reads, and the client's headers.
    Binary outputs are not asked for (MLServer answers JSON); inputs that carry bytes go in the
    binary tensor extension, the rest as JSON."""
    parameters = payload.parameters
    client_headers = dict((parameters.headers or {}) if parameters else {})
    body = payload.model_dump(exclude_none=True, exclude={"parameters": {"headers"}})
    for key in ("binary_data_output",):
        body.get("parameters", {}).pop(key, None)
    for tensor in body.get("outputs", []):
        tensor.get("parameters", {}).pop("binary_data", None)
    headers = {k: str(v) for k, v in client_headers.items() if k.lower() not in HOP_HEADERS}
    for tensor in body["inputs"]:
        if tensor.get("datatype") == "BYTES":
            tensor["data"] = protocol.flatten(tensor["data"])
    if any(has_bytes(tensor["data"]) for tensor in body["inputs"]):
        data, length = protocol.encode_binary(body, "inputs")
        return data, {**headers, "Content-Type": protocol.OCTET_STREAM, protocol.HEADER: str(length)}
    return protocol.to_json(body), {**headers, "Content-Type": protocol.JSON_TYPE}


def has_bytes(data: Any) -> bool:
    if isinstance(data, (bytes, bytearray)):
        return True
    return isinstance(data, list) and any(has_bytes(value) for value in data)


def response_of(answer: Response, name: str, version) -> InferenceResponse:
    """The handler's answer as MLServer's response, or an ``MLServerError`` with its status and
    message (MLServer answers ``{"error": message}`` with that status; gRPC maps it)."""
    if answer.status >= 400:
        raise MLServerError(error_message(answer.body), status_code=answer.status)
    try:
        body = json.loads(answer.body)
        if not isinstance(body, dict) or "outputs" not in body:
            raise ValueError("no 'outputs'")
        body["model_name"], body["model_version"] = name, version
        for output in body["outputs"]:  # MLServer holds BYTES as bytes (its REST side writes them as text)
            if output.get("datatype") == "BYTES" and isinstance(output.get("data"), list):
                output["data"] = [
                    v.encode("utf-8") if isinstance(v, str) else v for v in protocol.flatten(output["data"])
                ]
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in ("content-length", "content-type")}
        if headers:
            body.setdefault("parameters", {})["headers"] = headers
        return InferenceResponse.model_validate(body)
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise MLServerError(
            f"model {name}'s handler answered what is not an Open Inference Protocol response ({exc}): "
            f"{bytes(answer.body or b'')[:200]!r}",
            status_code=500,
        ) from None
