"""Seldon Core 1 components: an archive's handler as the ``TRANSFORMER``, ``ROUTER`` and ``MODEL`` units of a
SeldonDeployment graph, run by Seldon's Python wrapper (``seldon-core-microservice`` of ``seldon-core`` 1.17.1,
the last Apache-2.0 release):

    seldon-core-microservice serving.runtimes.seldon_components.Transformer --service-type TRANSFORMER
    seldon-core-microservice serving.runtimes.seldon_components.Router --service-type ROUTER
    seldon-core-microservice serving.runtimes.seldon_components.Model --service-type MODEL

each with its typed ``parameters`` (``PREDICTIVE_UNIT_PARAMETERS``, which the wrapper parses as INT, FLOAT,
DOUBLE, STRING or BOOL and passes to the class as keyword arguments: seldon_core/microservice.py's
``parse_parameters``). ``tsctl export seldon --core 1`` writes the graph (archiver/export/seldon/core1.py).

- **Transformer** (``archive``: a toolkit archive whose handler splits, ``serving/runtimes/split.py``, as the KServe
  transformer and the Seldon Core 2 pipeline run it; no weights loaded). ``/transform-input`` reads a
  message's images and answers the batch tensor the model takes (``data.tensor``); ``/transform-output`` reads
  the model's raw output (``data.tensor`` or ``data.ndarray``, one row per image) and answers the handler's
  answers, one per image (``data.ndarray``).
- **Model** (``archive``: a ``--handler tensor`` archive; ``batch_size``, ``max_batch_delay``, ``min_workers``,
  ``response_timeout``: its worker settings): the archive's workers exactly as the tsctl engine starts them
  (``model_opening.open_model``: TorchServe's own worker processes, batches gathered across requests).
  ``/predict`` reads ``data.tensor`` or ``data.ndarray`` (numbers) and answers the model's output rows in the
  same form.
- **Router** (``weights``: "60,30,10", one whole number per child, in the children's order): ``/route``
  answers a child drawn by weight (Seldon's router contract, doc/source/analytics/routers.md: a child's index
  N >= 0). Two children with a ratio need no container: the executor's own ``RANDOM_ABTEST``.

**The Seldon protocol.** A message is a JSON object holding one of ``data`` (``ndarray`` or ``tensor``:
``{"shape": [...], "values": [...]}``, with optional ``names``), ``binData`` (bytes: base64 in JSON),
``strData`` or ``jsonData``, and optional ``meta``. Images come as ``binData`` (one image), ``strData`` (one
image, base64), ``jsonData`` (one image or a list: base64 strings or ``{"b64": ...}``) or ``data.ndarray`` (a
list of base64 strings). Every answer carries the request's ``meta`` (``{}`` when it had none: the executor's
routing injection fills ``meta.routing`` in an object that is there) and its ``data.names``. A message a unit
refuses is answered Seldon's error shape alone, ``{"status": {"status": 1, "info": MESSAGE, "code": -1,
"reason": "MICROSERVICE_BAD_DATA"}}``, with the handler's own 4xx (400, 413 past a ``handler:`` limit):
``SeldonMicroserviceException`` (seldon_core/flask_utils.py), which the wrapper's Flask error handler answers
with that status; a failure is its 500 (``MICROSERVICE_INTERNAL_ERROR``). In a Model's batch a bad message
fails alone: each request is its own job on the workers.

**Loading.** The wrapper calls ``load()`` in its gunicorn worker, whose timeout (the pod's annotation
``seldon.io/rest-timeout``: the export sets 60 s; seldon_core/microservice.py) also bounds a load: so ``load``
starts the archive in a thread and returns; ``/health/status`` answers 503 until it is ready (the export's
readiness probe), and a request that comes before waits for it.
"""

import asyncio
import io
import json
import logging
import os
import random
import threading
from functools import cached_property
from http import HTTPStatus
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from handlers import protocol
from handlers.errors import error_message
from handlers.limits import Limits
from handlers.protocol import ClientError

from .seldon_bounds import Bounds

logger = logging.getLogger("tsctl.seldon")

