"""The toolkit's handlers, one entry each: what every part of tsctl knows about them, without importing them.

Every handler module imports torch (and torchvision or transformers), seconds of a command that
only writes a zip. So what the rest of tsctl needs of a toolkit handler is written here once, as data:

- ``tsctl package`` (archiver/mar.py) resolves ``--handler NAME`` to the entry point written into
  MANIFEST.json (``Handler.entry_point``), records the handler class's ``Declared`` in
  MAR-INF/tsctl.json (identity.py), validates the ``handler:`` settings against its settings class
  (settings.py, no torch) and merges what it must install (``Declared.requirements_for``);
- fit.py checks the model's files against what the handler takes (``Handler.model``, ``Handler.head``);
- ``tsctl init --from NAME`` (archiver/scaffold.py) starts a handler of one's own from ``STARTS``, and
  ``python -m archiver.scaffold`` writes each start's settings table (archiver/templates/settings.json);
- the CLI's help texts name ``HANDLERS`` and ``STARTS``.

A handler class declares the same facts as class attributes (``input_kind``, ``splits``, ``Settings``,
``requirements``...); ``declared_by`` reads them from a class, a user's ``--handler`` file's class
included, and tests/cli/test_cli_startup.py checks each entry against ``declared_by`` its real class.
This module imports nothing of the toolkit at import time: ``tsctl --help`` reads it.
"""

import enum
import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

# What an archive's requirements.txt asks for: ranges, never this machine's versions.
# Every transformers these handlers are tested on: from torchserve-kfs:0.9.0's 4.34 (Python 3.9) to 5.x.
TRANSFORMERS = "transformers>=4.34,<6"
# 3.0.1 is the newest that installs beside torchserve-kfs:0.9.0's transformers 4.34 on Python 3.9
# (3.1 needs transformers 4.38); 5.1.2 beside torchserve-kfs:0.12.0's 4.44.
SENTENCE_TRANSFORMERS = "sentence-transformers>=3,<7"
ONNX_RUNTIME = "onnxruntime>=1.16"
ONNX_FILE = "model.onnx"  # an ONNX model in a Hugging Face directory

INPUTS = ("image", "text", "tensor", "any")  # what a request holds (MAR-INF/tsctl.json's "input")


class ModelFiles(enum.Enum):
    """What a handler's ``--serialized-file`` is (fit.py checks it before anything is written)."""

    PRETRAINED_DIRECTORY = "the directory save_pretrained wrote"
    WEIGHTS_FILE = "one weights file (TorchScript, a state_dict with --model-file, .pt2, .safetensors, .onnx)"


@dataclass(frozen=True)
class Declared:
    """What a handler class declares, as packaging reads it: the names recorded in MAR-INF/tsctl.json,
    what a request holds, whether it splits into a KServe transformer, its settings class and what the
    archive must install."""

    class_name: str  # the handler class's __qualname__
    bases: Tuple[str, ...]  # its toolkit base classes, "module.Qualname", nearest first
    input: str  # what a request holds: one of INPUTS
    splits: bool  # its pre/post can run apart from the model, as a KServe transformer
    settings: type  # its model-config.yaml ``handler:`` settings (a dataclass of settings.py)
    requirements: Tuple[str, ...] = ()  # what requirements.txt always asks for
    # (file, requirement): asked for too when the model directory holds that file
    requirements_if_present: Tuple[Tuple[str, str], ...] = ()
    loads_own_model: bool = False  # a subclass that overrides load_model: its weights are its own business
    v2: dict = field(default_factory=lambda: bytes_in_out())  # its KServe v2 model metadata (inputs, outputs)

    def requirements_for(self, serialized: Optional[str]) -> Tuple[str, ...]:
        """What an archive of ``serialized`` (the --serialized-file) needs installed: ``requirements``,
        those of ``requirements_if_present`` whose file the model directory holds, and ONNX Runtime
        for an ONNX model (``model.onnx``, or a directory holding one)."""
        needed = tuple(self.requirements)
        if serialized and os.path.isdir(serialized):
            needed += tuple(
                r for name, r in self.requirements_if_present if os.path.isfile(os.path.join(serialized, name))
            )
        if serialized and (str(serialized).endswith(".onnx") or os.path.isfile(os.path.join(serialized, ONNX_FILE))):
            needed += (ONNX_RUNTIME,)
        return needed


