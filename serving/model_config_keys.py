"""Every key of TorchServe 0.12's model-config.yaml (``ModelConfig.build``) and what the engine does with it:
``HONOURED`` as TorchServe honours it, ``REFUSED`` at load in one line (the engine cannot give its meaning),
or ``NOTED``: served, with one warning line naming the key and what the engine does instead. The one table
of them: the engine, MLServer and Seldon units (``model_opening.open_model``) apply it, describe shows the
values in force (``described``), and docs/engines.md's table is checked against it
(tests/engine/test_model_config_keys.py).

TorchServe's ``ModelManager.createModel`` (v0.12.0 lines 445-479): an archive with a model-config.yaml
takes its ``responseTimeout`` and ``startupTimeout`` from it, 120 s where it gives none, over the
snapshot's, the register's and ``default_response_timeout`` (``in_force``).
"""

import difflib
from typing import Dict, List, Optional, Tuple

from handlers.settings import shown

HONOURED, NOTED, REFUSED = "honoured", "noted", "refused"
TORCHSERVE_TIMEOUT = 120  # s: ModelConfig's defaultResponseTimeout and defaultStartupTimeout
# TorchServe's defaults for the noted keys, as its describe shows them (ModelConfig's fields)
NOTED_DEFAULTS = {"maxRetryTimeoutInSec": 300, "clientTimeoutInMills": 0, "useJobTicket": False, "useVenv": False}

KEYS: Dict[str, Tuple[str, str]] = {
    "minWorkers": (HONOURED, "the workers started (a snapshot's or a register's first)"),
    "maxWorkers": (HONOURED, "read; workers are scaled only when asked, as on TorchServe"),
    "batchSize": (HONOURED, "the most requests a batch takes"),
    "maxBatchDelay": (HONOURED, "ms a batch waits to fill"),
    "responseTimeout": (HONOURED, "s a batch may take; 120 when the archive's model-config.yaml gives none"),
    "startupTimeout": (HONOURED, "s a worker may take to load; 120 when the model-config.yaml gives none"),
    "deviceType": (HONOURED, "cpu or gpu (serving/gpus.py)"),
    "deviceIds": (HONOURED, "the GPUs its workers take, in turn (serving/gpus.py)"),
    "parallelType": (REFUSED, "one worker over several GPUs (refused by serving/gpus.py, naming both keys)"),
    "parallelLevel": (REFUSED, "with parallelType (refused by serving/gpus.py)"),
    "torchrun": (REFUSED, "workers under torchrun (refused by serving/gpus.py)"),
    "jobQueueSize": (HONOURED, "the model's job queue, over job_queue_size"),
    "useJobTicket": (NOTED, "requests wait in the job queue when every worker is busy, not refused at once"),
    "maxRetryTimeoutInSec": (
        NOTED,
        "a dead worker is started again for as long as the engine runs (TorchServe gives up after this long)",
    ),
    "clientTimeoutInMills": (
        NOTED,
        "a request waits in the queue until a worker takes it or its client leaves "
        "(TorchServe drops it after this long)",
    ),
    "sequenceBatching": (HONOURED, "sequence batching (serving/engine/sequences.py)"),
    "sequenceMaxIdleMSec": (HONOURED, "an idle sequence expires"),
    "sequenceTimeoutMSec": (HONOURED, "a sequence expires this long after it opened"),
    "maxSequenceJobQueueSize": (HONOURED, "requests waiting in one sequence"),
    "maxNumSequence": (HONOURED, "open sequences"),
    "continuousBatching": (HONOURED, "requests join a running batch between its steps (serving/engine/continuous.py)"),
    "asyncCommunication": (REFUSED, "an asynchronous worker (ts/async_service.py): serve it with --engine torchserve"),
    "useVenv": (NOTED, "the worker runs in the engine's Python: install the archive's requirements there"),
}


