"""What KServe's TorchServe runtime images hold, and an archive's requirements resolved for one of them.

TorchServe installs a model's requirements.txt when ``install_py_dep_per_model=true`` (KServe's
config): 0.9.0 runs ``python -m pip install -U -t MODEL_DIR -r requirements.txt``. With ``-t`` pip
ignores what the image already has and installs the newest release of every package and of their
dependencies that the image's Python takes, into the model's directory, ahead of the image's own
packages on ``sys.path``. For a text archive asking for ``transformers>=4.34`` on
torchserve-kfs:0.9.0 that is transformers 4.57, which fails to import against the image's torch
2.1.0 (``torch.utils._pytree`` has no ``register_pytree_node``): measured.

So an archive's requirements (ranges, written by ``tsctl package``) are resolved here for the
runtime they will run on, the image's own packages pinned, and written back as exact versions
(``lock``); the lowest release in the range is taken when the image's own version is outside it,
the one nearest to what the image was built with. ``wheels`` downloads that lock for the image's
Python and platform, so the archive installs with ``--no-index`` from its own ``wheels/``.

The images' contents are read from pytorch/serve's build files at each tag (docker/Dockerfile:
Python 3.9; requirements/torch_linux.txt and torch_common.txt; kubernetes/kserve/requirements.txt,
whose transformers is unpinned: the release current when the tag was cut is assumed).
"""

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

from . import requirements
from .errors import UserError

PLATFORM = "x86_64-manylinux_2_28"  # uv's name; the images are Ubuntu 22.04+ on x86_64
PIP_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux1_x86_64")
# Compiled against the image's torch or numpy: a per-model copy of another version breaks the worker.
CORE = ("torch", "torchvision", "torchaudio", "numpy")
OFFLINE_HEADER = "--no-index\n--find-links wheels\n"


@dataclass(frozen=True)
class KServeImage:
    name: str
    python: str  # major.minor
    torchserve: str
    pins: Dict[str, str] = field(default_factory=dict)  # what the image has installed


RUNTIMES = {
    runtime.name: runtime
    for runtime in (
        KServeImage(
            "torchserve-kfs:0.9.0",
            "3.9",
            "0.9.0",
            {
                "torchserve": "0.9.0",
                "torch": "2.1.0",
                "torchvision": "0.16.0",
                "torchaudio": "2.1.0",
                "numpy": "1.24.3",
                "pillow": "10.0.1",
                "pyyaml": "6.0",
                "psutil": "5.9.5",
                "requests": "2.31.0",
                "packaging": "23.2",
                "captum": "0.6.0",
                "transformers": "4.34.0",
            },
        ),
        KServeImage(
            "torchserve-kfs:0.12.0",
            "3.9",
            "0.12.0",
            {
                "torchserve": "0.12.0",
                "torch": "2.4.0",
                "torchvision": "0.19.0",
                "torchaudio": "2.4.0",
                "numpy": "1.24.3",
                "pillow": "10.3.0",
                "pyyaml": "6.0.1",
                "psutil": "5.9.8",
                "requests": "2.32.0",
                "packaging": "23.2",
                "captum": "0.6.0",
                "transformers": "4.44.2",
            },
        ),
    )
}
DEFAULT = "torchserve-kfs:0.9.0"


def runtime_named(name: str) -> KServeImage:
    if name not in RUNTIMES:
        raise UserError(f"--runtime {name!r} is not one tsctl knows: use one of {', '.join(RUNTIMES)}")
    return RUNTIMES[name]


@dataclass
class Lock:
    lines: List[str]  # name==version, sorted
    note: str = ""  # set when a package shadows the image's own version

    def text(self, offline: bool) -> str:
        return (OFFLINE_HEADER if offline else "") + "".join(line + "\n" for line in self.lines)


def lock(text: str, runtime: KServeImage, where: str) -> Lock:
    """Exact versions of ``text``'s requirements (requirements.txt, checked to be plain
    requirements: ``archiver/requirements.py``) and their dependencies for ``runtime``: the image's
    own versions where the ranges allow them, else the lowest allowed with the image's torch and
    numpy kept. A UserError naming ``where`` when a line is not a plain requirement or nothing
    resolves."""
    lines = requirements.check(text, where)
    if not lines:
        return Lock([])
    direct = {requirements.requirement_name(line) for line in lines}
    attempts = (  # the image's versions of everything; else of all it has but the archive's own; else torch's
        ({n: v for n, v in runtime.pins.items()}, "highest"),
        ({n: v for n, v in runtime.pins.items() if n not in direct}, "lowest-direct"),
        ({n: v for n, v in runtime.pins.items() if n in CORE}, "lowest-direct"),
    )
    for pins, resolution in attempts:
        resolved, error = _compile(lines, runtime.python, pins, resolution)
        if resolved is not None:
            break
    else:
        raise UserError(
            f"{where} asks for {'; '.join(lines)}, which cannot be installed on {runtime.name} "
            f"(Python {runtime.python}, torch {runtime.pins['torch']}): {error}; widen the range in the "
            "--requirements-file or pick another --runtime"
        )
    versions = dict(line.split("==", 1) for line in resolved)
    shadowed = [f"{n} {versions[n]} (the image has {v})" for n, v in runtime.pins.items() if versions.get(n, v) != v]
    if not shadowed:
        return Lock(resolved)
    note = (
        f"{where}: its requirements need {', '.join(shadowed)}; the per-model install puts them ahead of the "
        f"image's own on {runtime.name}: check its answers there (the runtime matrix tests only the image's)"
    )
    return Lock(resolved, note)


