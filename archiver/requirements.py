"""An archive's requirements file, read as data: package names and version ranges, nothing else.

A requirements file can do more than name packages: ``name @ https://...``, a bare URL, ``git+...``,
a local path or ``-e DIR`` make pip or uv fetch that URL, clone that repository or run that
directory's ``setup.py`` on the machine that resolves them; option lines (``--index-url``,
``--extra-index-url``, ``--find-links``, ``-r``, ``-c``) redirect where every package comes from.
Whoever wrote the archive would run code on the machine that packages or exports it. So each line
must be a requirement ``packaging`` reads (a name, extras, a version range, markers) without a URL;
anything else is refused with one line naming the file, the line and the fix (``check``). The text is
read as pip reads it: after a requirement only ``--hash=ALGORITHM:HEX`` may follow (pip reads any other
option there, and an option line after it), and a PEP 263 coding line other than UTF-8's is refused (pip
decodes the whole file with it). Every
command that takes an archive's requirements elsewhere reads them through ``of_archive``: the
TorchServe export (locked for KServe's image), ``export kserve --engine tsctl`` and ``export seldon``
(copied into the image's requirements.txt, which ``docker build`` installs).

Resolving and downloading (``archiver/kserve_images.py``) then run uv and pip with their configuration
files ignored, no environment settings of theirs, one explicit index (``index_url``) and binary
wheels only: no sdist is built, no build backend runs.
"""

import codecs
import os
import re
from pathlib import Path
from typing import List, Optional, Tuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from .errors import UserError

DEFAULT_INDEX = "https://pypi.org/simple"
MAX_BYTES = 1 << 20  # an archive's requirements file, read whole
FIX = "name the package and a version range instead (the package index must serve it as a wheel)"


def check(text: str, where: str) -> List[str]:
    """The requirement lines of ``text`` (comments and blank lines left out), each checked to be a
    plain requirement; a UserError naming ``where`` and the line otherwise."""
    # pip decodes the file by a coding line among the first two of its raw bytes ("\n"-separated); package
    # stores the lines check() reads (splitlines), one a line: neither may declare another encoding
    for split in (text.split("\n"), text.splitlines()):
        for number, raw in enumerate(split[:2], 1):
            declared = PEP263.search(raw) if raw.startswith("#") else None
            if declared and _codec(declared.group(1)) not in ("utf-8", "ascii"):
                raise UserError(
                    f"{where}, line {number}: {raw.strip()[:120]!r} declares the encoding {declared.group(1)!r}, "
                    "which pip would decode the file with; remove the line (the file is read as UTF-8)"
                )
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = COMMENT.sub("", raw).strip()
        if not line:
            continue
        shown = line if len(line) <= 120 else line[:120] + "..."
        if line.startswith("-") and safe_option(line):
            continue
        included = include_of(line)
        if included:
            raise UserError(
                f"{where}, line {number}: {shown!r} includes {included}, which the archive does not carry "
                f"(TorchServe's per-model install runs pip install -r on this file alone, inside the unpacked "
                f"archive); copy the requirements of {included} into this file instead"
            )
        if line.startswith("-"):
            raise UserError(
                f"{where}, line {number}: {shown!r} is a pip option; an archive's requirements may only name "
                f"packages (where they come from is the exporting machine's choice: --index-url); remove it"
            )
        line, options = split_options(line)
        odd = next((option for option in options if not HASH.fullmatch(option)), None)
        if odd is not None:
            raise UserError(
                f"{where}, line {number}: {shown!r} has {odd[:80]!r} after its requirement, where pip reads it as "
                "an option; only --hash=ALGORITHM:HEX may follow a requirement: remove the rest"
            )
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            raise UserError(
                f"{where}, line {number}: {shown!r} is not a package requirement (a URL, a path or a VCS "
                f"link would be fetched or built where it is resolved); {FIX}"
            ) from None
        if requirement.url:
            raise UserError(
                f"{where}, line {number}: {shown!r} names a URL ({requirement.url[:80]}), which would be "
                f"fetched and built where it is resolved; {FIX}"
            )
        lines.append(line)
    return lines


