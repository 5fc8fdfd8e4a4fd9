"""Building model archives (.mar) in the format TorchServe 0.12 loads: what goes in, checked.

A .mar is a zip: the serialized file, model file, handler, extra files, requirements and
model-config.yaml at its root, plus ``MAR-INF/MANIFEST.json``. A toolkit handler
(``--handler image_classifier``) bundles this project's ``handlers/`` package so a stock TorchServe
loads it with nothing else installed. Directories keep their name and structure inside the archive.

``plan`` gathers and checks the inputs; archiver/writing.py writes the plan (deterministic, atomic,
signed before its one write with ``--sign-key``). Archives are read through handlers/archives.py's
``Archive``; the few readers here turn its ArchiveError into the CLI's UserError.

What a build refuses, before writing anything: a target that is one of its inputs (or holds one);
symbolic links among the inputs unless ``follow_symlinks`` (each followed link is reported);
special files; names that are not UTF-8; two inputs with one name inside the archive, or one
named like what tsctl writes itself (``MAR-INF/``, the bundled ``handlers/``, requirements.txt);
model names and versions that config.properties could not carry.
"""

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import handlers
from handlers import archives, catalogue, fit, identity

from . import handler_resolution, requirements
from .choices import ARCHIVE_FORMATS
from .errors import UserError, make_directory
from .model_config import check_model_config
from .writing import Source, build_time, manifest_text, rewrite_archive, write, write_archive, write_error  # noqa: F401

MANIFEST = archives.MANIFEST
ARCHIVER_VERSION = "0.12.0"  # the torch-model-archiver format these archives follow
# Names and versions end up in config.properties' model_snapshot (JSON inside a Java properties
# file, read again by KServe's wrapper with a plain split): only characters neither format escapes.
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.]{0,127}\Z")  # 128 at most: a file name, a URL path segment
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.+]{0,63}\Z")
SKIP_DIRS = {"__pycache__", "__MACOSX"}


@dataclass
class PackageOptions:
    """torch-model-archiver's flags, by the same names (plus ``follow_symlinks``)."""

    model_name: str
    handler: str
    serialized_file: Optional[str] = None
    model_file: Optional[str] = None
    version: str = "1.0"
    extra_files: List[str] = field(default_factory=list)
    requirements_file: Optional[str] = None
    config_file: Optional[str] = None
    export_path: str = "model-store"
    archive_format: str = "default"
    runtime: str = "python"  # the manifest's; LSP (TorchServe's C++ backend) is refused
    force: bool = False
    follow_symlinks: bool = False
    sign_key: Optional[str] = None  # a PEM private key: MAR-INF/model.sig over every file (handlers/signing.py)


@dataclass
class BuildPlan:
    """What a build will write: entries (name inside -> source), the manifest, links followed."""

    entries: Dict[str, Source]
    manifest: dict
    followed: List[Tuple[Path, Path]] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)  # what will work, but maybe not as meant


def archive_path(export_path, model_name: str, archive_format: str = "default") -> Path:
    return Path(export_path) / (model_name + ARCHIVE_FORMATS[archive_format])


def package(options: PackageOptions) -> Path:
    """Validate everything, then write the archive atomically. Returns its path."""
    return build(options)[0]


def build(options: PackageOptions) -> Tuple[Path, BuildPlan]:
    """``package``, also returning the plan (the CLI reports the symbolic links it followed)."""
    planned = plan(options)
    return write_plan(planned, options), planned


def write_plan(planned: BuildPlan, options: PackageOptions) -> Path:
    """Write what ``plan`` found (and whatever was added to its entries since: golden answers) to its
    place, signed first with ``options.sign_key``: one write. Returns the archive's path."""
    target = archive_path(options.export_path, options.model_name, options.archive_format)
    check_target(target, planned.entries)
    if (target.exists() or target.is_symlink()) and not options.force:
        raise UserError(f"{target} already exists: pass --force to overwrite it")
    make_directory(options.export_path, "--export-path")
    try:
        write(target, planned.entries, planned.manifest, options.archive_format, options.force, options.sign_key)
    except FileExistsError:
        raise UserError(f"{target} was created by someone else while this build ran: pass --force to overwrite it")
    except OSError as exc:
        raise write_error(exc, target) from None
    return target


def check_target(target: Path, entries: Dict[str, Source]):
    """Refuse to write over an input, or into a directory that holds one (no-archive --force would
    delete it)."""
    resolved = Path(os.path.realpath(target))
    for source in entries.values():
        if isinstance(source, Path):
            real = Path(os.path.realpath(source))
            if real == resolved or resolved in real.parents:
                raise UserError(
                    f"the archive {target} would overwrite the input {source}: pick another --export-path or name"
                )