PAYLOADS = ("data", "binData", "strData", "jsonData")  # a SeldonMessage's oneof (prediction.proto)
BAD_DATA = "MICROSERVICE_BAD_DATA"  # the reason of Seldon's error shape for a message refused
LOAD_WAIT = 600  # seconds a request waits for its unit to load
RUN_PREFIX = "tsctl-seldon-"  # a Model's run directory (its workers' sockets, the unpacked archive)


class Unavailable(Exception):
    """A unit that is still loading, or failed to: 503."""


# ---- the Seldon protocol ----------------------------------------------------------------------------
def message_of(request: Any, bounds: Bounds) -> dict:
    """The request as a Seldon message: a JSON object with exactly one payload and an object ``meta`` within the
    unit's ``bounds`` (serving/runtimes/seldon_bounds.py: its depth, values and size; no NaN)."""
    if not isinstance(request, dict):
        raise ClientError(f"a Seldon message is a JSON object, got {type(request).__name__}")
    found = [key for key in PAYLOADS if key in request]
    if len(found) != 1:
        listed = ", ".join(PAYLOADS)
        raise ClientError(f"a Seldon message holds one of {listed}, got {', '.join(found) or 'none'}")
    if not isinstance(request.get("meta", {}), dict):
        raise ClientError("a Seldon message's meta must be an object")
    bounds.check_meta(request.get("meta", {}))
    return request


def data_of(message: dict) -> Tuple[str, Any, list]:
    """A message's ``data``: its layout (``ndarray`` or ``tensor``), that value and its ``names``."""
    data = message.get("data")
    if not isinstance(data, dict):
        raise ClientError("a Seldon message's data must be an object holding ndarray or tensor")
    layouts = [layout for layout in ("ndarray", "tensor", "tftensor") if layout in data]
    if len(layouts) != 1 or layouts[0] == "tftensor":
        raise ClientError(f"data must hold one of ndarray or tensor, got {', '.join(layouts) or 'neither'}")
    names = data.get("names", [])
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ClientError("data.names must be a list of strings")
    return layouts[0], data[layouts[0]], names


def images_of(message: dict, limits) -> List[Any]:
    """A message's images, each as the handler's decode takes it (a base64 string, ``{"b64": ...}``)."""
    key = next(key for key in PAYLOADS if key in message)
    value = message[key]
    if key in ("binData", "strData"):
        # a multipart file binData: its base64 as bytes (the wrapper's get_multi_form_data_request)
        items = [value.decode("ascii") if isinstance(value, bytes) else value]
    elif key == "jsonData":
        items = value if isinstance(value, list) else [value]
    else:
        layout, value, _ = data_of(message)
        if layout != "ndarray":
            raise ClientError(
                "data.tensor holds numbers: send images as binData, strData, jsonData or data.ndarray of base64 strings"
            )
        items = protocol.flatten(value) if isinstance(value, list) else [value]
    if not items:
        raise ClientError("the message holds no image")
    protocol.check_count(items, limits)
    return items


def tensor_of(message: dict, limits):
    """A message's numbers (``data.tensor`` or ``data.ndarray``) as a float32 array of their shape, within
    ``max_json_values``."""
    import numpy as np

    if "data" not in message:
        key = next(key for key in PAYLOADS if key in message)
        raise ClientError(f"{key} is not a tensor: send data.tensor or data.ndarray of numbers")
    layout, value, _ = data_of(message)
    if layout == "tensor":
        if not isinstance(value, dict) or not isinstance(value.get("values"), list):
            raise ClientError("data.tensor must be an object with shape and values")
        count = protocol.element_count(value.get("shape"))
        protocol.within(count, "values", "max_json_values", limits.max_json_values)
        if len(value["values"]) != count:
            raise ClientError(f"data.tensor's shape {value['shape']} holds {count} values, got {len(value['values'])}")
        values, shape = value["values"], value["shape"]
    else:
        if not isinstance(value, list):
            raise ClientError("data.ndarray must be a list")
        values, shape = value, None
    protocol.within(len(protocol.flatten(values)), "values", "max_json_values", limits.max_json_values)
    try:
        array = np.asarray(values)
        if array.dtype.kind not in "biuf":
            raise ValueError("not numbers")
        with np.errstate(over="ignore"):
            array = array.astype(np.float32)
    except (ValueError, TypeError, OverflowError):
        raise ClientError(f"data.{layout} is not a rectangular list of numbers") from None
    if not np.isfinite(array).all():  # the wrapper's Flask reads NaN, Infinity and 1e400; JSON cannot answer them
        raise ClientError(f"data.{layout} holds NaN or Infinity (or a number beyond float32): send finite numbers")
    return array.reshape(shape) if shape is not None else array


