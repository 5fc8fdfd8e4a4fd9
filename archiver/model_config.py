"""Checking a model-config.yaml before it goes into a .mar.

TorchServe reads the top-level worker keys (minWorkers, batchSize, ...: every key of 0.12's
``ModelConfig.build``, with its type) and hands the whole mapping to the handler as
``context.model_yaml_config``; the toolkit handlers read their ``handler:`` section
(handlers/settings.py). What else a file holds is its handler's business: a mapping under any name
(``pt2``, ``pippy``, ``dali``, a section of your own) passes through, and so does a value under a
name of your own, unless the name is a near miss of one of TorchServe's keys (``batchsize``,
``BatchSize``): TorchServe would ignore it without a word, so it is refused with the key meant.
"""

from pathlib import Path
from typing import Optional

from handlers.metadata import ArchiveError, bounded_yaml
from handlers.settings import SettingsError, read_settings
from serving import model_config_keys, ts_config, v2_metadata
from serving.engine.sequences import SequenceConfigError, SequenceSettings

from .errors import UserError

WORKER_KEYS = model_config_keys.TYPES  # the keys TorchServe 0.12 reads from model-config.yaml, with their types


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
    for key in data:
        meant = None if key in WORKER_KEYS else model_config_keys.near_miss(str(key))
        if meant:
            raise UserError(f"{path}: unknown key '{key}'; did you mean '{meant}'? (TorchServe ignores '{key}')")
    try:
        model_config_keys.typed(data, str(path))
    except model_config_keys.ModelConfigRefused as exc:
        raise UserError(str(exc)) from None
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
