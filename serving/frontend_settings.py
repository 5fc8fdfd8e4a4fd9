"""What TorchServe's frontend does with a request before and around the worker, from config.properties
(``frontend_of``): request and answer sizes, the job queue, the envelope, decoding, metrics, workers and GPUs,
TorchServe's own gRPC addresses, the management API and token authorization (``management_of``).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from . import gpus
from .config_properties import UNSUPPORTED, ConfigError
from .engine.body_limit import DEFAULT_MAX_REQUEST_SIZE, MAX_REQUEST_SIZE

DEFAULT_ALLOWED_URLS = "file://.*|http(s)?://.*"  # TorchServe 0.12's allowed_urls


@dataclass
class Frontend:
    """What TorchServe's frontend does with a request before and around the worker, from the config."""

    max_request_size: int = DEFAULT_MAX_REQUEST_SIZE  # one body (body_limit.py)
    job_queue_size: int = 100  # per model version; a full queue answers 503
    max_inflight_bytes: Optional[int] = None  # the engine's bodies in flight (None: body_limit's default)
    body_idle_timeout: Optional[float] = None  # s a body may pause while it arrives (None: body_limit's)
    max_response_size: int = 6553500  # TorchServe's default: an answer's body (or any field) above it fails
    public_key: Optional[str] = None  # the engine serves only archives signed for it (handlers/signing.py)
    envelope: Optional[str] = None  # service_envelope: kserve / kservev2 wrap non-toolkit handlers
    decode_input_request: bool = True
    limit_max_image_pixels: bool = True
    metrics_config: Optional[str] = None
    # the workers' metrics that metrics_config does not declare exported (model_metrics_auto_detect; TorchServe's
    # default is false, the engine's true: serving/engine/metrics.py)
    metrics_auto_detect: bool = True
    default_workers: int = 1
    configured_workers: int = 0  # default_workers_per_model as given: a register's initial_workers (TorchServe's 0)
    # number_of_gpu as TorchServe sets it at start: the config's, capped at the GPUs found (serving/gpus.py)
    number_of_gpu: int = field(default_factory=lambda: gpus.count_gpus())
    default_response_timeout: int = 120
    default_startup_timeout: int = 120  # s a worker may take to load, unless its model-config.yaml says
    # The management API and token authorization (serving/engine/management.py, serving/engine/token_auth.py), with
    # TorchServe 0.12's defaults: the model API off, tokens on, keys valid 60 minutes, any file or http(s) URL.
    enable_model_api: bool = False
    token_authorization: bool = True
    token_authorization_asked: bool = False  # the config says disable_token_authorization=false
    token_expiration_min: float = 60.0
    allowed_urls: List[str] = field(default_factory=lambda: DEFAULT_ALLOWED_URLS.split(","))
    # inference_address, management_address, metrics_address as the config writes them (serving/engine/listeners.py)
    addresses: Dict[str, str] = field(default_factory=dict)
    enable_metrics_api: bool = True  # TorchServe's metrics listener (metrics_address)
    # TorchServe's own gRPC API (serving/engine/ts_grpc.py), each on its own listener as TorchServe binds them
    grpc_inference_address: str = "127.0.0.1"
    grpc_inference_port: int = 7070
    grpc_management_address: str = "127.0.0.1"
    grpc_management_port: int = 7071
    notes: List[str] = field(default_factory=list)  # settings read but not applied, archives skipped: a line each


def frontend_of(properties: Dict[str, str], path) -> Frontend:
    for key, why in UNSUPPORTED.items():
        if properties.get(key) and properties[key].lower() != "false":
            raise ConfigError(f"{path}: {key} is set, which the tsctl engine does not support ({why}): remove it")
    frontend = Frontend()
    frontend.max_request_size = _int(properties, MAX_REQUEST_SIZE, frontend.max_request_size, path)
    frontend.max_response_size = _int(properties, "max_response_size", frontend.max_response_size, path)
    frontend.job_queue_size = _int(properties, "job_queue_size", frontend.job_queue_size, path)
    frontend.envelope = properties.get("service_envelope") or None
    frontend.decode_input_request = properties.get("decode_input_request", "true").lower() == "true"
    frontend.limit_max_image_pixels = properties.get("limit_max_image_pixels", "true").lower() == "true"
    frontend.metrics_config = properties.get("metrics_config") or None
    frontend.metrics_auto_detect = properties.get("model_metrics_auto_detect", "true").strip().lower() != "false"
    frontend.configured_workers = _int(properties, "default_workers_per_model", 0, path)
    try:
        note = gpus.number_of_gpu_note(properties, frontend.number_of_gpu, path)
        frontend.number_of_gpu = gpus.number_of_gpu(properties, frontend.number_of_gpu)
    except gpus.PlacementError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    frontend.notes.extend([note] if note else [])  # logged at start, as a deviceType: gpu without one
    frontend.default_workers = frontend.configured_workers or frontend.number_of_gpu or 1
    frontend.default_response_timeout = _int(properties, "default_response_timeout", 120, path)
    frontend.default_startup_timeout = _int(properties, "default_startup_timeout", 120, path)
    for api in ("inference", "management"):
        address = properties.get(f"grpc_{api}_address") or getattr(frontend, f"grpc_{api}_address")
        setattr(frontend, f"grpc_{api}_address", address)
        port = _int(properties, f"grpc_{api}_port", getattr(frontend, f"grpc_{api}_port"), path)
        setattr(frontend, f"grpc_{api}_port", port)
    if properties.get("install_py_dep_per_model", "false").lower() == "true":
        frontend.notes.append(
            f"{path}: install_py_dep_per_model=true: the tsctl engine installs nothing per model; "
            "its image holds each archive's requirements (tsctl export kserve --engine tsctl)"
        )
    management_of(properties, path, frontend)
    return frontend


def management_of(properties: Dict[str, str], path, frontend: Frontend):
    """The management API's and token authorization's keys, read as TorchServe 0.12's ConfigManager reads
    them: ``enable_model_api`` and ``disable_token_authorization`` true only when they say "true" (any
    case), ``token_expiration_min`` a number of minutes (60 otherwise), ``allowed_urls`` comma-separated
    patterns (``with_environment`` has applied the ``TS_*`` variables of the first three); the addresses as
    written, which serving/engine/listeners.py reads."""
    values = properties
    frontend.enable_model_api = values.get("enable_model_api", "false").strip().lower() == "true"
    disable = values.get("disable_token_authorization")
    frontend.token_authorization = (disable or "false").strip().lower() != "true"
    frontend.token_authorization_asked = disable is not None and frontend.token_authorization
    expiration = values.get("token_expiration_min")
    if expiration not in (None, ""):
        try:
            frontend.token_expiration_min = float(expiration)
        except ValueError:
            raise ConfigError(f"{path}: token_expiration_min={expiration!r} is not a number of minutes") from None
        if not 0 < frontend.token_expiration_min < 1e9:
            raise ConfigError(f"{path}: token_expiration_min={expiration} must be a positive number of minutes")
    frontend.allowed_urls = [p for p in values.get("allowed_urls", DEFAULT_ALLOWED_URLS).split(",")]
    for key in ("inference_address", "management_address", "metrics_address"):
        if properties.get(key) is not None:
            frontend.addresses[key] = properties[key]
    frontend.enable_metrics_api = properties.get("enable_metrics_api", "true").strip().lower() != "false"


def _int(properties: Dict[str, str], key: str, default: int, path) -> int:
    value = properties.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{path}: {key}={value!r} is not a whole number: fix it or remove it") from None