def of_archive(archive) -> Tuple[Optional[str], str, List[str]]:
    """An archive's requirements file (a path or an Archive): its name in the archive (None without one),
    its text and its requirement lines, each checked (``check``: a UserError naming ``ARCHIVE's FILE, line N``)."""
    from handlers import archives

    with archives.opened(archive) as found:
        name = found.model.get("requirementsFile")
        data = found.read(name, MAX_BYTES) if name else None
        archive = found.path
    if not name:
        return None, "", []
    if data is None:
        raise UserError(
            f"{archive}: its MANIFEST.json names requirementsFile {name!r}, which the archive does not hold: "
            "package it again with its --requirements-file"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{archive}: its {name} is not UTF-8 ({exc.reason} at byte {exc.start}), which pip would read in "
            "another encoding: package it again with a UTF-8 --requirements-file"
        ) from None
    return name, text, check(text, f"{Path(archive).name}'s {name}")


COMMENT = re.compile(r"(^|\s)#.*")  # pip's: '#' at the start of a line or after a blank
HASH = re.compile(r"--hash=[A-Za-z0-9]+:[0-9A-Fa-f]+")  # after a requirement: how to check it, not what
PEP263 = re.compile(r"coding[:=]\s*([-\w.]+)", re.ASCII)  # pip's PEP263_ENCODING_RE, on a line starting '#'


def _codec(name: str) -> Optional[str]:
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def split_options(line: str) -> Tuple[str, List[str]]:
    """A requirements.txt line (comment removed) as pip splits it (``break_args_options``): the words up
    to the first one starting with '-', and the options from there on."""
    words = line.split(" ")
    first = next((at for at, word in enumerate(words) if word.startswith("-")), len(words))
    return " ".join(words[:first]).strip(), [word for word in words[first:] if word]


def strip(raw: str) -> str:
    """One requirements.txt line without its comment and the options after its requirement (its
    hashes; "" for a blank or comment line); an option line as it is."""
    line = COMMENT.sub("", raw).strip()
    return line if line.startswith("-") else split_options(line)[0]


def requirement_name(line: str) -> Optional[str]:
    """The package a requirements.txt line names, as pip and PyPI compare names (PEP 503: case, '.', '_'
    and '-' folded: ``Sentence_Transformers.X>=3`` -> ``sentence-transformers-x``); None for a blank or
    comment line, a pip option (``--no-index``, ``-r other.txt``) and anything else that is no requirement."""
    line = strip(line)
    if not line or line.startswith("-"):
        return None
    try:
        return canonicalize_name(Requirement(line).name)
    except InvalidRequirement:
        return None


def include_of(line: str) -> Optional[str]:
    """The file a ``-r FILE`` / ``--requirement FILE`` line includes, else None."""
    found = INCLUDE.match(line)
    return found.group(1) if found else None


INCLUDE = re.compile(r"(?:-r\s*|--requirement(?:\s+|=))(\S.*)")


SAFE_OPTIONS = ("--no-index", "--prefer-binary", "--require-hashes", "--only-binary")


def safe_option(line: str) -> bool:
    """A pip option line that only narrows where packages come from: ``--no-index``,
    ``--only-binary``, ``--prefer-binary``, ``--require-hashes``, or ``--find-links`` to a directory
    inside the archive (what ``export --offline`` writes: ``--find-links wheels``)."""
    option, *values = line.replace("=", " ", 1).split()  # one value at most: pip reads any word after as options
    if option in SAFE_OPTIONS:
        return len(values) == (1 if option == "--only-binary" else 0)
    if option in ("--find-links", "-f") and len(values) == 1:
        path = values[0]
        return ":" not in path and not path.startswith(("/", "~")) and ".." not in path.split("/")
    return False


def index_url() -> str:
    """The one index packages are resolved from: ``TSCTL_INDEX_URL``, else PyPI."""
    return os.environ.get("TSCTL_INDEX_URL") or DEFAULT_INDEX


def tool_env() -> dict:
    """The environment uv and pip run in: this one without their own settings (``UV_*``, ``PIP_*``:
    an index, find-links or a config file given there would add sources), with config files off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    env.update(UV_NO_CONFIG="1", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env
