"""TorchServe's config.properties read as TorchServe reads it: the Java properties file (``read_properties``),
the ``TS_*`` environment variables it honours (``with_environment``), and the keys the tsctl engine refuses
(``UNSUPPORTED``: TLS) with a one-sentence ``ConfigError``.

No torch, no archiver: the engine (serving/engine/) and ``tsctl`` (archiver/properties.py) read the same file
through this module; ts_config.py turns what it reads into the models to serve, frontend_settings.py into the
frontend's settings.
"""

import io
import os
from collections import OrderedDict
from pathlib import Path
from typing import Dict

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
    # javaproperties, not a parser of our own. serving/ otherwise imports only what a TorchServe worker has
    # (torch, numpy, Pillow, the standard library), but this function never runs in a worker: only tsctl
    # (archiver/, whose environment installs javaproperties) and the tsctl engine's own process call it
    # (serving/engine/, run from tsctl's environment or from the image archiver/export/kserve/tsctl_image.py
    # writes, whose requirements list javaproperties). It is imported here, not at the top, because the
    # workers and mlserver_runtime.py (MLServer's environment, no javaproperties) import ts_config.py and
    # frontend_settings.py, which import this module for ConfigError alone.
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


def with_environment(properties: Dict[str, str], environ=None) -> Dict[str, str]:
    """``properties`` as TorchServe's frontend ends up with them: with ``enable_envvars_config=true`` (any
    case, as Java's Boolean.parseBoolean), each of ENVIRONMENT_KEYS the environment sets as TS_KEY takes
    its value (TS_SERVICE_ENVELOPE=kservev2: service_envelope=kservev2); otherwise they are as written."""
    environ = os.environ if environ is None else environ
    if properties.get("enable_envvars_config", "").lower() != "true":
        return properties
    found = {key: environ[f"TS_{key.upper()}"] for key in ENVIRONMENT_KEYS if f"TS_{key.upper()}" in environ}
    return {**properties, **found}
