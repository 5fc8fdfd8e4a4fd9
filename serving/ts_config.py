"""TorchServe's config.properties, read as TorchServe reads it: the one file both engines serve from.

``read_properties`` parses the Java properties file; ``models`` turns it and the model store into
one ``ModelSpec`` per model version: its archive, whether it is the default version, and the
model_snapshot's worker settings (minWorkers, maxWorkers, batchSize, maxBatchDelay,
responseTimeout), TorchServe's defaults where a key is missing. Without a config file, every
archive in the store is served with its own model-config.yaml settings, as ``torchserve
--models all`` would; the engine leaves out, with a note naming it, one that cannot be read as a
model archive and serves the rest, as TorchServe does not stop for it. ``Frontend`` holds the keys
the frontend itself honours (request size, queue size, envelope, decoding, image pixel limit,
metrics config, the management API and token authorization: ``management_of``). A key the tsctl
engine cannot honour (TLS) is refused in one line (``ConfigError``).

No torch, no archiver: the engine (serving/engine/app.py) and ``tsctl`` (archiver/properties.py)
read the same file through this module.
"""

import io
import json
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from handlers.archives import MAX_CONFIG_BYTES, ArchiveError, ArchiveLike, opened  # noqa: F401 - MAX_CONFIG_BYTES: callers'

from . import gpus
from .engine.body_limit import DEFAULT_MAX_REQUEST_SIZE, MAX_REQUEST_SIZE
from .model_store import NotInStore, store_entry

SNAPSHOT_KEYS = ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout")
SNAPSHOT_DEFAULTS = {"minWorkers": 1, "maxWorkers": 1, "batchSize": 1, "maxBatchDelay": 100, "responseTimeout": 120}
# The least value of each worker setting (settings_problem): TorchServe 0.12's ModelConfig ignores, with a log
# line only, a negative worker count or maxBatchDelay and a batchSize or responseTimeout below 1; a model with
# no worker answers every request 503.
SNAPSHOT_LEAST = {"minWorkers": 1, "maxWorkers": 1, "batchSize": 1, "maxBatchDelay": 0, "responseTimeout": 1}
# The greatest value of every worker setting: TorchServe reads each as a Java Integer (a larger YAML number is a
# Long, which its ModelConfig ignores as it ignores 0).
SNAPSHOT_MOST = 2**31 - 1
DEFAULT_ALLOWED_URLS = "file://.*|http(s)?://.*"  # TorchServe 0.12's allowed_urls
# Keys whose meaning the tsctl engine cannot give: refused rather than silently ignored.
UNSUPPORTED = {
    "enable_grpc_ssl": "TLS: terminate it in front of the engine (KServe's ingress does)",
    "certificate_file": "TLS: terminate it in front of the engine (KServe's ingress does)",
    "private_key_file": "TLS: terminate it in front of the engine (KServe's ingress does)",
    "keystore": "TLS: terminate it in front of the engine (KServe's ingress does)",
}

# The keys the engine reads that TorchServe also takes from the environment, as TS_ and the key in capitals,
# when the config says enable_envvars_config=true (its ConfigManager's TS_* constants; the environment wins
# over the file). KServe's TorchServe runtime sets TS_SERVICE_ENVELOPE so: kserve or kservev2.
ENVIRONMENT_KEYS = (
    "service_envelope",
    "max_request_size",
    "max_response_size",
    "job_queue_size",
    "decode_input_request",
    "limit_max_image_pixels",
    "metrics_config",
    "model_metrics_auto_detect",
    "default_workers_per_model",
    "default_response_timeout",
    "default_startup_timeout",
    "number_of_gpu",
    "install_py_dep_per_model",
    "disable_token_authorization",
    "enable_model_api",
    "token_expiration_min",  # (TorchServe reads allowed_urls from TS_ALLOWED_URLS only with use_env_allowed_urls)
    "inference_address",
    "management_address",
    "metrics_address",
    "enable_metrics_api",
    "grpc_inference_address",
    "grpc_inference_port",
    "grpc_management_address",
    "grpc_management_port",
    "load_models",
    *UNSUPPORTED,
)


class ConfigError(ValueError):
    """A config.properties the engine cannot serve as written: one sentence naming the key and the fix."""


MAX_METRICS_YAML = 1 << 20  # bytes of a metrics_config (TorchServe's own metrics.yaml: 3 kB)
SPECIAL_CONFIG_BYTES = 1 << 20  # bytes read of a config that is a device or FIFO (read_properties; a file: all)


