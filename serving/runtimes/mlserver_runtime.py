"""An MLServer custom runtime that serves one TorchServe archive, as the other engines do.

    model-settings.json: {"name": "resnet18", "implementation": "serving.runtimes.mlserver_runtime.ArchiveModel",
                          "parameters": {"uri": "./resnet18.mar", "version": "1.0",
                                         "extra": {"batchSize": 4, "maxBatchDelay": 50, ...}}}

MLServer (1.7, Seldon Core 2's server and one of KServe's runtimes) loads ``ArchiveModel`` for each
model folder; ``load`` starts the archive's workers exactly as the tsctl engine does
(``model_opening.open_model``: TorchServe's own worker processes, its context and hooks, batches of
up to ``batchSize`` gathered within ``maxBatchDelay`` ms, a dead worker restarted). So any archive
TorchServe serves (the toolkit's, ``BaseHandler`` subclasses, pytorch/serve's examples) serves here.

**One request, one answer.** MLServer hands ``predict`` one Open Inference Protocol request, already
parsed. It goes to a toolkit handler as a KServe v2 body (``request_body``: JSON, or the binary tensor
extension when an input carries bytes, as gRPC's ``bytes_contents`` do) with the request's headers,
and the handler's v2 answer comes back as MLServer's ``InferenceResponse``. MLServer's own adaptive
batching is left off (``max_batch_size`` 1): it merges requests into one and fails them all when one
fails. Batching happens in ``ModelWorkers`` instead, where each request keeps its own answer: a bad
request gets its own 4xx (``MLServerError`` with the handler's status and message), its neighbours
their 200s.

**Archives that are not the toolkit's** get what TorchServe's worker gives them: each element of the
request's BYTES tensor is one TorchServe request, its body of the type the tensor's
``parameters.content_type`` says, decoded by the worker as TorchServe decodes it (bytes, a str, the
decoded JSON); their answers come back as one BYTES output ``output-0`` holding each answer's JSON, the
shape the toolkit's handlers answer in (serving/runtimes/v2_requests.py has the tables). They batch as their
settings say. Toolkit archives read the v2 body as it came (``decode_input_request`` off).

**A Seldon pipeline's transformer** (``parameters.extra.role``, ``tsctl export seldon
--transformer-archive``): an image archive's handler run apart from its model (``serving/runtimes/split.py``, as
the KServe transformer runs it), in this process, without its weights. ``preprocess`` answers a request's
images as one FP32 tensor ``input-0`` (the batch the model step reads); ``postprocess`` reads the model
step's raw output (its first tensor, one row per image) and answers the handler's answers as BYTES
``output-0``, as the whole archive would.

``parameters.extra`` (written by ``tsctl serve --engine mlserver`` and ``tsctl export seldon`` from
config.properties or model-config.yaml): ``minWorkers``, ``batchSize``, ``maxBatchDelay``,
``responseTimeout``, ``jobQueueSize``, ``publicKey``, ``metricsConfig``, ``metricsAutoDetect``, ``role``. (A
request body's limit is MLServer's REST app's, ``max_request_size`` in body_limit.py: mlserver_start.py reads it.)

**Metrics.** What the workers emit (``context.metrics``, ``HandlerTime``, ``PredictionTime``) is on
MLServer's ``/metrics`` under the names, types and labels TorchServe exports them with, as on the tsctl
engine (``metrics.WorkerMetrics``: ``metricsConfig`` is the metrics.yaml that declares them,
``metricsAutoDetect`` false drops those it does not declare).
"""

import asyncio
import json
import logging
import os
import re
import shutil
import socket
from http import HTTPStatus
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
from mlserver import MLModel
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, InferenceResponse, MetadataTensor
from mlserver.utils import get_model_uri

from handlers import cpu_limit, identity, protocol
from handlers.archives import Archive
from handlers.errors import error_message