def answer(message: dict, layout: str, value: Any, names: Optional[list] = None) -> dict:
    """A Seldon message answering ``message``: ``value`` as ``data.LAYOUT`` (an array as a tensor's shape and
    values, or as nested lists), the request's names and meta."""
    if layout == "tensor":
        value = {"shape": list(value.shape), "values": value.reshape(-1).tolist()}
    elif hasattr(value, "tolist"):
        value = value.tolist()
    if names is None:
        names = message["data"].get("names", []) if isinstance(message.get("data"), dict) else []
    return {"data": {"names": names, layout: value}, "meta": message.get("meta", {})}


def refused(error: BaseException):
    """Seldon's exception for a refused message (its error shape, the status the handler gives it)."""
    from seldon_core.flask_utils import SeldonMicroserviceException

    if isinstance(error, Unavailable):
        status = HTTPStatus.SERVICE_UNAVAILABLE.value
        return SeldonMicroserviceException(str(error), status_code=status, reason="MICROSERVICE_UNAVAILABLE")
    error = protocol.error_for(error, protocol.READ)
    reason = BAD_DATA if error.status < 500 else "MICROSERVICE_INTERNAL_ERROR"
    return SeldonMicroserviceException(error.message, status_code=error.status, reason=reason)


def guard(unit) -> Any:
    """The wrapper's hook into its Flask app (``model_error_handler``: a blueprint it registers, wrapper.py)
    for what it does before a unit sees a message: it reads any body whole (gunicorn marks even a chunked one
    terminated: a 500 MB binData took a Transformer's worker past its memory), and a body it cannot parse (JSON
    nested past Python's recursion limit, a form's ``json=`` field or multipart ``meta`` that is not JSON) was
    its 500. A body above the unit's ``max_body_bytes`` is a 413 before it is read, a JSON body of more than its
    ``max_json_values`` one before it is parsed (serving/runtimes/seldon_bounds.py: each at most what the unit's memory
    affords); one unparsable a 400."""
    from flask import Blueprint, jsonify, request

    blueprint = Blueprint("tsctl_guard", __name__)

    @blueprint.before_app_request
    def bounded_body():
        if request.method != "POST":
            return
        bounds = unit.bounds()
        limit = bounds.limits.max_body_bytes
        length = request.content_length
        if length is None:  # chunked: read at most the limit and a byte, kept for Flask to read again
            body = request.environ["wsgi.input"].read(limit + 1)
            request.environ["wsgi.input"] = io.BytesIO(body)
            length = len(body)
        if length > limit:
            if request.content_length is not None:  # read past, a megabyte at a time: the client sees the 413
                while request.environ["wsgi.input"].read(1 << 20):
                    pass
        try:
            bounds.within("the request body is", length, "bytes", "max_body_bytes")
            if request.is_json:  # read here, kept for Flask's get_json: its values counted before it parses them
                bounds.check_text(request.get_data(cache=True))
        except ClientError as error:
            raise refused(error) from None

    @blueprint.app_errorhandler(RecursionError)
    @blueprint.app_errorhandler(json.JSONDecodeError)
    def unreadable(error):
        refusal = refused(ClientError(f"the message is not JSON Python can read: {error}"))
        return jsonify(refusal.to_dict()), refusal.status_code

    return blueprint


