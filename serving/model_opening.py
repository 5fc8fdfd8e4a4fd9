"""One model version made ready to start (``open_model``): its archive opened once, unpacked and checked,
its workers' environment made as TorchServe's frontend makes it, and the devices they run on (serving/gpus.py:
the model-config.yaml's ``deviceType``/``deviceIds``, each worker's GPU from the server's ``Placement``).
The engine (``versions.ModelVersions.open``), MLServer's runtime and Seldon Core 1's model unit open
their archives here."""

import logging
import os
from pathlib import Path
from typing import Optional

from handlers import cpu_limit, identity
from handlers.archives import Archive, opened

from . import gpus, model_config_keys, v2_metadata
from .config_properties import ConfigError
from .engine.sequences import SequenceConfigError, SequenceSettings
from .engine.worker_runner import worker_log_line
from .engine.workers import ModelWorkers
from .frontend_settings import Frontend
from .ts_config import ModelSpec

logger = logging.getLogger("tsctl.engine")


def open_model(
    spec: ModelSpec,
    frontend: Frontend,
    unpack_dir: str,
    first_port: int,
    decode_default=None,
    on_line=None,
    on_metric=None,
    archive: Optional[Archive] = None,
    placement: Optional[gpus.Placement] = None,
) -> ModelWorkers:
    """One model version ready to start: its archive (``archive``, opened already, else ``spec.archive``
    opened here, within ``spec.store`` when it is a model store's) unpacked into ``unpack_dir`` (an
    unpacked directory is served where it is, as TorchServe serves it, unless it is a model store's: then
    it is copied there, links followed only inside the store: ``Archive.model_dir``) and checked (the
    signature first when ``frontend.public_key`` asks, before any of its code can run), its workers'
    environment made as TorchServe's frontend makes it, their devices read from its model-config.yaml
    (``gpus.model_devices``: a PlacementError for settings tsctl cannot honour; a note logged for one it
    ignores, as TorchServe does) and each worker's GPU taken from ``placement`` (the server's; None: one
    of this model's own). ``decode_default(archive)``: whether its requests are decoded (None: the
    config's ``decode_input_request``); ``on_line(worker, line)`` gets the lines a worker prints (default:
    the ``tsctl.worker`` log), ``on_metric(worker, line)`` those of its metrics logger (default: logged as
    the others)."""
    from handlers import signing

    with opened(archive or spec.archive, within=spec.store) as found:
        model_dir = found.model_dir(unpack_dir)
        if frontend.public_key:  # before any of the archive's code can run; signed as the snapshot's name and version
            signing.verify(model_dir, frontend.public_key, spec.archive.name, spec.name, spec.version)
        model = found.model
        if model["modelName"] != spec.name:
            logger.info("%s: served as %s (its manifest says %s)", spec.archive, spec.name, model["modelName"])
        decode = frontend.decode_input_request if decode_default is None else decode_default(found)
        where = f"{spec.archive.name}'s model-config.yaml"
        try:
            notes = model_config_keys.check(found.config, where)  # first: each key's type
            devices = gpus.model_devices(found.config, frontend.number_of_gpu, where)
            sequences = SequenceSettings.of(found.config, where)
            metadata = v2_metadata.declared(found.config, identity.read(found), where)
        except (
            gpus.PlacementError,
            SequenceConfigError,
            model_config_keys.ModelConfigRefused,
            v2_metadata.MetadataError,
        ) as exc:
            raise ConfigError(str(exc)) from None
        spec.response_timeout, spec.startup_timeout = model_config_keys.in_force(
            found.config, spec.response_timeout, frontend.default_startup_timeout
        )
        if (found.config.get("jobQueueSize") or 0) > 0:  # TorchServe's Model: over job_queue_size
            spec.job_queue_size = found.config["jobQueueSize"]
        spec.continuous_batching = found.config.get("continuousBatching") is True
    for note in notes:
        logger.warning("%s", note)
    for note in devices.notes:
        logger.warning("%s", note)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(model_dir), os.environ.get("PYTHONPATH")) if p)
    env["TS_DECODE_INPUT_REQUEST"] = "true" if decode else "false"
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_limit.usable() // max(1, spec.min_workers))))
    run_dir = str(Path(unpack_dir).parent)
    workers = ModelWorkers(
        spec,
        model_dir,
        model["handler"],
        frontend,
        run_dir,
        first_port,
        env,
        on_line or worker_log_line,
        on_metric,
        devices,
        placement or gpus.Placement(frontend.number_of_gpu),
        sequences,
    )
    workers.v2_metadata = metadata
    return workers