def read_regular(path, limit: int) -> str:
    """A regular file's UTF-8 text, at most ``limit`` bytes: anything else is an OSError at once (a FIFO is
    opened without blocking; a FIFO, a device or a folder refused by what was opened, not by its name)."""
    import errno
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as opened_file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = opened_file.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit:,} bytes")
    return data.decode("utf-8")


def read_properties(path) -> Dict[str, str]:
    """A Java .properties file as a dict, read as TorchServe's ConfigManager reads it
    (``java.util.Properties.load`` of the file's bytes, ISO-8859-1): ``key=value``, ``key: value`` and
    ``key value`` lines, ``#`` and ``!`` comments, lines continued by a trailing backslash (a
    model_snapshot spread over many lines), ``\\uXXXX`` and the other escapes; a key given twice keeps
    its last value, a key alone has the value ""."""
    # javaproperties, not a parser of our own. handlers/ otherwise imports only what a TorchServe worker
    # has (torch, numpy, Pillow, the standard library), but this function never runs in a worker: only
    # tsctl (archiver/, whose environment installs javaproperties) and the tsctl engine's own process call
    # it (serving/engine/app.py, run from tsctl's environment or from the image archiver/export/kserve/tsctl_image.py
    # writes, whose requirements list javaproperties). It is imported here, not at the top, because
    # serving/engine/workers.py and mlserver_runtime.py (MLServer's environment, no javaproperties) import this
    # module for its dataclasses alone.
    import javaproperties

    path = Path(path)
    if path.is_dir():  # TorchServe: "Unable to read configuration file" (an IOException)
        raise ConfigError(f"{path} is a directory, not a config file: give the config.properties in it")
    if not path.exists():
        raise ConfigError(f"{path} does not exist: write it with 'tsctl config'")
    # TorchServe's ConfigManager loads whatever file exists (ConfigManager.java, 'if (tsConfigFile.exists())
    # ... prop.load(stream)'): /dev/null is an empty config. A device or FIFO is read so, up to SPECIAL_CONFIG_BYTES.
    with path.open("rb") if path.is_file() else io.BytesIO(_special(path)) as stream:  # bytes, ISO-8859-1 as Java
        try:
            return javaproperties.load(stream, object_pairs_hook=OrderedDict)
        except javaproperties.InvalidUEscapeError as exc:
            raise ConfigError(
                f"{path}: {exc} (TorchServe refuses the file too): write a complete \\uXXXX, or \\\\ for a backslash"
            ) from None


