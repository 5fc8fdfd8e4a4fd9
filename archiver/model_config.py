"""Checking a model-config.yaml before it goes into a .mar.

TorchServe reads the top-level worker keys (minWorkers, batchSize, ...: every key of 0.12's
``ModelConfig.build``, with its type) and hands the whole mapping to the handler as
``context.model_yaml_config``; the toolkit handlers read their ``handler:`` section
(handlers/settings.py). What else a file holds is its handler's business: a mapping under any name
(``pt2``, ``pippy``, ``dali``, a section of your own) passes through, and so does a value under a
name of your own, unless the name is a near miss of one of TorchServe's keys (``batchsize``,
``BatchSize``): TorchServe would ignore it without a word, so it is refused with the key meant.
"""

import difflib
from pathlib import Path
from typing import Optional

from handlers.metadata import ArchiveError, bounded_yaml
from handlers.settings import SettingsError, read_settings, shown
from serving import ts_config, v2_metadata
from serving.engine_sequences import SequenceConfigError, SequenceSettings

from .errors import UserError

# Keys TorchServe 0.12 reads from model-config.yaml, with the type it expects.
WORKER_KEYS = {
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


def load_model_config(path: Path) -> dict:
    return parse_model_config(Path(path).read_bytes(), str(path), "fix the syntax")


def parse_model_config(text: bytes, where: str, fix: str) -> dict:
    """A model-config.yaml given to ``tsctl package`` (an archive's is ``Archive.config``) as a mapping
    ({} when empty); UserError naming ``where`` otherwise. Read within bounds (``metadata.bounded_yaml``:
    an alias bomb is refused before it is built)."""
    try:
        data = bounded_yaml(text, where, fix)
    except ArchiveError as exc:
        raise UserError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{where} must be a YAML mapping of keys (minWorkers, batchSize, handler, ...)")
    return data


def check_model_config(path: Path, settings_class=None, text: Optional[bytes] = None) -> dict:
    """Load (or parse ``text``, read from ``path``) and validate; raise UserError naming the file, the key
    and the fix."""
    data = load_model_config(path) if text is None else parse_model_config(text, str(path), "fix the syntax")
    for key, value in data.items():
        expected = WORKER_KEYS.get(key)
        if expected is None:
            meant = near_miss(str(key))
            if meant:
                raise UserError(f"{path}: unknown key '{key}'; did you mean '{meant}'? (TorchServe ignores '{key}')")
            continue  # a section or value of the handler's own
        if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise UserError(f"{path}: '{key}' must be a whole number, got {shown(value)}")
        if expected is not int and not isinstance(value, expected):
            raise UserError(f"{path}: '{key}' must be a {expected.__name__}, got {shown(value)}")
        if expected is int and value < 0:
            raise UserError(f"{path}: '{key}' must not be negative, got {value}")
    problem = ts_config.settings_problem(data)  # the worker settings, as tsctl config and the engine check them
    if problem:
        raise UserError(f"{path}: {problem}")
    try:
        SequenceSettings.of(data, str(path))  # as the engine reads them at load
        if v2_metadata.SECTION in data:
            v2_metadata.check(data[v2_metadata.SECTION], str(path))
    except (SequenceConfigError, v2_metadata.MetadataError) as exc:
        raise UserError(str(exc)) from None
    if settings_class is not None:
        try:
            read_settings(settings_class, data.get("handler"), where=str(path))
        except SettingsError as exc:
            raise UserError(str(exc)) from None
    return data


def near_miss(key: str) -> Optional[str]:
    """The TorchServe key ``key`` is a typo of (the same letters in another case or snake_case:
    ``batch_size``; or one or two letters off: ``maxWorker``), or None."""
    folded = key.lower().replace("_", "").replace("-", "")
    for known in WORKER_KEYS:
        if folded == known.lower():
            return known
    close = difflib.get_close_matches(key, list(WORKER_KEYS), n=1, cutoff=0.85)
    return close[0] if close else None