from .. import gpus
from ..engine.sequences import refuse_stateful
from ..engine.workers import ModelWorkers
from ..frontend_settings import Frontend
from ..model_opening import open_model
from ..ts_config import ModelSpec
from ..worker import sockets
from ..worker.ts_wire import RequestInput, Response
from . import v2_requests

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
                raise ValueError(
                    f"model-settings.json of {self.name}: parameters.extra.role is {self._role!r}, "
                    f"not one of {', '.join(ROLES)}"
                )
            from . import split  # torch, in this process: only a transformer step needs it here

            self._split = split
            self._transforms = asyncio.Semaphore(cpu_limit.usable())
            self._handler = await asyncio.get_running_loop().run_in_executor(None, split.load_handler, archive)
            return True
        spec, frontend = model_spec(self.name, self.version or "1.0", archive, extra)
        self._workers: Optional[ModelWorkers] = None  # none when the load fails: unload has nothing to stop
        self._run_dir = sockets.run_dir(sockets.MLSERVER)
        try:
            with Archive(archive) as opened:  # read once: its record here, its files in open_model
                refuse_stateful(opened.config, f"{archive.name}'s model-config.yaml", "MLServer")
                self._toolkit = toolkit = identity.read(opened) is not None
                model_dir = os.path.join(self._run_dir, "model")
                self._workers = open_model(
                    spec,
                    frontend,
                    model_dir,
                    sockets.FIRST_PORT,
                    lambda _: not toolkit,
                    on_metric=metrics_of(frontend),
                    archive=opened,
                    placement=gpus.process_placement(frontend.number_of_gpu),
                )
            self.declare(self._workers.v2_metadata)
            await self._workers.start()
        except BaseException:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            raise
        logger.info(
            "%s: %s ready (%d workers, batchSize %d)", self.name, archive.name, spec.min_workers, spec.batch_size
        )
        return True

    def declare(self, metadata: Optional[dict]):
        """The v2 metadata the archive declares (serving/v2_metadata.py) as MLServer's answer to ``GET
        /v2/models/NAME`` and ``ModelMetadata``, where the model-settings.json declares none (its own win)."""
        if metadata is None or self.settings.inputs or self.settings.outputs:
            return
        self.inputs = [MetadataTensor(**tensor) for tensor in metadata["inputs"]]
        self.outputs = [MetadataTensor(**tensor) for tensor in metadata["outputs"]]

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        check_id(payload.id)
        if self._role is not None:
            async with self._transforms:  # each holds a whole batch as JSON (16 images: 45 MB): a few at a time
                return await asyncio.get_running_loop().run_in_executor(None, self.transform, payload)
        if not self._toolkit:
            return await self.predict_requests(payload)
        body, headers = request_body(payload)
        answer = await self._workers.submit(RequestInput(body, headers))
        return response_of(answer, self.name, self.version)

    async def predict_requests(self, payload: InferenceRequest) -> InferenceResponse:
        """A handler that is not the toolkit's: each element one TorchServe request (v2_requests.py), all
        sent at once to be batched as the archive says; their answers one output, or the first failure."""
        inputs = payload.model_dump(exclude_none=True)["inputs"]
        try:
            requests = v2_requests.requests_of(inputs, client_headers(payload))
            limit = self._workers.queue.limit
            if len(requests) > limit:
                raise protocol.ClientError(
                    f"{len(requests)} elements in one request: more than the model's job "
                    f"queue holds ({limit}, jobQueueSize)",
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                )
        except protocol.ClientError as error:
            raise MLServerError(error.message, status_code=error.status) from None
        answers = await asyncio.gather(*(self._workers.submit(request) for request in requests))
        failed = v2_requests.failure(answers)
        if failed is not None:
            raise MLServerError(failed.message, status_code=failed.status)
        body = {"id": payload.id, "outputs": [v2_requests.output_of(answers)]}
        headers = {k: v for answer in answers for k, v in answer.headers.items()}
        return inference_response(body, headers, self.name, self.version)

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
                output = {
                    "name": "input-0",
                    "shape": list(array.shape),
                    "datatype": "FP32",
                    "data": array.reshape(-1).tolist(),
                }
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
                output = {
                    "name": "output-0",
                    "shape": [len(answers)],
                    "datatype": "BYTES",
                    "data": [json.dumps(answer).encode("utf-8") for answer in answers],
                }
        except protocol.ClientError as error:
            raise MLServerError(error.message, status_code=error.status) from None
        except (ValueError, TypeError, OverflowError, IndexError) as exc:
            message = f"{self.name}: {type(exc).__name__}: {exc}"
            raise MLServerError(message, status_code=HTTPStatus.BAD_REQUEST.value) from None
        return InferenceResponse(model_name=self.name, model_version=self.version, id=payload.id, outputs=[output])

    async def unload(self) -> bool:
        if self._role is not None or self._workers is None:
            return True
        self._workers.stop()
        shutil.rmtree(self._run_dir, ignore_errors=True)
        return True


