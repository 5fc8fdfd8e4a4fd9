"""The ``handler:`` section of a MAR's model-config.yaml, validated against a handler's settings class.

Each toolkit handler declares its settings as a dataclass with defaults; ``read_settings`` turns the
YAML mapping into an instance or raises ``SettingsError`` with one sentence naming the key and the fix.
"""

import dataclasses
import difflib
from typing import Any, Mapping, Optional, Tuple, Type, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")


class SettingsError(ValueError):
    """A wrong key or value in model-config.yaml's ``handler:`` section."""


def read_settings(cls: Type[T], section: Optional[Mapping[str, Any]], where: str = "model-config.yaml") -> T:
    """Validate ``section`` (the ``handler:`` mapping, or None) against dataclass ``cls``."""
    if section is None:
        return cls()
    if not isinstance(section, Mapping):
        raise SettingsError(f"{where}: 'handler' must be a mapping of settings, got {type(section).__name__}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in section.items():
        if key not in names:
            raise SettingsError(f"{where}: unknown key 'handler.{key}'{did_you_mean(str(key), names)}")
        values[key] = _check_type(value, hints[key], f"{where}: 'handler.{key}'")
    settings = cls(**values)
    check = getattr(settings, "check", None)
    if check is not None:
        problem = check()
        if problem:
            raise SettingsError(f"{where}: {problem}")
    return settings


def did_you_mean(key: str, valid) -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return "; valid keys: " + ", ".join(sorted(valid))


def _check_type(value: Any, hint: Any, label: str) -> Any:
    origin = get_origin(hint)
    if origin is None and hint is type(None):
        if value is None:
            return None
    if origin is not None and type(None) in get_args(hint):  # Optional[X]
        if value is None:
            return None
        inner = [a for a in get_args(hint) if a is not type(None)][0]
        return _check_type(value, inner, label)
    if origin in (tuple, Tuple):
        inner, *_ = get_args(hint) or (float,)
        if not isinstance(value, (list, tuple)):
            raise SettingsError(f"{label} must be a list, got {value!r}")
        return tuple(_check_type(v, inner, label + " item") for v in value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise SettingsError(f"{label} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise SettingsError(f"{label} must be a whole number, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise SettingsError(f"{label} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise SettingsError(f"{label} must be a string, got {value!r}")
    return value