def shown_name(name) -> str:
    """A name for an error message: repr'd (control characters escaped) and cut to 80 characters."""
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_options(options: PackageOptions) -> None:
    """One line for the first option that cannot make an archive: the runtime, the name, the version, the format."""
    if options.runtime == "LSP":
        raise UserError(
            "--runtime LSP is TorchServe's C++ backend, which tsctl neither packages nor serves: "
            "give --runtime python, or package the archive with torch-model-archiver"
        )
    if not MODEL_NAME.match(options.model_name or ""):
        raise UserError(
            f"invalid --model-name {shown_name(options.model_name)}: use up to 128 letters, digits, '_', '-' and '.', "
            "starting with a letter or digit"
        )
    if not VERSION.match(options.version or ""):
        raise UserError(
            f"invalid --version {shown_name(options.version)}: use up to 64 letters, digits, '.', '_', '+' and '-', "
            "starting with a letter or digit"
        )
    if options.archive_format not in ARCHIVE_FORMATS:
        raise UserError(f"unknown --archive-format {options.archive_format!r}: use one of {', '.join(ARCHIVE_FORMATS)}")


def plan(options: PackageOptions) -> BuildPlan:
    """The archive's entries (name inside -> file on disk) and its manifest, after validation."""
    _check_options(options)
    name = options.model_name
    inputs = Inputs(options.follow_symlinks)
    model = {"modelName": name}

    if options.serialized_file:
        serialized = inputs.add(options.serialized_file, "--serialized-file")
        model["serializedFile"] = serialized.name

    handler_entry, bundle = handler_resolution.resolve(options.handler, inputs, options.extra_files)
    model["handler"] = handler_entry
    if options.handler in catalogue.HANDLERS and not options.serialized_file:
        raise UserError(f"--handler {options.handler} needs the model's weights: pass --serialized-file")

    if options.model_file:
        model_file = Path(options.model_file)
        if model_file.suffix != ".py" or (model_file.exists() and not model_file.is_file()):
            raise UserError(f"--model-file {options.model_file} must be a Python file defining the model class")
        inputs.add(options.model_file, "--model-file")
        model["modelFile"] = model_file.name

    model["modelVersion"] = options.version

    for extra in options.extra_files:
        inputs.add(extra, "--extra-files")

    declared = handler_resolution.declared(options.handler, handler_entry, bundle)
    fitted = handler_resolution.fitted_handler(options.handler, declared)
    misfit = fit.problem(fitted, options.serialized_file, options.model_file)
    if misfit:
        raise UserError(misfit if fitted == options.handler else f"{options.handler} subclasses {fitted}: {misfit}")
    if declared is not None:
        module = handler_entry.partition(":")[0].removesuffix(".py")
        inputs.put(identity.RECORD, identity.encode(identity.describe(declared, handler_entry, module)), "")
    needed = declared.requirements_for(options.serialized_file) if declared else ()
    requirements = _requirements(options.requirements_file, needed, inputs)
    if requirements is not None:
        name_in_mar, content = requirements
        inputs.put(name_in_mar, content, "the archive's requirements (--requirements-file)")
        model["requirementsFile"] = name_in_mar

    settings = {}
    if options.config_file:
        data = inputs.read(options.config_file, "--config-file", archives.MAX_CONFIG_BYTES)
        config = inputs.add(options.config_file, "--config-file")
        settings = check_model_config(config, declared.settings if declared else None, data).get("handler") or {}
        model["configFile"] = config.name
    notes = _label_notes(fitted, settings, inputs.entries)

    if bundle:
        taken = sorted(n for n in inputs.entries if n.split("/", 1)[0] == "handlers")
        if taken:
            raise UserError(
                f"an input is stored as {taken[0]}, inside the toolkit's bundled handlers/ package: rename it"
            )
        package_dir = Path(handlers.__file__).parent
        for source in sorted(package_dir.glob("*.py")):
            inputs.entries[f"handlers/{source.name}"] = source

    manifest = {
        "createdOn": time.strftime("%d/%m/%Y %H:%M:%S", time.gmtime(build_time(inputs.entries))),
        "runtime": options.runtime,
        "model": model,
        "archiverVersion": ARCHIVER_VERSION,
    }
    return BuildPlan(inputs.entries, manifest, inputs.followed, notes)


def _label_notes(fitted: str, settings: dict, entries: Dict[str, Source]) -> List[str]:
    """A note when an image classifier's archive holds no labels file: its answers are then keyed by
    class index (``"238"``), which reads as broken to whoever expected names."""
    labels = settings.get("labels", "index_to_name.json") if isinstance(settings, dict) else "index_to_name.json"
    if fitted != "image_classifier" or not isinstance(labels, str) or labels in entries:
        return []
    return [
        f"the archive holds no {labels} (handler.labels): answers name classes by index ('238'), not label; "
        f"add it with --extra-files {labels}"
    ]