def bytes_in_out(output: str = "output-0") -> dict:
    """KServe v2 model metadata of a handler taking and answering BYTES (ToolkitHandler.v2_metadata's default)."""
    return {
        "inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": output, "datatype": "BYTES", "shape": [-1]}],
    }


def declared_by(handler_class) -> Declared:
    """What a handler class (a ToolkitHandler subclass) declares."""
    toolkit = [c for c in handler_class.__mro__[1:] if c.__module__.startswith("handlers.")]
    own = [c for c in handler_class.__mro__ if not c.__module__.startswith("handlers.")]
    return Declared(
        class_name=handler_class.__qualname__,
        bases=tuple(f"{c.__module__}.{c.__qualname__}" for c in toolkit),
        input=handler_class.input_kind,
        splits=bool(handler_class.splits),
        settings=handler_class.Settings,
        requirements=tuple(handler_class.requirements),
        requirements_if_present=tuple(handler_class.requirements_if_present),
        loads_own_model=any("load_model" in vars(c) for c in own),
        v2=handler_class.v2_metadata,
    )


@dataclass(frozen=True)
class Start:
    """What ``tsctl init --from NAME`` subclasses, and how the commands it prints next look for it."""

    module: str  # the toolkit module
    class_name: str  # the toolkit class the handler subclasses
    settings: str  # its Settings class (in handlers.settings, which ``module`` imports it from)
    input: str  # what MAR-INF/tsctl.json records (one of INPUTS)
    weights: str  # tsctl package's flags for the model's files
    weights_are: str  # what those files are
    predict: str  # an input file for tsctl predict
    make_input: str = ""  # a command writing it first


@dataclass(frozen=True)
class Handler:
    """One toolkit handler: ``--handler NAME`` and ``--from NAME``."""

    name: str  # what tsctl package --handler and tsctl init --from take
    task: str  # what it does, in a few words (help texts)
    module: str  # the toolkit module defining it; its ``handle`` is the entry point
    class_name: str  # the handler class in ``module``
    bases: Tuple[str, ...]  # its toolkit base classes, nearest first
    input: str  # what a request holds: one of INPUTS
    splits: bool  # its pre/post can run apart from the model, as a KServe transformer
    settings: str  # its settings class, in handlers.settings
    model: ModelFiles  # what its --serialized-file is
    head: Optional[str] = None  # the Hugging Face head its directory's architecture must have
    requirements: Tuple[str, ...] = ()
    requirements_if_present: Tuple[Tuple[str, str], ...] = ()
    scaffold: Tuple[str, ...] = ()  # Start's weights, weights_are, predict, make_input
    v2: dict = field(default_factory=lambda: bytes_in_out())  # its class's v2_metadata

    @property
    def entry_point(self) -> str:
        """What MANIFEST.json names (``module:function``, which TorchServe imports from the unpacked MAR)."""
        return f"{self.module}:handle"

    def declared(self) -> Declared:
        """What its class declares (tests/cli/test_cli_startup.py checks it against the class). Imports
        handlers.settings, which holds no torch."""
        from . import settings

        return Declared(
            self.class_name,
            self.bases,
            self.input,
            self.splits,
            getattr(settings, self.settings),
            self.requirements,
            self.requirements_if_present,
            v2=self.v2,
        )

    def start(self) -> Start:
        return Start(self.module, self.class_name, self.settings, self.input, *self.scaffold)


BASE = "handlers.base.ToolkitHandler"
TEXT = ("handlers.text.TextHandler", BASE)
TEXT_WEIGHTS = ("--serialized-file MODEL_DIR/", "MODEL_DIR/ is your model's directory, as save_pretrained wrote it")
DIRECTORY, WEIGHTS = ModelFiles.PRETRAINED_DIRECTORY, ModelFiles.WEIGHTS_FILE

