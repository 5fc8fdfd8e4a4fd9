"""The ``handler:`` section of a MAR's model-config.yaml: each toolkit handler's settings, and their check.

Each toolkit handler's settings are a dataclass with defaults, all of them here (``Settings``, which
every handler accepts, and one subclass per handler); ``read_settings`` turns the YAML mapping into an
instance or raises ``SettingsError`` with one sentence naming the key and the fix. This module imports
no torch: ``tsctl package`` checks a model-config.yaml with it without loading the handler.
"""

import dataclasses
import difflib
import reprlib
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple, Type, TypeVar, get_args, get_origin, get_type_hints

from . import golden
from .limits import Limits

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


def shown(value: Any) -> str:
    """A value for an error message, bounded: a YAML alias bomb's repr would take gigabytes."""
    return _SHORT.repr(value)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother = 2, 4, 4, 60, 60


def did_you_mean(key: str, valid, what: str = "valid keys") -> str:
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; {what}: " + ", ".join(sorted(valid))


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
            raise SettingsError(f"{label} must be a list, got {shown(value)}")
        return tuple(_check_type(v, inner, label + " item") for v in value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise SettingsError(f"{label} must be true or false, got {shown(value)}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise SettingsError(f"{label} must be a whole number, got {shown(value)}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise SettingsError(f"{label} must be a number, got {shown(value)}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise SettingsError(f"{label} must be a string, got {shown(value)}")
    return value


# ---- each handler's settings ----------------------------------------------------------------------
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Raster formats of photos and screenshots. Others that PIL reads are left out by default: EPS runs
# Ghostscript, and rare decoders are where malformed files find bugs (a DDS raised NotImplementedError).
SAFE_FORMATS = ("BMP", "GIF", "ICO", "JPEG", "PNG", "PPM", "TGA", "TIFF", "WEBP")
PADDINGS = ("longest", "max_length")
FUNCTIONS = ("auto", "softmax", "sigmoid", "none")  # text classification: transformers' function_to_apply
AGGREGATIONS = ("none", "simple", "first", "average", "max")  # token classification: aggregation_strategy
POOLINGS = ("mean", "cls", "max")  # embeddings of plain Hugging Face directories
MAX_TORCH_THREADS = 1024  # more overflows torch's thread count or exhausts memory making them


@dataclass
class Settings:
    """Settings every toolkit handler accepts (model-config.yaml, under ``handler:``)."""

    allow_pickle: bool = False  # let torch.load unpickle whole models (runs code from the MAR)
    max_items: int = 0  # inputs per request; 0: 4 x the model's batchSize, at least 16
    max_body_bytes: int = Limits.max_body_bytes  # a request body above this is refused before it is parsed
    max_json_depth: int = Limits.max_json_depth  # nesting of a JSON body
    max_json_values: int = Limits.max_json_values  # values in a JSON body (list items and object members)
    max_batch_bytes: int = Limits.max_batch_bytes  # memory a batch's requests may take once read (estimated before)
    batch_budget: float = 4.0  # a batch holds at most this many requests' worth of each per-request limit
    decode_threads: int = 1  # decode a batch's inputs in this many threads
    torch_threads: int = 0  # intra-op threads per worker; 0: OMP_NUM_THREADS, else the cores / minWorkers
    verify_on_start: bool = False  # replay MAR-INF/golden.json at start; refuse to start if an answer drifted
    verify_atol: float = golden.DEFAULT_ATOL  # how far a golden number may move (verify_on_start); at least precision's
    precision: str = "fp32"  # the model's weights and inputs: fp32, or fp16/bf16 (faster on GPUs, answers move more)

    def check(self):
        if self.precision not in golden.PRECISION_ATOL:
            return f"'handler.precision' is {self.precision!r}: give one of {', '.join(golden.PRECISION_ATOL)}"
        if not 0 <= self.torch_threads <= MAX_TORCH_THREADS:
            return f"'handler.torch_threads' must be 0 (the cores / minWorkers) to {MAX_TORCH_THREADS}"
        for key in ("max_body_bytes", "max_json_depth", "max_json_values", "max_batch_bytes", "decode_threads"):
            if getattr(self, key) < 1:
                return f"'handler.{key}' must be at least 1"
        if self.batch_budget < 1:
            return "'handler.batch_budget' must be at least 1 (one request's worth of each limit)"
        if self.max_items < 0:
            return "'handler.max_items' must be 0 (4 x batchSize) or more"
        return None


@dataclass
class ImageSettings(Settings):
    resize: int = 256
    crop: int = 224
    mean: Tuple[float, ...] = IMAGENET_MEAN
    std: Tuple[float, ...] = IMAGENET_STD
    top_k: int = 5
    labels: str = "index_to_name.json"
    max_pixels: int = 89_478_485  # PIL's own decompression-bomb limit
    max_request_pixels: int = 2 * 89_478_485
    max_aspect_ratio: float = 50.0
    formats: Optional[Tuple[str, ...]] = SAFE_FORMATS
    jpeg_draft: bool = False
    decode_threads: int = 2
    channels_last: bool = True
    optimize: bool = True
    gpu_decode: bool = True  # on a GPU: a batch's JPEGs decoded, resized and cropped there (other formats: PIL)

    def check(self):
        if len(self.mean) != 3 or len(self.std) != 3:
            return "'handler.mean' and 'handler.std' must each hold 3 numbers (R, G, B)"
        if any(s <= 0 for s in self.std):
            return "'handler.std' values must be positive"
        for key in ("resize", "crop", "top_k", "max_pixels", "max_request_pixels", "max_aspect_ratio"):
            if getattr(self, key) < 1:
                return f"'handler.{key}' must be at least 1"
        if self.crop > self.resize:
            return f"'handler.crop' ({self.crop}) must not be larger than 'handler.resize' ({self.resize})"
        if self.formats is not None:
            from PIL import Image  # only here: packaging checks formats without loading the handler

            Image.init()
            unknown = [f for f in self.formats if f.upper() not in Image.OPEN]
            if unknown:
                known = ", ".join(sorted(Image.OPEN))
                return f"'handler.formats' names {', '.join(unknown)}, which PIL cannot read; it reads {known}"
        return super().check()


@dataclass
class TensorSettings(Settings):
    input_shape: Optional[Tuple[int, ...]] = None
    max_body_bytes: int = 64 << 20  # a transformer sends a whole batch of image tensors as JSON
    max_json_values: int = 1 << 24


@dataclass
class TextSettings(Settings):
    max_length: Optional[int] = None  # default: max_seq_length of the model's files, else the tokenizer's, at most 512
    padding: str = "longest"  # max_length: pad every text to max_length (only to compare; it is slower)
    max_text_chars: int = 100_000  # a longer text is refused with 413 (the tokenizer reads all of it)

    def check(self):
        if self.max_length is not None and self.max_length < 2:
            return "'handler.max_length' must be at least 2 tokens"
        if self.padding not in PADDINGS:
            return f"'handler.padding' must be one of {', '.join(PADDINGS)}, got {self.padding!r}"
        if self.max_text_chars < 1:
            return "'handler.max_text_chars' must be at least 1"
        return super().check()


@dataclass
class ClassifierSettings(TextSettings):
    top_k: int = 5
    function: str = "auto"

    def check(self):
        if self.function not in FUNCTIONS:
            return f"'handler.function' must be one of {', '.join(FUNCTIONS)}, got {self.function!r}"
        if self.top_k < 0:
            return "'handler.top_k' must be 0 (every label) or more"
        return super().check()


@dataclass
class TokenSettings(TextSettings):
    aggregation: str = "average"
    ignore_labels: Tuple[str, ...] = ("O",)
    stride: Optional[int] = None  # None: a long text is truncated to max_length tokens

    def check(self):
        if self.aggregation not in AGGREGATIONS:
            return f"'handler.aggregation' must be one of {', '.join(AGGREGATIONS)}, got {self.aggregation!r}"
        if self.stride is not None and self.stride < 0:
            return "'handler.stride' must be 0 or more tokens (or null: truncate long texts)"
        if self.stride is not None and self.aggregation == "none":
            return "'handler.stride' needs an aggregation other than none (the pipeline refuses it too)"
        return super().check()


@dataclass
class EmbedderSettings(TextSettings):
    pooling: Optional[str] = None
    normalize: Optional[bool] = None

    def check(self):
        if self.pooling is not None and self.pooling not in POOLINGS:
            return f"'handler.pooling' must be one of {', '.join(POOLINGS)}, got {self.pooling!r}"
        return super().check()
