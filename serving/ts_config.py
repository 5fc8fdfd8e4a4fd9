"""The models a TorchServe config and its model store serve, as TorchServe starts them: the one reading both
engines serve from.

``models`` turns config.properties (read by config_properties.py) and the model store into one ``ModelSpec``
per model version: its archive, whether it is the default version, and the model_snapshot's worker settings
(minWorkers, maxWorkers, batchSize, maxBatchDelay, responseTimeout), TorchServe's defaults where a key is
missing; and the frontend's settings (frontend_settings.py). Without a config file, every archive in the
store is served with its own model-config.yaml settings, as ``torchserve --models all`` would; the engine
leaves out, with a note naming it, one that cannot be read as a model archive and serves the rest, as
TorchServe does not stop for it. ``settings_problem`` is the one check of the worker settings.

No torch, no archiver: the engine (serving/engine/) and ``tsctl`` (archiver/properties.py) read the same
store through this module.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set

from handlers.archives import ArchiveError, ArchiveLike, opened

from . import gpus
from .config_properties import ConfigError, read_properties, with_environment
from .frontend_settings import Frontend, frontend_of
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


def snapshot_archives(snapshot: dict) -> Set[str]:
    """The marName of every version a model_snapshot (``snapshot_of``) names, whatever else its entries hold."""
    return {
        entry.get("marName")
        for versions in snapshot["models"].values()
        if isinstance(versions, dict)
        for entry in versions.values()
        if isinstance(entry, dict)
    }


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
        entries = [
            (name.strip() or None, url.strip()) if sep else (None, name.strip())
            for name, sep, url in (entry.partition("=") for entry in value.split(","))
        ]
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
        raise ConfigError(
            f"{config}: {why} (and enable_model_api is off): give load_models=all, or regenerate "
            "the file with 'tsctl config'"
        )
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
        raise ConfigError(
            f"{config}: model_snapshot names {mar_name!r} for model {name!r}, which is not in "
            f"{model_store}{why}, the model store given (--model-store): give the store the config was "
            f"written for, or run 'tsctl config --model-store {model_store}' for a config of this "
            "store"
        ) from None


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


def _from_archive(
    archive: ArchiveLike, frontend: Frontend, workers: Optional[int] = None, store: Optional[Path] = None
) -> ModelSpec:
    """TorchServe registering an archive with no snapshot: model-config.yaml's settings, else defaults
    (``workers``: the workers without a model-config.yaml minWorkers, else ``default_workers``); an archive
    of a model ``store`` is opened within it (what was opened must lie inside it, links resolved)."""
    with opened(archive, within=store) as found:
        spec = from_model_config(found.model_name, found.version, found.path, found.config, frontend, workers)
        spec.store = found.within
        return spec


def from_model_config(
    name: str, version: str, archive: Path, config: dict, frontend: Frontend, workers: Optional[int] = None
) -> ModelSpec:
    """The spec of an archive already read: its model-config.yaml's (``config``) worker settings, checked, else
    defaults, as ``_from_archive`` gives them."""
    problem = settings_problem(config)
    if problem:
        raise ConfigError(f"{archive}'s model-config.yaml: {problem}, and package the archive again")
    workers = config.get("minWorkers", workers or max(1, frontend.default_workers))
    return ModelSpec(
        name=name,
        version=version,
        archive=archive,
        loaded_at_startup=True,
        min_workers=workers,
        max_workers=max(workers, config.get("maxWorkers", workers)),  # only a default minWorkers can be above it
        batch_size=config.get("batchSize", 1),
        max_batch_delay=config.get("maxBatchDelay", 100),
        response_timeout=config.get("responseTimeout", frontend.default_response_timeout),
    )


def default_config(model_store: Path) -> Optional[Path]:
    """``config/config.properties`` beside the store (the PVC tree tsctl writes), when there is one."""
    candidate = Path(model_store).resolve().parent / "config" / "config.properties"
    return candidate if candidate.is_file() and os.access(candidate, os.R_OK) else None
