"""config/config.properties: one file for a local TorchServe and for KServe.

The file carries KServe's values (store at /mnt/models/model-store, inference on 0.0.0.0:8085,
``enable_envvars_config=true``). A local ``torchserve --model-store model-store`` overrides the
store; ``tsctl serve`` also moves the addresses to 127.0.0.1 through TorchServe's own ``TS_*``
environment variables, which ``enable_envvars_config=true`` lets it read.

TorchServe's per-model install is off (``install_py_dep_per_model=false``): the environment that
runs torchserve locally has the packages already, and the install would put the newest release
of every requirement and of its dependencies (torch with CUDA included: 6.1 GB for
all-MiniLM-L6-v2) into the model directory, ahead of the environment's own torch, and needs a
package index. KServe's image has only what it was built with: ``kserve_gaps`` names each archive
whose requirements.txt asks for more than that and would not load there (compared with
``archiver.kserve_images``' list, nothing resolved), and ``tsctl export kserve`` writes the config for
KServe with the install on and each archive's requirements locked for the image.

``model_snapshot`` lists every archive in the model store with its worker settings: a command-line
option wins over the archive's model-config.yaml, which wins over the defaults below.
"""

import json
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from handlers import identity
from handlers.settings import did_you_mean
from serving import config_properties, ts_config

from . import requirements
from .errors import UserError, make_directory
from .kserve_images import DEFAULT as DEFAULT_RUNTIME
from .kserve_images import runtime_named
from .mar import MODEL_NAME, VERSION
from .opened_archive import opened

KSERVE_MODEL_STORE = "/mnt/models/model-store"
SNAPSHOT_KEYS, SNAPSHOT_DEFAULTS = ts_config.SNAPSHOT_KEYS, ts_config.SNAPSHOT_DEFAULTS

BASE_PROPERTIES = OrderedDict(
    [
        ("inference_address", "http://0.0.0.0:8085"),
        ("management_address", "http://0.0.0.0:8085"),
        ("metrics_address", "http://0.0.0.0:8082"),
        ("grpc_inference_port", "7070"),
        ("grpc_management_port", "7071"),
        ("enable_metrics_api", "true"),
        ("metrics_mode", "prometheus"),
        ("number_of_netty_threads", "4"),
        ("job_queue_size", "100"),
        # TorchServe's 6.5 MB default refuses a few images sent as JSON tensors (a KServe transformer's
        # requests to its predictor); 64 MiB each way.
        ("max_request_size", "67108864"),
        ("max_response_size", "67108864"),
        ("enable_envvars_config", "true"),
        # Off: the environment serving the file has the packages (see above); tsctl export kserve
        # turns it on for KServe's image, with each archive's requirements locked for it.
        ("install_py_dep_per_model", "false"),
        ("model_store", KSERVE_MODEL_STORE),
        # TorchServe 0.11+ defaults: token auth on, model API off. KServe's client sends no token,
        # so auth is off here; the model API stays off (models come from model_snapshot).
        ("disable_token_authorization", "true"),
        ("enable_model_api", "false"),
        # Models may only come from the model store (TorchServe's default also allows any http(s) URL).
        ("allowed_urls", f"file://{KSERVE_MODEL_STORE}/.*"),
    ]
)


# Every key TorchServe 0.12's ConfigManager reads (from its own constants).
KNOWN_KEYS = frozenset(
    """allowed_urls async_logging blacklist_env_vars certificate_file cors_allowed_headers cors_allowed_methods
    cors_allowed_origin cpp_log_config cpu_launcher_args cpu_launcher_enable decode_input_request
    default_response_timeout default_service_handler default_startup_timeout default_workers_per_model
    disable_system_metrics disable_token_authorization enable_envvars_config enable_grpc_ssl enable_metrics_api
    enable_model_api grpc_inference_address grpc_inference_port grpc_management_address grpc_management_port
    inference_address initial_distribution_port initial_worker_port install_py_dep_per_model io_ratio ipex_enable
    ipex_gpu_enable job_queue_size keystore keystore_pass keystore_type limit_max_image_pixels load_models
    management_address max_request_size max_response_size metric_time_interval metrics_address metrics_config
    metrics_mode model_metrics_auto_detect model_server_home model_snapshot model_store netty_client_threads
    number_of_gpu number_of_netty_threads plugins_path prefer_direct_buffer private_key_file service_envelope
    system_metrics_cmd token_expiration_min torchelastic_ts ts_header_key_sequence_end ts_header_key_sequence_id
    ts_header_key_sequence_start ts_open_inference_protocol unregister_model_timeout use_env_allowed_urls
    use_native_io vendor workflow_store""".split()
) | {"python", "version", "tsConfigFile"}  # what TorchServe writes in its config snapshots too (python: read)