class Inputs:
    """The files a build reads, by the name each gets inside the archive. Each is checked as it is
    added: it exists, it is a regular file or directory, it is no symbolic link unless links are
    followed (then each is recorded), its name is UTF-8 and free."""

    def __init__(self, follow_symlinks: bool):
        self.follow = follow_symlinks
        self.entries: Dict[str, Source] = {}
        self.followed: List[Tuple[Path, Path]] = []

    def add(self, path: str, flag: str) -> Path:
        """A file or directory given on the command line, stored under its own name."""
        source = Path(path)
        if not source.exists() and not source.is_symlink():
            raise UserError(f"{flag} {path} does not exist: check the path")
        self._add(source, source.name, flag, set())
        return source

    def read(self, path: str, flag: str, limit: int) -> bytes:
        """The bytes of a file given on the command line to be read (not only stored): a regular file
        (opened without blocking, so a pipe is refused, not waited on), at most ``limit`` bytes."""
        source = Path(path)
        if not source.exists() and not source.is_symlink():
            raise UserError(f"{flag} {path} does not exist: check the path")
        self._follow(source, flag)
        try:
            data = archives.read_regular(source, limit + 1)
        except archives.NotARegularFile:
            what = "is not a regular file (a directory, device or pipe): give the file"
            raise UserError(f"{flag} {path} {what}") from None
        except OSError as exc:
            raise UserError(f"{flag} {path} cannot be read: {exc.strerror}") from None
        if len(data) > limit:
            raise UserError(f"{flag} {path} is larger than {limit:,} bytes: give the file itself, trimmed")
        return data

    def put(self, name: str, content: bytes, what: str):
        """Content tsctl writes itself (requirements.txt)."""
        if name in self.entries:
            raise UserError(f"{self.entries[name]} would be stored as {name}, which holds {what}: rename it")
        self.entries[name] = content

    def _add(self, source: Path, arcname: str, flag: str, ancestors: set):
        real = self._follow(source, flag)
        try:
            arcname.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(f"{source!r} has a name that is not valid UTF-8: rename it") from None
        if arcname == "MAR-INF" or arcname.startswith("MAR-INF/"):
            raise UserError(f"{source} would be stored as {arcname}, where the archive's manifest lives: rename it")
        if real.is_dir():
            if real in ancestors:
                raise UserError(f"{source} is a symbolic link loop (it leads back to {real}): remove the link")
            for child in sorted(real.iterdir(), key=lambda p: p.name):
                if skipped(child):
                    continue
                self._add(source / child.name, f"{arcname}/{child.name}", flag, ancestors | {real})
            return
        if not real.is_file():
            raise UserError(f"{source} is not a regular file (a device, socket or pipe): {flag} takes files")
        existing = self.entries.get(arcname)
        if existing is not None and (isinstance(existing, bytes) or os.path.realpath(existing) != str(real)):
            raise UserError(f"two inputs would both be stored as {arcname} ({existing} and {source}): rename one")
        self.entries[arcname] = source

    def _follow(self, source: Path, flag: str) -> Path:
        """The real path behind ``source``; a symbolic link only with --follow-symlinks."""
        if not source.is_symlink():
            return Path(os.path.realpath(source))
        link = os.readlink(source)
        if not self.follow:
            raise UserError(
                f"{source} is a symbolic link (to {link}): pass --follow-symlinks to package what it points to"
            )
        try:
            real = source.resolve(strict=True)
        except FileNotFoundError:
            raise UserError(f"{source} is a broken symbolic link (to {link}): fix or remove it") from None
        except (RuntimeError, OSError):
            raise UserError(f"{source} is a symbolic link loop (to {link}): fix or remove it") from None
        self.followed.append((source, real))
        return real


def skipped(path: Path) -> bool:
    """Caches and hidden directories, compiled Python, Finder metadata: never packaged."""
    if path.is_dir():
        return path.name in SKIP_DIRS or path.name.startswith(".")
    return path.name.endswith(".pyc") or path.name == ".DS_Store"


def _requirements(path: Optional[str], needed, inputs: Inputs) -> Optional[Tuple[str, bytes]]:
    """The archive's requirements file: the user's, plus each requirement of the handler (a range,
    e.g. ``transformers>=4.34,<6``, never this machine's exact version: the archive is installed on
    other Pythons) whose package the user's file does not already name."""
    lines = []
    name = "requirements.txt"
    if path:
        name = Path(path).name
        data = inputs.read(path, "--requirements-file", requirements.MAX_BYTES)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"--requirements-file {path} is not a UTF-8 text file: {exc}") from None
        requirements.check(text, f"--requirements-file {path}")  # plain requirements only: one line otherwise
        lines = text.splitlines()  # stored as check() read them, one a line
    named = {requirements.requirement_name(line) for line in lines} - {None}
    lines += [requirement for requirement in needed if requirements.requirement_name(requirement) not in named]
    if not lines:
        return None
    return name, ("\n".join(lines) + "\n").encode("utf-8")