# Each key's type as TorchServe's ModelConfig.build reads it (a value of another type it ignores with a
# log line only, and serves its default: the engine, ``tsctl run`` and ``tsctl package`` refuse it, ``typed``).
TYPES = {
    "minWorkers": int,
    "maxWorkers": int,
    "batchSize": int,
    "maxBatchDelay": int,
    "responseTimeout": int,
    "startupTimeout": int,
    "deviceType": str,
    "deviceIds": list,
    "parallelLevel": int,
    "parallelType": str,
    "jobQueueSize": int,
    "useJobTicket": bool,
    "maxSequenceJobQueueSize": int,
    "sequenceMaxIdleMSec": int,
    "maxNumSequence": int,
    "sequenceBatching": bool,
    "continuousBatching": bool,
    "asyncCommunication": bool,
    "useVenv": bool,
    "torchrun": dict,
    "maxRetryTimeoutInSec": int,
    "clientTimeoutInMills": int,
    "sequenceTimeoutMSec": int,
}


class ModelConfigRefused(ValueError):
    """A key the engine cannot honour: one line naming it and the fix."""


def typed(config: dict, where: str):
    """ModelConfigRefused naming the first key of TorchServe's whose value has another type, or is negative."""
    for key, value in config.items():
        expected = TYPES.get(key)
        if expected is None:
            continue
        if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ModelConfigRefused(f"{where}: '{key}' must be a whole number, got {shown(value)}")
        if expected is not int and not isinstance(value, expected):
            raise ModelConfigRefused(f"{where}: '{key}' must be a {expected.__name__}, got {shown(value)}")
        if expected is int and value < 0:
            raise ModelConfigRefused(f"{where}: '{key}' must not be negative, got {value}")


def near_miss(key: str) -> Optional[str]:
    """The TorchServe key ``key`` is a typo of (the same letters in another case or snake_case:
    ``batch_size``; or one or two letters off: ``maxWorker``), or None."""
    folded = key.lower().replace("_", "").replace("-", "")
    for known in TYPES:
        if folded == known.lower():
            return known
    close = difflib.get_close_matches(key, list(TYPES), n=1, cutoff=0.85)
    return close[0] if close else None


REFUSED_ELSEWHERE = ("parallelType", "parallelLevel", "torchrun")  # serving/gpus.model_devices refuses them


def asked(config: dict, key: str) -> bool:
    """Whether the model-config.yaml sets ``key`` to something other than TorchServe's default."""
    return key in config and config[key] not in (None, False, 0, NOTED_DEFAULTS.get(key))


def check(config: dict, where: str) -> List[str]:
    """The notes (one line each) for the noted keys the model-config.yaml sets, a key that is a near miss of
    one of TorchServe's, and a maxNumSequence above the engine's bound; ModelConfigRefused for a refused
    key or one of another type (``typed``)."""
    from .engine.sequences import MAX_SEQUENCES

    typed(config, where)
    meant = {key: near_miss(str(key)) for key in config if key not in TYPES}
    notes = [
        f"{where}: unknown key '{key}'; did you mean '{known}'? (TorchServe ignores '{key}')"
        for key, known in meant.items()
        if known
    ]
    if (config.get("maxNumSequence") or 0) > MAX_SEQUENCES:
        notes.append(
            f"{where}: maxNumSequence {config['maxNumSequence']} is above the engine's bound: "
            f"{MAX_SEQUENCES} sequences open at most (docs/limits.md)"
        )
    for key, (state, what) in KEYS.items():
        if not asked(config, key) or state == HONOURED or key in REFUSED_ELSEWHERE:
            continue
        if state == REFUSED:
            raise ModelConfigRefused(
                f"{where}: {key} is {config[key]!r}: the tsctl engine cannot serve {what}, or remove {key}"
            )
        notes.append(f"{where}: {key}: {config[key]!r} is not done by the tsctl engine: {what}")
    return notes


def in_force(config: dict, response_timeout: int, default_startup: int) -> Tuple[int, int]:
    """(responseTimeout, startupTimeout) as TorchServe's createModel sets them: an archive with a
    model-config.yaml its values, 120 where it gives none; else ``response_timeout`` (the snapshot's, the
    register's) and ``default_startup`` (``default_startup_timeout``)."""
    if not config:
        return response_timeout, default_startup
    response = config.get("responseTimeout") if (config.get("responseTimeout") or 0) > 0 else TORCHSERVE_TIMEOUT
    startup = config.get("startupTimeout") if (config.get("startupTimeout") or 0) > 0 else TORCHSERVE_TIMEOUT
    return response, startup


def described() -> dict:
    """Describe's fields for the noted keys: what the engine does, TorchServe's default, whatever the
    model-config.yaml says (a note at load says so)."""
    return dict(NOTED_DEFAULTS)