HANDLERS: Dict[str, Handler] = {
    handler.name: handler
    for handler in (
        Handler(
            "image_classifier",
            "image classification (torchvision-style models)",
            "handlers.image",
            "ImageClassifier",
            (BASE,),
            "image",
            True,
            "ImageSettings",
            WEIGHTS,
            scaffold=(
                "--serialized-file resnet18.pt --model-file model.py --extra-files index_to_name.json",
                "resnet18.pt, model.py and index_to_name.json are your weights (a state_dict), model class and labels",
                "kitten.jpg",
            ),
        ),
        Handler(
            "text_classifier",
            "text classification (Hugging Face)",
            "handlers.text_classification",
            "TextClassifier",
            TEXT,
            "text",
            False,
            "ClassifierSettings",
            DIRECTORY,
            "ForSequenceClassification",
            (TRANSFORMERS,),
            scaffold=(*TEXT_WEIGHTS, "text.txt", "echo 'What a lovely day' > text.txt && "),
        ),
        Handler(
            "token_classifier",
            "token classification, e.g. named entities (Hugging Face)",
            "handlers.token_classification",
            "TokenClassifier",
            TEXT,
            "text",
            False,
            "TokenSettings",
            DIRECTORY,
            "ForTokenClassification",
            (TRANSFORMERS,),
            scaffold=(*TEXT_WEIGHTS, "text.txt", "echo 'Ada Lovelace lived in London' > text.txt && "),
        ),
        Handler(
            "text_embedder",
            "sentence embeddings (Hugging Face, sentence-transformers)",
            "handlers.embeddings",
            "TextEmbedder",
            TEXT,
            "text",
            False,
            "EmbedderSettings",
            DIRECTORY,
            requirements=(TRANSFORMERS,),
            requirements_if_present=(("modules.json", SENTENCE_TRANSFORMERS),),
            scaffold=(*TEXT_WEIGHTS, "text.txt", "echo 'A sentence to embed' > text.txt && "),
            v2={
                "inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}],
                "outputs": [{"name": "embedding", "datatype": "FP32", "shape": [-1, -1]}],
            },
        ),
        Handler(
            "tensor",
            "tensors in, tensors out (any model)",
            "handlers.tensor",
            "TensorPredictor",
            (BASE,),
            "tensor",
            False,
            "TensorSettings",
            WEIGHTS,
            v2={
                "inputs": [{"name": "input-0", "datatype": "FP32", "shape": [-1, -1]}],
                "outputs": [{"name": "output-0", "datatype": "FP32", "shape": [-1, -1]}],
            },
        ),
    )
}

# ``tsctl init --from blank``: the toolkit's base class itself, every hook written out.
BLANK = Start(
    "handlers.base",
    "ToolkitHandler",
    "Settings",
    "any",
    "--serialized-file weights.pt",
    "weights.pt: WeightedSum's state_dict, e.g. python -c \"import torch; torch.save({'weight': torch.ones(4)}, "
    "'weights.pt')\"",
    "input.json",
    "echo '[[1, 2, 3, 4]]' > input.json && ",
)
STARTS: Dict[str, Start] = {
    **{name: handler.start() for name, handler in HANDLERS.items() if handler.scaffold},
    "blank": BLANK,
}


def by_entry_module(module: str) -> Optional[Handler]:
    """The toolkit handler whose module is ``module`` (``handlers.image``), if any."""
    return next((h for h in HANDLERS.values() if h.module == module), None)


def subclassed(declared: Declared) -> Optional[Handler]:
    """The toolkit handler ``declared``'s class subclasses, nearest first (a handler of one's own)."""
    for handler in HANDLERS.values():
        nearest = declared.bases[0].rsplit(".", 1)[-1] if declared.bases else None
        if nearest == handler.class_name and declared.bases[1:] == handler.bases:
            return handler
    return None