# ---- the units --------------------------------------------------------------------------------------
class Unit:
    """What every unit shares: its archive, loaded in a thread (``start``), waited for by requests."""

    def __init__(self, archive: str):
        if not Path(archive).is_file():
            raise ValueError(f"parameter archive: {archive} is not a file (the archive this unit serves)")
        self.archive = archive
        self._loaded = threading.Event()
        self._failure: Optional[BaseException] = None

    def load(self):
        threading.Thread(target=self._load, name="tsctl-load", daemon=True).start()

    def _load(self):
        try:
            self.start()
            self._bounds = Bounds.of(self.limits)
            logger.info("%s: %s ready", type(self).__name__, Path(self.archive).name)
        except BaseException as exc:  # noqa: BLE001 - kept, and answered as 503 with its cause
            logger.exception("%s: %s failed to load", type(self).__name__, self.archive)
            self._failure = exc
        finally:
            self._loaded.set()

    def start(self):
        raise NotImplementedError

    @cached_property
    def model_error_handler(self):
        return guard(self)

    def bounds(self) -> Bounds:
        self.ready()
        return self._bounds

    def ready(self):
        if not self._loaded.wait(LOAD_WAIT):
            raise refused(Unavailable(f"{Path(self.archive).name} is still loading"))
        if self._failure is not None:
            raise refused(Unavailable(f"{Path(self.archive).name} failed to load: {self._failure}"))

    def health_status_raw(self) -> dict:
        if not self._loaded.is_set():
            raise refused(Unavailable(f"{Path(self.archive).name} is loading"))
        self.ready()
        return {"data": {"names": [], "ndarray": ["ready"]}, "meta": {}}


class Transformer(Unit):
    """The archive's handler apart from its model: images in, the batch tensor out; raw outputs in, answers out."""

    def start(self):
        from . import split

        self._split = split
        self.handler = split.load_handler(self.archive)
        self.limits = self.handler.limits

    def transform_input_raw(self, request) -> dict:
        self.ready()
        from handlers.base import Job

        try:
            message = message_of(request, self._bounds)
            items = images_of(message, self.handler.limits)
            batch = self._split.batch(self.handler, Job(protocol.Request(items, protocol.V2)))
        except ClientError as error:
            raise refused(error) from None
        return answer(message, "tensor", batch)

    def transform_output_raw(self, request) -> dict:
        self.ready()
        limits = self.handler.limits
        try:
            message = message_of(request, self._bounds)
            outputs = tensor_of(message, limits)
            if outputs.ndim != 2:  # the image classifier's logits: the one handler kind that splits
                raise ClientError(f"transform-output reads one row per image (shape [N, K]), got {list(outputs.shape)}")
            protocol.within(outputs.shape[0], "rows", "max_items", limits.max_items)
            answers = self._split.answers(self.handler, outputs)
        except ClientError as error:
            raise refused(error) from None
        return answer(message, "ndarray", [protocol.jsonable(a) for a in answers])


