"""TorchServe's Python worker, in-process: what ``ts/model_service_worker.py`` does with a model,
without its socket, and what TorchServe's frontend does on either side of it.

- **Load** (``load``): TorchServe's own ``TsModelLoader`` with the arguments the frontend's load
  command carries (gpu, batchSize, envelope, limitMaxImagePixels) and a metrics cache read from
  TorchServe's own ``metrics.yaml``, its model name set, as the worker makes it. So the handler gets
  the worker's ``Context``: ``context.metrics`` (``add_time``, ``add_counter``, ``add_metric``,
  ``get_metric``), ``manifest``, ``system_properties`` (``gpu_id``, ``batch_size``,
  ``limit_max_image_pixels``, ...), ``model_yaml_config``; any handler TorchServe runs (its built-in
  handlers, a ``BaseHandler`` subclass, a ``file.py:function`` entry point) runs here.
- **A batch** (``frontend_batch``, ``predict``): each HTTP request (body and headers) becomes the request the frontend
  sends a worker: its headers, one ``body`` parameter with the request's MIME type, the body decoded
  as the worker decodes it (``application/json`` parsed, ``text/*`` as a string, unless
  ``decode_input_request`` is off; ``decode_parameter``). The batch runs through TorchServe's own
  ``Service.predict`` (request ids, per-request headers, the ``PredictionTime`` metric, its error
  handling) and its reply is read back as the frontend reads it (``read_reply``): per request the
  status, content type, headers and body bytes the handler set; a batch that failed as a whole
  (``Prediction failed`` 503, out of memory 507, a wrong answer count) gives every request of it the
  frontend's JSON error, ``{"code", "type": "InternalServerException", "message"}``.

TorchServe's worker decodes each request and encodes each answer once: here too (answers are the
bytes a client of TorchServe receives: a dict answer is ``json.dumps(answer, indent=2)``).
"""

import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import ts
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.model_loader import TsModelLoader
from ts.service import Service

from handlers import log_text
from handlers.requests import content_type

from .ts_wire import Request, Response, batch_error, mime_type, read_reply

logger = log_text.logger(__name__)

METRICS_YAML = os.path.join(os.path.dirname(ts.__file__), "configs", "metrics.yaml")  # the frontend's default


def as_request(value: Any) -> Request:
    """An input of ``LocalModel.predict`` as a request: ``bytes`` a raw body
    (``application/octet-stream``), ``str`` a text (``text/plain``), ``dict``/``list`` a JSON body,
    a ``Path`` the file with the content type of its suffix."""
    if isinstance(value, Request):
        return value
    if isinstance(value, Path):
        return Request(value.read_bytes(), {"Content-Type": content_type(value)})
    if isinstance(value, (bytes, bytearray)):
        return Request(bytes(value), {"Content-Type": "application/octet-stream"})
    if isinstance(value, str):
        return Request(value.encode("utf-8"), {"Content-Type": "text/plain"})
    return Request(json.dumps(value).encode("utf-8"), {"Content-Type": "application/json"})


def load(
    model_name: str,
    model_dir: str,
    handler: str,
    gpu: Optional[int] = None,
    batch_size: int = 1,
    envelope: Optional[str] = None,
    limit_max_image_pixels: bool = True,
    metrics_config: Optional[str] = None,
) -> Service:
    """The model loaded as ``TorchModelServiceWorker.load_model`` loads it (the handler's
    ``initialize`` runs here and raises whatever stops it). ``metrics_config``: TorchServe's property
    of that name, the metrics.yaml whose model metrics the cache holds (TorchServe's own by default)."""
    metrics = MetricsCacheYamlImpl(config_file_path=metrics_config or METRICS_YAML)
    metrics.initialize_cache()
    metrics.model_name = model_name
    service = TsModelLoader().load(
        model_name, model_dir, handler, gpu, batch_size, envelope, limit_max_image_pixels, metrics
    )
    service.set_cl_socket(None)
    return service


def decode_parameter(body: bytes, content_type: str, decode: bool = True) -> Any:
    """A request body as the worker hands it to the handler (``otf_message_handler._retrieve_input_data``):
    ``application/json`` parsed and ``text/*`` decoded when ``decode`` (``decode_input_request``), a
    ``bytearray`` of the body (as TorchServe's socket reader makes) when that fails or for any other type."""
    if decode and content_type == "application/json":
        try:
            return json.loads(body.decode("utf-8"))
        except Exception:  # noqa: BLE001 - TorchServe forwards the bytes, whatever went wrong
            logger.warning("Failed json decoding of input data. Forwarding encoded payload")
    elif decode and content_type.startswith("text"):
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            logger.warning("Failed utf-8 decoding of input data. Forwarding encoded payload")
    return bytearray(body)


def frontend_batch(requests: List[Request], decode: bool = True) -> List[dict]:
    """The batch as the worker reads it off the frontend's message (``_retrieve_inference_msg``)."""
    return [_frontend_request(r.headers, {"body": decode_parameter(r.body, r.content_type, decode)}) for r in requests]


def rows_batch(rows: List[dict], headers: Optional[List[Dict[str, str]]] = None) -> List[dict]:
    """The batch for rows already as the worker decoded them, each a mapping of parameter name to
    value (``{"body": ...}``, or a multipart form's fields), with its HTTP headers."""
    headers = headers or [{} for _ in rows]
    return [_frontend_request(h, row) for row, h in zip(rows, headers)]


def _frontend_request(headers: Dict[str, str], parameters: Dict[str, Any]) -> dict:
    kind = mime_type(headers)
    return {
        "requestId": str(uuid.uuid4()).encode(),
        "headers": [{"name": k.encode("utf-8"), "value": v.encode("utf-8")} for k, v in headers.items()],
        "parameters": [{"name": name, "contentType": kind, "value": value} for name, value in parameters.items()],
    }


def predict(service: Service, batch: List[dict]) -> List[Response]:
    """One frontend batch through TorchServe's ``Service.predict``: one Response per request, in order.

    What kills a TorchServe worker (a handler calling ``sys.exit``, an answer TorchServe cannot
    encode: a lone surrogate, a status that is not a number, a body over 2 GiB) gives every request
    of the batch the frontend's ``500 Worker died.``; the handler stays loaded here."""
    ids = [r["requestId"].decode() for r in batch]
    try:
        return read_reply(service.predict(batch), ids)
    except BaseException as exc:  # noqa: BLE001 - whatever would end a worker process
        if isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
            raise  # the user's Ctrl-C
        logger.error("the worker would have died: %s: %s", type(exc).__name__, exc, exc_info=True)
        return batch_error(500, "Worker died.", len(ids))