def check_keys(properties: Dict[str, str], path):
    """Refuse a key TorchServe would silently ignore, naming the nearest valid one."""
    for key in properties:
        if key not in KNOWN_KEYS:
            raise UserError(f"{path}: unknown key '{key}'{did_you_mean(key, KNOWN_KEYS)}")


def archives_in(model_store: Path) -> List[Path]:
    """Model archives in the store (``ts_config.archives_in``: .mar, .tar.gz, unpacked directories)."""
    check_store(model_store)
    return ts_config.archives_in(Path(model_store))


def build_snapshot(model_store: Path, overrides: Optional[Dict[str, int]] = None) -> dict:
    """The model_snapshot of every archive in the store."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    models = OrderedDict()
    for path in archives_in(model_store):
        with opened(path) as archive:
            name, version = archive.model_name, archive.version
            check_carriable(path, name, version)
            entry = {"defaultVersion": True, "marName": path.name, **worker_settings(archive, overrides)}
        if name in models:
            raise UserError(
                f"{path} and {models[name][version_of(models[name])]['marName']} both hold model '{name}': "
                "remove one from the model store"
            )
        models[name] = {version: entry}
    if not models:
        raise UserError(f"model store {model_store} holds no model archives: build one with 'tsctl package'")
    return {"name": "startup.cfg", "modelCount": len(models), "models": models}


FLAGS = {
    "minWorkers": "--min-workers",
    "maxWorkers": "--max-workers",
    "batchSize": "--batch-size",
    "maxBatchDelay": "--max-batch-delay",
    "responseTimeout": "--response-timeout",
}


def worker_settings(archive, overrides: Dict[str, int]) -> Dict[str, int]:
    """An archive's snapshot settings (an Archive): ``overrides`` (config's flags), else its model-config.yaml's,
    else TorchServe's defaults; a minWorkers above the default maxWorkers raises it. Checked as the engine reads
    them (``ts_config.settings_problem``): a UserError naming the archive, the key and where it came from."""
    own = {key: value for key, value in archive.config.items() if key in SNAPSHOT_KEYS}
    archive = archive.path
    problem = ts_config.settings_problem(own)
    if problem:
        raise UserError(f"{archive}'s model-config.yaml: {problem}, and package the archive again")
    given = {**own, **overrides}
    values = {**SNAPSHOT_DEFAULTS, **given}
    if "maxWorkers" not in given:
        values["maxWorkers"] = max(values["maxWorkers"], values["minWorkers"])
    problem = ts_config.settings_problem(values)
    if problem:
        sources = ", ".join(
            f"{key} from {FLAGS[key] if key in overrides else 'its model-config.yaml'}"
            for key in SNAPSHOT_KEYS
            if key in given and key in problem
        )
        raise UserError(f"{archive}: {problem} ({sources})")
    return values


def check_carriable(archive: Path, name: str, version: str):
    """The snapshot is JSON inside a Java properties file that KServe's wrapper also reads with a
    plain split: refuse what either would mangle (backslashes, quotes, '=', non-ASCII, spaces)."""
    for what, value, pattern in (("file name", archive.name, MODEL_NAME), ("model name", name, MODEL_NAME)):
        if not pattern.match(value):
            raise UserError(
                f"{archive}: its {what} {value!r} cannot go into config.properties: "
                "use letters, digits, '_', '-' and '.' (rename the file or package it again)"
            )
    if not VERSION.match(version):
        raise UserError(
            f"{archive}: its modelVersion {version!r} cannot go into config.properties: "
            "package it again with a --version of letters, digits, '.', '_', '+' and '-'"
        )


def version_of(model_entry: dict) -> str:
    return next(iter(model_entry))


CONFIG_HEADER = [
    "# Written by tsctl config. Locally, where the archives' packages are installed:",
    "#   torchserve --start --ncs --model-store model-store --ts-config config/config.properties",
    "# after moving its addresses, KServe's on every interface (0.0.0.0:8085, metrics 0.0.0.0:8082), to the",
    "# loopback (TS_INFERENCE_ADDRESS, TS_MANAGEMENT_ADDRESS, TS_METRICS_ADDRESS: http://127.0.0.1:PORT),",
    "# as 'tsctl serve' does.",
    "# Under KServe (mounted at /mnt/models) as is only when its image has every archive's requirements",
    "# (tsctl config names each archive whose requirements it lacks); else use 'tsctl export kserve'.",
]


def render(properties: Dict[str, str], header: Optional[List[str]] = None) -> str:
    """The file: ``header``'s comment lines (None: tsctl config's, ``CONFIG_HEADER``), then the keys."""
    lines = list(CONFIG_HEADER if header is None else header)
    # key=value with only what Java would misread escaped, not javaproperties' fully escaped form:
    # pytorch/serve's kserve_wrapper reads this file by splitting each line at its first '=', so the
    # snapshot's JSON must stay as it is ('\:' would reach json.loads). tsctl's own values (addresses,
    # /mnt/models paths, the JSON of names check_carriable allows) need no escape and are written as they
    # are; a user's value with a backslash, a line break, a leading blank or a character beyond
    # ISO-8859-1 is escaped, so Java reads back what was read (tests/engine/test_properties_reading.py).
    lines += [f"{java_key(key)}={java_value(value)}" for key, value in properties.items()]
    return "\n".join(lines) + "\n"


def java_value(value: str) -> str:
    """``value`` as java.util.Properties.load reads it back from an ASCII file: backslashes, line breaks, a
    leading blank and characters beyond ASCII escaped; ':' and '=' left as they are (a value may hold them)."""
    return _escaped(value, "", leading=" \t\f")


def java_key(key: str) -> str:
    """``key`` escaped as Java reads keys: also its '=', ':' and blanks, and a leading '#' or '!'."""
    return _escaped(key, "=: \t\f", leading="#!")


def _escaped(text: str, anywhere: str, leading: str) -> str:
    named = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\f": "\\f", "\t": "\\t"}
    out = []
    for i, c in enumerate(text):
        if c in anywhere or (i == 0 and c in leading):
            out.append(named.get(c, "\\" + c))
        elif c in "\\\n\r":
            out.append(named[c])
        elif ord(c) < 128:
            out.append(c)
        else:
            out.append("".join(f"\\u{u:04x}" for u in utf16(c)))
    return "".join(out)


def utf16(c: str) -> List[int]:
    """The UTF-16 code units of one character (two for one beyond the Basic Multilingual Plane)."""
    data = c.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]


def kserve_gaps(model_store, runtime_name: str = DEFAULT_RUNTIME) -> List[str]:
    """One line per archive in the store that would not load on KServe's ``runtime_name`` image from
    this config as is (no per-model install): what its requirements.txt asks for that the image lacks,
    by ``archiver.kserve_images``' list of the image's packages, leaving out what its handler does without
    (``_does_without``). Nothing is resolved or downloaded."""
    runtime = runtime_named(runtime_name)
    gaps = []
    for path in archives_in(Path(model_store)):
        with opened(path) as archive:
            model = archive.model
            name = model.get("requirementsFile")
            text = (archive.read(name, requirements.MAX_BYTES) or b"").decode("utf-8", "replace") if name else ""
            missing = [why for why in (_lacks(line, runtime) for line in text.splitlines()) if why]
            missing = [(line, has) for line, has in missing if not _does_without(archive, model, line)]
        if missing:
            lacks = ", ".join(line for line, _ in missing)
            has = [has for _, has in missing if has]
            gaps.append(
                f"{model['modelName']} needs {lacks}, which KServe's {runtime.name} image lacks"
                + (f" (it has {', '.join(has)})" if has else "")
                + ": for KServe, export with 'tsctl export kserve' (it installs the archive's locked requirements)"
            )
    return gaps


EMBEDDER = "handlers.embeddings.TextEmbedder"


def _does_without(archive, model: dict, line: str) -> bool:
    """True for a requirement the archive's handler loads without: sentence-transformers, for a text
    embedder whose sentence-transformers modules (Transformer, mean/cls/max Pooling, Normalize) it
    computes itself with the same answers. Asked from the directory's JSON files as the handler asks
    when it loads (``handlers.fit.sentence_modules_problem``)."""
    from .requirements import requirement_name

    record = identity.read(archive) or {}
    classes = [f"{record.get('module')}.{record.get('class')}", *record.get("bases", [])]
    if requirement_name(line) != "sentence-transformers" or EMBEDDER not in classes:
        return False
    from handlers.fit import sentence_modules_problem

    prefix = str(model.get("serializedFile") or "").strip("/") + "/"
    with tempfile.TemporaryDirectory(prefix="tsctl-modules-") as directory:
        for name, size in archive.members:
            if name.startswith(prefix) and name.endswith(".json") and size <= MAX_MODULE_JSON:
                target = Path(directory, name[len(prefix) :])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name, MAX_MODULE_JSON) or b"")
        return Path(directory, "modules.json").is_file() and sentence_modules_problem(directory) is None


MAX_MODULE_JSON = 1 << 20


def _lacks(line: str, runtime) -> Optional[Tuple[str, str]]:
    """(the requirement, what the image has of it or "") when ``runtime``'s image does not satisfy
    one requirements.txt line, else None. Options (``--no-index``) need nothing; a line that is no
    plain requirement (a URL, ``-r``, ``-e``) cannot be checked, so it counts as lacking."""
    from packaging.requirements import InvalidRequirement, Requirement  # transformers' and torchserve's dependency
    from packaging.utils import canonicalize_name

    from .requirements import strip

    line = strip(line)  # no comment, no --hash
    if not line:
        return None
    if line.startswith("-") and not line.startswith(("-r", "-e", "--requirement", "--editable")):
        return None  # --no-index, --find-links ...: how to install, not what
    try:
        requirement = Requirement(line)
    except InvalidRequirement:
        return line, ""
    environment = {"python_version": runtime.python, "python_full_version": f"{runtime.python}.0"}
    environment.update(sys_platform="linux", platform_system="Linux", platform_machine="x86_64", os_name="posix")
    if requirement.marker is not None and not requirement.marker.evaluate(environment):
        return None  # not for the image's Python
    pins = {canonicalize_name(package): version for package, version in runtime.pins.items()}
    version = pins.get(canonicalize_name(requirement.name))
    if version is None or requirement.url:
        return line, ""
    if requirement.extras:  # the extras' own packages may be missing: only the install can tell
        return line, f"{requirement.name} {version} without its extras"
    if not requirement.specifier.contains(version, prereleases=True):
        return line, f"{requirement.name} {version}"
    return None


def write_config(
    model_store="model-store",
    output="config/config.properties",
    overrides: Optional[Dict[str, int]] = None,
    extra: Optional[Dict[str, str]] = None,
) -> Path:
    """Write config.properties for every archive in ``model_store``; returns the file written."""
    properties = OrderedDict(BASE_PROPERTIES)
    snapshot = build_snapshot(Path(model_store), overrides)
    store = Path(model_store)
    entries = [entry for versions in snapshot["models"].values() for entry in versions.values()]
    if all(identity.read(store / entry["marName"]) for entry in entries):
        # The worker hands request bodies to the handler unparsed, so the handler's limits
        # (body size, JSON depth and values) apply before any JSON is built in memory. Handlers of
        # your own may expect TorchServe's parsed JSON: then TorchServe's default stays.
        properties["decode_input_request"] = "false"
    properties.update(extra or {})
    properties["model_snapshot"] = json.dumps(snapshot, separators=(",", ":"))
    output = Path(output)
    make_directory(output.parent, "--output")
    if output.is_dir():
        raise UserError(f"--output {output} is a directory: give the config file's path")
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(render(properties), encoding="utf-8")
    tmp.replace(output)
    return output


def check_store(model_store: Path):
    """A one-line UserError unless ``model_store`` is a directory (``ts_config.check_store``)."""
    try:
        ts_config.check_store(model_store)
    except config_properties.ConfigError as exc:
        raise UserError(str(exc)) from None


def read_properties(path) -> Dict[str, str]:
    """A Java .properties file as a dict, read as TorchServe and the tsctl engine read it
    (``serving/config_properties.py``: javaproperties); a UserError naming the file when it cannot be."""
    try:
        return config_properties.read_properties(path)
    except config_properties.ConfigError as exc:
        raise UserError(str(exc)) from None


def config_metrics(config) -> Optional[str]:
    """The ``metrics_config`` of ``config`` (a config.properties; None: none) as TorchServe started in
    the current directory reads it (``metrics_yaml``); None when the config names none."""
    if config is None:
        return None
    given = read_properties(config).get("metrics_config")
    return metrics_yaml(given, f"metrics_config of {config}") if given else None


def metrics_yaml(given: str, where: str) -> str:
    """A metrics.yaml path (``where`` names what gave it) as TorchServe started in the current directory
    reads it, absolute: its frontend resolves a relative ``metrics_config`` against its own working
    directory (``ConfigManager.getMetricsConfigPath``), not against the config's folder. ``tsctl serve``
    (every engine, though each runs its server in ``--home``), ``run``, ``verify`` and ``package
    --golden`` read it so. A file that is not there, or not a YAML mapping, is one UserError."""
    import yaml

    path = Path(given).resolve()
    try:
        if not isinstance(
            yaml.safe_load(config_properties.read_regular(path, config_properties.MAX_METRICS_YAML)), dict
        ):
            raise ValueError("not a YAML mapping")
    except (OSError, ValueError, yaml.YAMLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc).splitlines()[0]
        raise UserError(f"{where} {given} cannot be read as TorchServe's metrics.yaml ({reason})") from None
    return str(path)


def snapshot_of(properties: Dict[str, str], path="config.properties") -> dict:
    try:
        return ts_config.snapshot_of(properties, path)
    except config_properties.ConfigError as exc:
        raise UserError(str(exc)) from None