def check_id(request_id):
    """A request ``id`` is echoed in MLServer's response headers: printable ASCII only, at most 256."""
    if request_id and not ID.match(request_id):  # tritonclient's gRPC sends ""
        message = "the request's id must be 1 to 256 printable ASCII characters, no spaces"
        raise MLServerError(message, status_code=HTTPStatus.BAD_REQUEST.value)


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
            raise ValueError(
                f"model-settings.json of {name}: parameters.extra.{key} is {value!r}, not a whole number >= {least}"
            )
        setattr(spec, attribute, value)
    spec.max_workers = spec.min_workers
    frontend = Frontend()
    frontend.job_queue_size = int(extra.get("jobQueueSize", frontend.job_queue_size))
    frontend.public_key = extra.get("publicKey") or None
    frontend.metrics_config = extra.get("metricsConfig") or None
    frontend.metrics_auto_detect = extra.get("metricsAutoDetect", True) is not False
    return spec, frontend


def metrics_of(frontend: Frontend):
    """Where a model's workers' metric lines go: the process's one ``WorkerMetrics``
    (``metrics.registered_metrics``), which MLServer's /metrics serves (its ``parallel_workers`` 0:
    archiver/mlserver.py), its names clear of MLServer's own; the model's metrics.yaml declared there (a
    name another model's declared first keeps that declaration)."""
    from ..engine.metrics import registered_metrics

    metrics = registered_metrics(socket.gethostname())
    if frontend.metrics_config:
        metrics.declare(frontend.metrics_config)
    detect = frontend.metrics_auto_detect
    return lambda worker, line: metrics.worker_metric(worker, line, detect)


def request_body(payload: InferenceRequest) -> Tuple[bytes, Dict[str, str]]:
    """MLServer's parsed request as the KServe v2 body a handler reads, and the client's headers.
    Binary outputs are not asked for (MLServer answers JSON); inputs that carry bytes go in the
    binary tensor extension, the rest as JSON."""
    body = payload.model_dump(exclude_none=True, exclude={"parameters": {"headers"}})
    for key in ("binary_data_output",):
        body.get("parameters", {}).pop(key, None)
    for tensor in body.get("outputs", []):
        tensor.get("parameters", {}).pop("binary_data", None)
    headers = client_headers(payload)
    for tensor in body["inputs"]:
        if tensor.get("datatype") == "BYTES":
            tensor["data"] = protocol.flatten(tensor["data"])
    if any(has_bytes(tensor["data"]) for tensor in body["inputs"]):
        data, length = protocol.encode_binary(body, "inputs")
        return data, {**headers, "Content-Type": protocol.OCTET_STREAM, protocol.HEADER: str(length)}
    return protocol.to_json(body), {**headers, "Content-Type": protocol.JSON_TYPE}


def client_headers(payload: InferenceRequest) -> Dict[str, str]:
    """The client's headers (MLServer keeps them in the request's parameters), but those describing
    MLServer's own HTTP body."""
    parameters = payload.parameters
    headers = dict((parameters.headers or {}) if parameters else {})
    return {k: str(v) for k, v in headers.items() if k.lower() not in HOP_HEADERS}


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
        return inference_response(body, answer.headers, name, version)
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise MLServerError(
            f"model {name}'s handler answered what is not an Open Inference Protocol response ({exc}): "
            f"{bytes(answer.body or b'')[:200]!r}",
            status_code=HTTPStatus.INTERNAL_SERVER_ERROR.value,
        ) from None


def inference_response(body: dict, headers: Dict[str, str], name: str, version) -> InferenceResponse:
    """A v2 response body (a dict) and the handler's response headers as MLServer's response."""
    body["model_name"], body["model_version"] = name, version
    for output in body["outputs"]:  # MLServer holds BYTES as bytes (its REST side writes them as text)
        if output.get("datatype") == "BYTES" and isinstance(output.get("data"), list):
            output["data"] = [v.encode("utf-8") if isinstance(v, str) else v for v in protocol.flatten(output["data"])]
    kept = {k: v for k, v in headers.items() if k.lower() not in ("content-length", "content-type")}
    if kept:
        body.setdefault("parameters", {})["headers"] = kept
    return InferenceResponse.model_validate(body)