def _special(path: Path) -> bytes:
    """The bytes of a config that is a device or a FIFO (``/dev/null``: none), opened without blocking, at
    most ``SPECIAL_CONFIG_BYTES`` (``/dev/zero`` never ends); a ConfigError naming it otherwise."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as opened_file:
            data = opened_file.read(SPECIAL_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path} is not a regular file and cannot be read ({exc.strerror or exc})") from None
    if data is None or len(data) > SPECIAL_CONFIG_BYTES:
        raise ConfigError(
            f"{path} is not a regular file and gives more than {SPECIAL_CONFIG_BYTES:,} bytes (or none yet): give "
            "a config.properties file"
        )
    return data


def snapshot_of(properties: Dict[str, str], path="config.properties") -> dict:
    raw = properties.get("model_snapshot")
    if not raw:
        empty = " (it holds no keys)" if not properties else ""
        raise ConfigError(f"{path} has no model_snapshot{empty}: write the config with 'tsctl config'")
    try:
        snapshot = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(
            f"{path}: model_snapshot is not valid JSON ({exc}): regenerate it with 'tsctl config'"
        ) from None
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("models"), dict):
        raise ConfigError(f"{path}: model_snapshot has no 'models' object: regenerate it with 'tsctl config'")
    return snapshot


def settings_problem(values: Dict[str, object]) -> Optional[str]:
    """What is wrong with the worker settings in ``values`` (a model-config.yaml or a model_snapshot entry:
    whichever of SNAPSHOT_KEYS it holds), one clause naming the key; None when TorchServe and the tsctl
    engine would both serve them as written. The one check of these settings: ``tsctl package`` (the
    model-config.yaml), ``tsctl config`` (each archive's, and the snapshot it writes) and the engine's
    reader (``_from_snapshot``) all call it."""
    for key, least in SNAPSHOT_LEAST.items():
        if key not in values:
            continue
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{key} is {value!r}, not a whole number"
        if value == 0 and key in ("minWorkers", "maxWorkers"):
            return f"{key} is 0: a model with no worker answers every request 503; give at least 1"
        if value < least:
            return f"{key} is {value}, which TorchServe ignores with a log line only: give at least {least}"
        if value > SNAPSHOT_MOST:
            return f"{key} is {value}, above Java's int range, which TorchServe ignores: give at most {SNAPSHOT_MOST}"
    low, high = values.get("minWorkers"), values.get("maxWorkers")
    if isinstance(low, int) and isinstance(high, int) and low > high:
        return f"minWorkers {low} is above maxWorkers {high}: give maxWorkers at least minWorkers"
    return None


@dataclass
class ModelSpec:
    """One model version to serve, with its worker settings."""

    name: str
    version: str
    archive: Path
    default: bool = True
    min_workers: int = 1
    max_workers: int = 1
    batch_size: int = 1
    max_batch_delay: int = 100  # ms
    response_timeout: int = 120  # s, per batch
    # TorchServe's describe says loadedAtStartup for the models of load_models (the engine without a config),
    # not for a model_snapshot's nor a registered one
    loaded_at_startup: bool = False
    url: Optional[str] = None  # what a register named it by (describe's modelUrl; else the archive's file name)
    startup_timeout: Optional[int] = None  # s a worker may take to load (model_opening sets it; None: LOAD_TIMEOUT)
    job_queue_size: Optional[int] = None  # the model-config.yaml's jobQueueSize (None: the config's job_queue_size)
    continuous_batching: bool = False  # the model-config.yaml's continuousBatching (serving/engine/continuous.py)
    store: Optional[Path] = None  # the model store (real path) its archive must lie in, opened; None: anywhere

    def describe_settings(self) -> dict:
        return {
            "minWorkers": self.min_workers,
            "maxWorkers": self.max_workers,
            "batchSize": self.batch_size,
            "maxBatchDelay": self.max_batch_delay,
            "responseTimeout": self.response_timeout,
        }


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


def models(
    config: Optional[Path], model_store: Path, skip_unreadable: bool = False
) -> "tuple[List[ModelSpec], Frontend]":
    """The model versions to serve and the frontend's settings: from ``config``'s model_snapshot, or,
    without a config file, every archive in ``model_store`` with its model-config.yaml settings.
    ``skip_unreadable`` (the engine without a config file): an archive of the store that cannot be read
    (a stray .tar.gz, a damaged .mar) is left out with a line in ``Frontend.notes`` naming it and why."""
    check_store(model_store)
    if config is None:
        frontend = Frontend()
        found = archives_in(Path(model_store))
        if not found:
            raise ConfigError(
                f"{model_store} holds no model archives (.mar, .tar.gz or directories): build them with 'tsctl package'"
            )
        specs = _from_store(found, frontend, skip_unreadable)
        if not specs:
            raise ConfigError(f"{model_store} holds no archive that can be served: {'; '.join(frontend.notes)}")
        return specs, frontend
    return from_properties(with_environment(read_properties(config)), config, model_store)


def with_environment(properties: Dict[str, str], environ=None) -> Dict[str, str]:
    """``properties`` as TorchServe's frontend ends up with them: with ``enable_envvars_config=true`` (any
    case, as Java's Boolean.parseBoolean), each of ENVIRONMENT_KEYS the environment sets as TS_KEY takes
    its value (TS_SERVICE_ENVELOPE=kservev2: service_envelope=kservev2); otherwise they are as written."""
    environ = os.environ if environ is None else environ
    if properties.get("enable_envvars_config", "").lower() != "true":
        return properties
    found = {key: environ[f"TS_{key.upper()}"] for key in ENVIRONMENT_KEYS if f"TS_{key.upper()}" in environ}
    return {**properties, **found}


def _from_store(archives: List[Path], frontend: Frontend, skip_unreadable: bool = False) -> List[ModelSpec]:
    """A spec of each archive; one model version held by two archives (NAME.mar beside NAME.tar.gz or
    NAME/, which 'tsctl package' writes to the same store) is refused, as 'tsctl config' refuses it,
    rather than one copy silently replacing the other. ``skip_unreadable``: an archive that cannot be
    read is a note instead of the error, and the others are served (TorchServe 0.12's ``load_models=all``
    does not stop for it either: it registers it as a model whose workers never load)."""
    specs, seen = [], {}
    for archive in archives:
        try:
            spec = _from_archive(in_store(archive), frontend, store=archive.parent)
        except (ArchiveError, ConfigError) as exc:
            if not skip_unreadable:
                raise
            frontend.notes.append(f"{archive} is not served, the rest of the store is: {exc}")
            continue
        first = seen.setdefault((spec.name, spec.version), spec.archive)
        if first != spec.archive:
            raise ConfigError(
                f"{spec.archive} and {first} both hold model '{spec.name}' version {spec.version}: "
                "remove one from the model store"
            )
        specs.append(spec)
    return specs


def in_store(archive: Path) -> Path:
    """``archive``, an entry found by listing the store, when it lies inside (``store_entry``); else ConfigError."""
    try:
        return store_entry(archive.parent, archive.name)
    except NotInStore as exc:
        raise ConfigError(exc.message(archive.name)) from None


def check_store(model_store: Path):
    """A one-line ConfigError unless ``model_store`` is a directory."""
    if Path(model_store).exists() and not Path(model_store).is_dir():
        raise ConfigError(f"model store {model_store} is a file, not a directory: give the directory of the archives")
    if not Path(model_store).is_dir():
        raise ConfigError(f"model store {model_store} does not exist: build archives with 'tsctl package'")


def from_properties(properties: Dict[str, str], config, model_store: Path) -> "tuple[List[ModelSpec], Frontend]":
    """``models`` for a config file already read (``properties``, read from ``config``)."""
    model_store = Path(model_store)
    check_store(model_store)
    frontend = frontend_of(properties, config)
    if not properties.get("model_snapshot"):  # TorchServe then starts the models of load_models
        return from_load_models(properties, config, model_store, frontend), frontend
    snapshot = snapshot_of(properties, config)
    specs = []
    for name, versions in snapshot["models"].items():
        if not isinstance(versions, dict) or not versions:
            raise ConfigError(f"{config}: model_snapshot's {name!r} has no versions: regenerate it with 'tsctl config'")
        for version, entry in versions.items():
            specs.append(_from_snapshot(config, model_store, name, version, entry, frontend))
        mine = [s for s in specs if s.name == name]
        if sum(s.default for s in mine) != 1:  # TorchServe makes the first version the default then
            for spec in mine:
                spec.default = spec is mine[0]
    if not specs:
        raise ConfigError(f"{config}: model_snapshot lists no models: package some and run 'tsctl config'")
    return specs, frontend


def from_load_models(properties: Dict[str, str], config, model_store: Path, frontend: Frontend) -> List[ModelSpec]:
    """The models of ``load_models``, as TorchServe 0.12 starts them without a model_snapshot
    (ModelServer.initModelStore): ``all`` (any case) every archive of the store (``archives_in``), else a
    comma-separated list of ``FILE`` or ``NAME=FILE`` (the model served as NAME), each an archive of the
    store; each with its model-config.yaml (``_from_archive``), its workers ``default_workers_per_model``,
    else as many as TorchServe counts CPUs (``torchserve_workers``); the first version of a name its default
    (``all``: the first in the directory's order, TorchServe's, which need not be the file names' order).
    An entry it cannot serve (no such archive, an unreadable one, a model version given twice) is a line in
    ``frontend.notes`` and the rest is served, as TorchServe logs "Failed to load model" and goes on. No
    model at all is a ConfigError unless the model API is on (TorchServe then starts with none)."""
    value = (properties.get("load_models") or "").strip()
    if value.lower() == "all":
        entries = [(None, archive.name) for archive in archives_in(model_store, ordered=False)]
    else:
        entries = [(name.strip() or None, url.strip()) if sep else (None, name.strip())
                   for name, sep, url in (entry.partition("=") for entry in value.split(","))]  # fmt: skip
    workers = frontend.configured_workers or torchserve_workers(frontend.number_of_gpu)
    specs: List[ModelSpec] = []
    for name, url in entries:
        if not url:
            continue
        try:
            if ".." in url:
                raise ConfigError(f"Relative path is not allowed in url: {url}")
            try:  # the engine downloads nothing: archives come from the store
                archive = store_entry(model_store, url)
            except NotInStore as exc:
                raise ConfigError(exc.message(url)) from None
            spec = _from_archive(archive, frontend, workers, store=model_store)
            spec.name, spec.url = name or spec.name, url
            if any((s.name, s.version) == (spec.name, spec.version) for s in specs):
                raise ConfigError(f"Model version {spec.version} is already registered for model {spec.name}")
        except (ArchiveError, ConfigError) as exc:
            frontend.notes.append(f"{config}: load_models: Failed to load model: {url} ({exc}); the rest is served")
            continue
        spec.default = all(s.name != spec.name for s in specs)
        specs.append(spec)
    if not specs and not frontend.enable_model_api:
        why = f"load_models={value} serves no model" if value else "it has neither model_snapshot nor load_models"
        raise ConfigError(f"{config}: {why} (and enable_model_api is off): give load_models=all, or regenerate "
                          "the file with 'tsctl config'")  # fmt: skip
    return specs


def torchserve_workers(number_of_gpu: int = 0) -> int:
    """TorchServe 0.12's workers per model without default_workers_per_model (ConfigManager.getDefaultWorkers):
    one a GPU, else the CPUs the JVM sees, the process's CPU affinity within its cgroup quota."""
    from handlers import cpu_limit

    return gpus.default_workers(0, number_of_gpu, cpu_limit.usable())


def snapshot_archive(config, model_store: Path, name: str, entry) -> Path:
    """The archive a model_snapshot entry names, which must be a file name in ``model_store``."""
    mar_name = entry.get("marName") if isinstance(entry, dict) else None
    try:
        return store_entry(model_store, mar_name if isinstance(mar_name, str) else "")
    except NotInStore as exc:
        why = f" ({exc})" if str(exc) and mar_name else ""
        raise ConfigError(f"{config}: model_snapshot names {mar_name!r} for model {name!r}, which is not in "
                          f"{model_store}{why}, the model store given (--model-store): give the store the config was "
                          f"written for, or run 'tsctl config --model-store {model_store}' for a config of this "
                          "store") from None  # fmt: skip


def _from_snapshot(config, model_store: Path, name: str, version: str, entry, frontend: Frontend) -> ModelSpec:
    where = f"{config}: model_snapshot's {name!r} version {version!r}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} is not an object: regenerate the file with 'tsctl config'")
    archive = snapshot_archive(config, model_store, name, entry)
    values = {key: entry.get(key, SNAPSHOT_DEFAULTS[key]) for key in SNAPSHOT_KEYS}
    problem = settings_problem(values)
    if problem:
        raise ConfigError(f"{where}: {problem}: fix it in the snapshot, or regenerate it with 'tsctl config'")
    return ModelSpec(
        name=name,
        version=str(version),
        archive=archive,
        default=bool(entry.get("defaultVersion", False)),
        min_workers=values["minWorkers"],
        max_workers=values["maxWorkers"],
        batch_size=values["batchSize"],
        max_batch_delay=values["maxBatchDelay"],
        response_timeout=values["responseTimeout"],
        store=Path(model_store).resolve(),
    )


def archives_in(model_store: Path, ordered: bool = True) -> List[Path]:
    """The model archives in a store, as TorchServe takes them: *.mar and *.tar.gz files and unpacked
    directories with a MAR-INF/MANIFEST.json, hidden names left out, sorted (``ordered=False``: in the
    directory's own order, as TorchServe's File.listFiles lists them). What 'tsctl config' lists in
    the model_snapshot and what the engine serves without one."""
    found = []
    listed = Path(model_store).iterdir()
    for p in sorted(listed) if ordered else listed:
        if p.name.startswith("."):
            continue
        if p.is_file() and (p.name.endswith(".mar") or p.name.endswith(".tar.gz")):
            found.append(p)
        elif p.is_dir() and (p / "MAR-INF" / "MANIFEST.json").is_file():
            found.append(p)
    return found


def archive_config(archive: ArchiveLike) -> dict:
    """The archive's model-config.yaml as a dict ({} without one): ``Archive.config``."""
    with opened(archive) as found:
        return found.config


def _from_archive(
    archive: ArchiveLike, frontend: Frontend, workers: Optional[int] = None, store: Optional[Path] = None
) -> ModelSpec:
    """TorchServe registering an archive with no snapshot: model-config.yaml's settings, else defaults
    (``workers``: the workers without a model-config.yaml minWorkers, else ``default_workers``); an archive
    of a model ``store`` is opened within it (what was opened must lie inside it, links resolved)."""
    with opened(archive, within=store) as found:
        config = found.config
        problem = settings_problem(config)
        if problem:
            raise ConfigError(f"{found.path}'s model-config.yaml: {problem}, and package the archive again")
        workers = config.get("minWorkers", workers or max(1, frontend.default_workers))
        return ModelSpec(
            name=found.model_name,
            version=found.version,
            archive=found.path,
            loaded_at_startup=True,
            min_workers=workers,
            max_workers=max(workers, config.get("maxWorkers", workers)),  # only a default minWorkers can be above it
            batch_size=config.get("batchSize", 1),
            max_batch_delay=config.get("maxBatchDelay", 100),
            response_timeout=config.get("responseTimeout", frontend.default_response_timeout),
            store=found.within,
        )


def default_config(model_store: Path) -> Optional[Path]:
    """``config/config.properties`` beside the store (the PVC tree tsctl writes), when there is one."""
    candidate = Path(model_store).resolve().parent / "config" / "config.properties"
    return candidate if candidate.is_file() and os.access(candidate, os.R_OK) else None
