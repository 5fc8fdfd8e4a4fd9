"""What an export needs to know of one archive, read in one opening (``read``): its manifest, its
model-config.yaml, its handler record (MAR-INF/tsctl.json) and so the kind of input its handler takes, its
requirements file, every line checked, and its golden answers (package --golden).

Each export's checks read every archive they name once (the store's, the transformer's) and pass the facts on
in place of the archive's path: nothing after the checks opens an archive again. Copying the archive into the
exported tree reads its bytes, not its contents.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from handlers import archives, golden, identity

from .. import requirements
from ..errors import UserError
from ..opened_archive import opened

INPUTS = ("image", "text", "tensor")  # what DEPLOY.md knows how to build a request body for


@dataclass(frozen=True)
class ArchiveFacts:
    path: Path
    manifest: dict  # MANIFEST.json, checked (handlers/archives.py)
    config: dict  # model-config.yaml ({} without one)
    record: Optional[dict]  # MAR-INF/tsctl.json; None: not a toolkit handler
    version: str  # the model's version as TorchServe takes it (Archive.version: "1.0" when the manifest has none)
    requirements_file: Optional[str] = None  # its name in the archive; None: the archive has none
    requirements_text: str = ""
    requirement_lines: List[str] = field(default_factory=list)  # each a plain requirement (requirements.check)
    golden: Optional[dict] = None  # MAR-INF/golden.json, checked (handlers/golden.py); None: none, or damaged
    golden_problem: Optional[str] = None  # why golden.json cannot be read: raised by golden_answers() alone

    @property
    def model(self) -> dict:
        return self.manifest["model"]

    @property
    def name(self) -> str:
        return self.model["modelName"]

    @property
    def handler(self) -> str:
        return str(self.model.get("handler"))

    @property
    def toolkit(self) -> bool:
        return self.record is not None

    @property
    def input(self) -> Optional[str]:
        """What its requests hold: image, text or tensor; None for a handler of the user's own that says no more."""
        kind = (self.record or {}).get("input")
        return kind if kind in INPUTS else None

    def golden_answers(self) -> Optional[dict]:
        """The golden answers, for the steps that use them (``--canary``'s shadow check, the sample input of a
        handler of the user's own): a UserError naming the archive when its golden.json is damaged. The
        steps that do not use them never look, so such an archive exports as it did when nothing read them."""
        if self.golden_problem:
            raise UserError(self.golden_problem)
        return self.golden

    @property
    def input_shape(self) -> Optional[list]:
        """A tensor handler's ``handler.input_shape`` (model-config.yaml); None for any other."""
        return (self.config.get("handler") or {}).get("input_shape") if self.input == "tensor" else None


def read(path, within=None) -> ArchiveFacts:
    """The facts of the archive at ``path``, in one opening (``within`` the model store it must lie in: a link
    leading out of it is refused, as the engine refuses it); a UserError naming the archive for one that is
    damaged, unsafe or whose requirements file is not plain requirements."""
    with opened(path, within) as found:
        name, text, lines = requirements.of_archive(found)
        record = identity.read(found)
        try:
            answers, problem = golden.read(found), None
        except archives.ArchiveError as exc:
            answers, problem = None, str(exc)
        facts = (Path(path), found.manifest, found.config, record, found.version, name, text, lines, answers, problem)
        return ArchiveFacts(*facts)