def _compile(lines: List[str], python: str, pins: Dict[str, str], resolution: str) -> Tuple[list, str]:
    """uv's resolver for the runtime's Python and platform: (pinned lines, None) or (None, uv's reason).
    Wheels only (``--no-build``: no sdist is built, no build backend runs), from one index, with
    uv's configuration files and settings ignored (a planted ``uv.toml`` above the temporary
    directory redirected it)."""
    with tempfile.TemporaryDirectory(prefix="tsctl-lock-") as tmp:
        (Path(tmp) / "requirements.in").write_text("\n".join(lines) + "\n", encoding="utf-8")
        constraints = "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))
        (Path(tmp) / "constraints.txt").write_text(constraints, encoding="utf-8")
        command = [sys.executable, "-m", "uv", "pip", "compile", "--quiet", "--no-header", "--no-annotate"]
        command += ["--no-config", "--no-build", "--index-url", requirements.index_url()]
        command += ["--python-platform", PLATFORM, "--resolution", resolution]
        # --python: this interpreter runs uv's resolution (nothing is built: --no-build) for --python-version.
        # Without it uv looks for a Python of that version and tries to download one: 8 to 10 s per resolve.
        command += ["--python", sys.executable, "--python-version", python, "requirements.in", "-c", "constraints.txt"]
        env = requirements.tool_env()
        done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env)
    if done.returncode != 0:
        text = " ".join(done.stderr.split())
        for marker in ("╰─▶", "cause:"):
            text = text.split(marker, 1)[-1]
        reason = text.strip().split(". ", 1)[0].rstrip(".")[:400]
        if "No module named uv" in done.stderr:
            raise UserError("resolving requirements for a runtime needs uv: run 'pip install uv' beside tsctl")
        return None, reason or done.stderr.strip()
    pinned = sorted(line.strip() for line in done.stdout.splitlines() if re.match(r"^[A-Za-z0-9._-]+==", line.strip()))
    return pinned, None


def wheels(lock_lines: List[str], runtime: KServeImage, into: Path) -> List[Path]:
    """Download the wheel of each locked package for the runtime's Python and platform into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    lockfile = into / "requirements.lock"
    lockfile.write_text("\n".join(lock_lines) + "\n", encoding="utf-8")
    tag = runtime.python.replace(".", "")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--isolated", "--no-deps", "--only-binary=:all:"]
    command += ["--index-url", requirements.index_url()]
    command += ["--python-version", runtime.python, "--implementation", "cp", "--abi", f"cp{tag}", "--abi", "abi3"]
    command += ["--abi", "none"] + [arg for p in PIP_PLATFORMS for arg in ("--platform", p)] + ["--platform", "any"]
    command += ["-d", str(into), "-r", str(lockfile)]
    done = subprocess.run(
        command, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=requirements.tool_env()
    )
    lockfile.unlink()
    if done.returncode != 0:
        if "No module named pip" in done.stderr:
            raise UserError("--offline downloads wheels with pip, which is not installed: run 'uv pip install pip'")
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "pip failed"
        raise UserError(f"could not download the wheels for {runtime.name}: {reason}")
    return sorted(into.glob("*.whl"))


def for_runtime(
    archives: list, runtime: KServeImage, offline: bool, scratch: Path, notes: List[str], progress=None
) -> dict:
    """What each archive (its export's ``ArchiveFacts``) needs replaced to install on ``runtime``: its requirements
    file as a lock (with ``offline``: ``--no-index --find-links wheels`` and the wheels under ``wheels/``).
    {archive: {entry name: bytes or Path}}; archives without requirements are left out. ``progress``
    (archiver.output.Progress) hears of each archive resolved and each download."""
    progress = progress or (lambda message: None)
    changes, locks = {}, {}
    for facts in archives:  # every line checked when the archive was read, before anything resolves
        archive, name, text = facts.path, facts.requirements_file, facts.requirements_text
        if not text.strip():
            continue
        if text not in locks:
            progress(f"{archive.name}: resolving its requirements for {runtime.name} (uv)")
            locks[text] = lock(text, runtime, f"{archive.name}'s {name}")
            if locks[text].note:
                notes.append(locks[text].note)
        locked = locks[text]
        replace = {name: locked.text(offline).encode("utf-8")}
        if offline and locked.lines:
            count = f"{len(locked.lines)} wheel" + ("s" if len(locked.lines) != 1 else "")
            progress(f"{archive.name}: downloading {count} for {runtime.name} (pip)")
            downloaded = wheels(locked.lines, runtime, scratch / str(len(changes)))
            replace.update({f"wheels/{wheel.name}": wheel for wheel in downloaded})
        changes[archive] = replace
    return changes
