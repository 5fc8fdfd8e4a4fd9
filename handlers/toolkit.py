"""The toolkit's handlers as ``tsctl package`` sees them: what each declares, without importing it.

Every handler module imports torch (and torchvision or transformers), seconds of a command that
only writes a zip. Packaging needs of a handler class no more than its ``Kind``: the names recorded
in MAR-INF/tsctl.json (identity.py), what a request holds, whether it splits into a KServe
transformer, its settings class (settings.py, no torch) and what the archive must install.
``KINDS`` gives it for each toolkit handler by name; tests/cli/test_package.py checks each against
``kind_of`` its real class. A user's ``--handler`` file is imported as TorchServe will import it,
and ``kind_of`` reads its class.
"""

import os
from dataclasses import dataclass
from typing import Optional, Tuple

from . import settings

# What an archive's requirements.txt asks for: ranges, never this machine's versions.
# Every transformers these handlers are tested on: from torchserve-kfs:0.9.0's 4.34 (Python 3.9) to 5.x.
TRANSFORMERS = "transformers>=4.34,<6"
# 3.0.1 is the newest that installs beside torchserve-kfs:0.9.0's transformers 4.34 on Python 3.9
# (3.1 needs transformers 4.38); 5.1.2 beside torchserve-kfs:0.12.0's 4.44.
SENTENCE_TRANSFORMERS = "sentence-transformers>=3,<7"
ONNX_RUNTIME = "onnxruntime>=1.16"
ONNX_FILE = "model.onnx"  # an ONNX model in a Hugging Face directory


@dataclass(frozen=True)
class Kind:
    class_name: str  # the handler class's __qualname__
    bases: Tuple[str, ...]  # its toolkit base classes, "module.Qualname", nearest first
    input_kind: str  # what a request holds: image, text, tensor or any
    splits: bool  # its pre/post can run apart from the model, as a KServe transformer
    settings: type  # its model-config.yaml ``handler:`` settings (a dataclass of settings.py)
    requirements: Tuple[str, ...] = ()  # what requirements.txt always asks for
    # (file, requirement): asked for too when the model directory holds that file
    requirements_if_present: Tuple[Tuple[str, str], ...] = ()
    loads_own_model: bool = False  # a subclass that overrides load_model: its weights are its own business

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


def kind_of(handler_class) -> Kind:
    """The Kind a handler class (a ToolkitHandler subclass) declares."""
    toolkit = [c for c in handler_class.__mro__[1:] if c.__module__.startswith("handlers.")]
    own = [c for c in handler_class.__mro__ if not c.__module__.startswith("handlers.")]
    return Kind(
        class_name=handler_class.__qualname__,
        bases=tuple(f"{c.__module__}.{c.__qualname__}" for c in toolkit),
        input_kind=handler_class.input_kind,
        splits=bool(handler_class.splits),
        settings=handler_class.Settings,
        requirements=tuple(handler_class.requirements),
        requirements_if_present=tuple(handler_class.requirements_if_present),
        loads_own_model=any("load_model" in vars(c) for c in own),
    )


def toolkit_name(kind: Kind) -> Optional[str]:
    """The name (``image_classifier``) of the toolkit handler ``kind``'s class subclasses, nearest first."""
    for name, base in KINDS.items():
        if kind.bases and kind.bases[0].rsplit(".", 1)[-1] == base.class_name and kind.bases[1:] == base.bases:
            return name
    return None


BASE = "handlers.base.ToolkitHandler"
TEXT = ("handlers.text.TextHandler", BASE)
KINDS = {
    "image_classifier": Kind("ImageClassifier", (BASE,), "image", True, settings.ImageSettings),
    "text_classifier": Kind("TextClassifier", TEXT, "text", False, settings.ClassifierSettings, (TRANSFORMERS,)),
    "token_classifier": Kind("TokenClassifier", TEXT, "text", False, settings.TokenSettings, (TRANSFORMERS,)),
    "text_embedder": Kind(
        "TextEmbedder",
        TEXT,
        "text",
        False,
        settings.EmbedderSettings,
        (TRANSFORMERS,),
        (("modules.json", SENTENCE_TRANSFORMERS),),
    ),
    "tensor": Kind("TensorPredictor", (BASE,), "tensor", False, settings.TensorSettings),
}