class Model(Unit):
    """The archive's TorchServe workers, as the tsctl engine runs them, behind ``/predict``."""

    def __init__(
        self,
        archive: str,
        batch_size: int = 1,
        max_batch_delay: int = 100,
        min_workers: int = 1,
        response_timeout: int = 120,
    ):
        super().__init__(archive)
        self.settings = {
            "batch_size": batch_size,
            "max_batch_delay": max_batch_delay,
            "min_workers": min_workers,
            "response_timeout": response_timeout,
        }
        for key, value in self.settings.items():
            if not isinstance(value, int) or value < (0 if key == "max_batch_delay" else 1):
                raise ValueError(f"parameter {key}: {value!r} is not a whole number of at least 1")

    def start(self):
        import tempfile

        from handlers import identity
        from handlers.archives import Archive

        from ..engine.sequences import refuse_stateful
        from ..frontend_settings import Frontend
        from ..model_opening import open_model
        from ..ts_config import ModelSpec
        from ..worker.sockets import FIRST_PORT

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="tsctl-workers", daemon=True).start()
        run_dir = tempfile.mkdtemp(prefix=RUN_PREFIX, dir=os.environ.get("TEMP") or None)
        with Archive(self.archive) as opened:
            refuse_stateful(opened.config, f"{Path(self.archive).name}'s model-config.yaml", "a Seldon model unit")
            toolkit = identity.read(opened) is not None
            spec = ModelSpec(name=opened.model_name, version=opened.version, archive=Path(self.archive))
            for key, value in self.settings.items():
                setattr(spec, key, value)
            spec.max_workers = spec.min_workers
            self.workers = open_model(
                spec, Frontend(), os.path.join(run_dir, "model"), FIRST_PORT, lambda _: not toolkit, archive=opened
            )
            self.limits = tensor_limits(opened.config, spec.batch_size)
        asyncio.run_coroutine_threadsafe(self.workers.start(), self.loop).result()

    def submit(self, body: bytes, headers: Dict[str, str]):
        from ..worker.ts_wire import RequestInput

        future = asyncio.run_coroutine_threadsafe(self.workers.submit(RequestInput(body, headers)), self.loop)
        return future.result()

    def predict_raw(self, request) -> dict:
        self.ready()
        import numpy as np

        try:
            message = message_of(request, self._bounds)
            tensor = tensor_of(message, self.limits)
            if tensor.ndim < 2:
                raise ClientError(f"the model reads one row per example (shape [N, ...]), got {list(tensor.shape)}")
            protocol.within(tensor.shape[0], "rows", "max_items", self.limits.max_items)
            body, headers = protocol.encode_request(tensor, protocol.V2, binary=True)
            reply = self.submit(body, headers)
            if reply.status >= 400:
                raise ClientError(error_message(reply.body), reply.status)
            outputs = np.asarray(protocol.decode_answers(reply.body, reply.headers), dtype=np.float32)
            if not np.isfinite(outputs).all():  # finite values past the model's range (3e38): JSON cannot say it
                problem = "the model's output for this message holds NaN or Infinity"
                raise ClientError(problem, HTTPStatus.INTERNAL_SERVER_ERROR)
        except ClientError as error:
            raise refused(error) from None
        return answer(message, data_of(message)[0], outputs)


def tensor_limits(config: Optional[dict], batch_size: int):
    """What one message to a Model may hold: its archive's ``handler:`` limits, as its tensor handler reads
    them (handlers/base.py ``request_limits``), checked here before the message is made an array."""
    from handlers.base import MIN_AUTO_ITEMS
    from handlers.settings import TensorSettings, read_settings

    s = read_settings(TensorSettings, (config or {}).get("handler"))
    max_items = s.max_items or max(4 * batch_size, MIN_AUTO_ITEMS)
    return protocol.Limits(max_items, s.max_body_bytes, s.max_json_depth, s.max_json_values, s.max_batch_bytes)


class Router:
    """A child drawn by weight (``weights``: "60,30,10", in the children's order), for every message."""

    def __init__(self, weights: str):
        try:
            self.weights = [int(w) for w in str(weights).split(",")]
        except ValueError:
            raise ValueError(f"parameter weights: {weights!r} is not whole numbers separated by commas") from None
        if len(self.weights) < 2 or min(self.weights) < 1:
            raise ValueError(f"parameter weights: {weights!r} needs two or more weights, each at least 1")
        self.random = random.Random()

    @cached_property
    def model_error_handler(self):
        return guard(self)

    @cached_property
    def _bounds(self) -> Bounds:  # it reads what a Model does (the transformer's batch) within its own memory
        from handlers.settings import TensorSettings

        model = Limits(max_body_bytes=TensorSettings.max_body_bytes, max_json_values=TensorSettings.max_json_values)
        bounds = Bounds.of(model)
        logger.info(
            "Router: at most %s bytes and %s values a message (%s bytes of memory)",
            f"{bounds.limits.max_body_bytes:,}",
            f"{bounds.limits.max_json_values:,}",
            f"{bounds.memory:,}",
        )
        return bounds

    def bounds(self) -> Bounds:
        return self._bounds

    def route_raw(self, request) -> dict:
        try:
            message = message_of(request, self._bounds)
        except ClientError as error:
            raise refused(error) from None
        child = self.random.choices(range(len(self.weights)), self.weights)[0]
        return {"data": {"names": [], "ndarray": [[child]]}, "meta": message.get("meta", {})}

    def health_status_raw(self) -> dict:
        return {"data": {"names": [], "ndarray": ["ready"]}, "meta": {}}
