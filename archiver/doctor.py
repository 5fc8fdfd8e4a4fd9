"""``tsctl doctor``: what this machine has of what each engine and command needs, one check per need.

Each check says what it found (``detail``) and, when something is missing, the one fix (``fix``);
``needed_for`` names what needs it. ``TORCHSERVE`` marks what the default engine cannot run without
(Python, TorchServe and torch, Java 17+): ``tsctl doctor`` exits 1 when one of those fails, else 0; the
other checks (pip for ``serve --install-deps``, the kserve extra for ``--engine tsctl``, MLServer for
``--engine mlserver``, uv for ``export kserve --runtime``, free disk) are reported without changing the
exit code, and so are the GPUs (NVML's list, the driver, whether torch sees them; none is fine). Nothing is
installed or started; the checks find modules without importing them, and run only ``java -version``, when
MLServer is not in this Python the checkout's MLServer venv, and where there are GPUs torch's count of them.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import List, Optional

TORCHSERVE = "torchserve"  # needed_for of what the default engine needs: a failure there exits 1
# TorchServe's documented requirement (its install scripts and docs: JDK 17). Its 0.12 jar holds Java 8 bytecode
# and its launcher checks no version, so an older Java may start it: untested, so not counted as enough.
JAVA_MIN = 17
PYTHON_MIN = (3, 9)  # tsctl's requires-python
MIN_FREE = 5 << 30  # torch wheels, unpacked archives
CHECKOUT = Path(__file__).resolve().parent.parent  # tsctl's checkout, where 'make runtimes' builds .runtimes/


@dataclass
class Check:
    name: str
    ok: bool
    detail: str  # what was found
    fix: Optional[str]  # the one thing to do when not ok, else None
    needed_for: str  # what needs it: TORCHSERVE, "--engine tsctl", "serve --install-deps", ...

    def line(self) -> str:
        """``ok      java (for torchserve): Java 17.0.2 at ...``; a problem ends with ``; fix: ...``."""
        text = f"{'ok     ' if self.ok else 'problem'} {self.name} (for {self.needed_for}): {self.detail}"
        return text if self.ok else f"{text}; fix: {self.fix}"

    def to_dict(self) -> dict:
        return asdict(self)


def run_checks(min_free: int = MIN_FREE, runtimes: Optional[Path] = None) -> List[Check]:
    """Every check, those the default engine needs first. ``runtimes``: where 'make runtimes' puts its
    venvs (default: the checkout's .runtimes/); ``min_free``: the free bytes below which disk is short."""
    return [
        python_check(),
        torchserve_check(),
        java_check(),
        pip_check(),
        kserve_check(),
        mlserver_check(runtimes if runtimes is not None else CHECKOUT / ".runtimes"),
        uv_check(),
        archiver_check(),
        gpu_check(),
        *disk_checks(min_free),
    ]


def all_ok(checks: List[Check]) -> bool:
    """True when nothing the default engine (TorchServe) needs is missing: ``tsctl doctor`` exits 0."""
    return all(check.ok for check in checks if check.needed_for == TORCHSERVE)


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "?"


def python_check() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info[:2] >= PYTHON_MIN
    fix = None if ok else f"use Python {PYTHON_MIN[0]}.{PYTHON_MIN[1]} or newer (uv sync picks .python-version's)"
    return Check("python", ok, f"Python {version} ({sys.executable})", fix, TORCHSERVE)


def torchserve_check() -> Check:
    """What ``tsctl serve`` starts: the ``torchserve`` script beside this Python, TorchServe's ``ts`` and torch
    (its workers import them)."""
    script = Path(sys.executable).parent / "torchserve"
    missing = [name for name, module in (("torchserve", "ts"), ("torch", "torch")) if not _found(module)]
    if not script.exists() and "torchserve" not in missing:
        missing.append(f"the torchserve script ({script})")
    if missing:
        return Check(
            "torchserve",
            False,
            f"{' and '.join(missing)} not installed for {sys.executable}",
            "install tsctl's dependencies there: uv sync (in tsctl's checkout) or pip install torchserve==0.12.0 torch",
            TORCHSERVE,
        )
    detail = f"torchserve {_version('torchserve')}, torch {_version('torch')} ({script})"
    return Check("torchserve", True, detail, None, TORCHSERVE)


JAVA_FIX = f"install a JDK {JAVA_MIN}+ (e.g. apt-get install openjdk-{JAVA_MIN}-jre-headless) and put its bin/ on PATH"


def java_check() -> Check:
    """The java TorchServe's launcher runs (ts/model_server.py): $JAVA_HOME/bin/java when JAVA_HOME is
    set, else java on PATH; ``java -version`` must say 17 or newer."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        java = str(Path(java_home) / "bin" / "java")
        where = f"JAVA_HOME={java_home}"
        if not os.access(java, os.X_OK):
            fix = f"point JAVA_HOME at a JDK {JAVA_MIN}+ (the directory holding bin/java) or unset it to use PATH's"
            return Check("java", False, f"{where} has no bin/java", fix, TORCHSERVE)
    else:
        java = shutil.which("java")
        where = "PATH"
        if java is None:
            return Check(
                "java", False, "no java on PATH and JAVA_HOME is not set", JAVA_FIX + ", or set JAVA_HOME", TORCHSERVE
            )
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("java", False, f"{java} (from {where}) does not run: {exc}", JAVA_FIX, TORCHSERVE)
    major, shown = java_major(done.stderr + done.stdout)
    if major is None:
        said = (done.stderr or done.stdout).strip().splitlines()[:1] or ["nothing"]
        detail = f"{java} (from {where}) did not say its version ('java -version' printed {said[0]!r})"
        return Check("java", False, detail, JAVA_FIX, TORCHSERVE)
    if major < JAVA_MIN:
        detail = f"Java {shown} at {java} (from {where}) is too old: TorchServe 0.12 needs Java {JAVA_MIN}+"
        fix = JAVA_FIX + (" instead" if where == "PATH" else f", or point JAVA_HOME at it ({where} now)")
        return Check("java", False, detail, fix, TORCHSERVE)
    return Check("java", True, f"Java {shown} at {java} (from {where})", None, TORCHSERVE)


def java_major(version_output: str):
    """(major, version as printed) from ``java -version``'s output: 'openjdk version "17.0.2"' -> 17,
    'java version "1.8.0_301"' -> 8; (None, None) when it says no version."""
    found = re.search(r'version "((\d+)(?:\.(\d+))?[^"]*)"', version_output)
    if not found:
        return None, None
    major = int(found.group(2))
    if major == 1 and found.group(3):  # 1.8 is Java 8
        major = int(found.group(3))
    return major, found.group(1)


def pip_check() -> Check:
    needed_for = "serve --install-deps, export kserve --offline"
    if _found("pip"):
        return Check("pip", True, f"pip {_version('pip')} in {sys.executable}", None, needed_for)
    fix = f"uv pip install --python {sys.executable} pip"
    detail = f"no pip in {sys.executable} (TorchServe's per-model install runs python -m pip)"
    return Check("pip", False, detail, fix, needed_for)


KSERVE_MODULES = ("kserve", "fastapi", "uvicorn", "grpc")  # what the tsctl engine serves HTTP and gRPC with


def kserve_check() -> Check:
    missing = [module for module in KSERVE_MODULES if not _found(module)]
    if missing:
        detail = f"{', '.join(missing)} not importable in {sys.executable}"
        fix = (
            "install tsctl's kserve extra: uv sync --extra kserve (in tsctl's checkout) or pip install 'tsctl[kserve]'"
        )
        return Check("kserve-extra", False, detail, fix, "--engine tsctl")
    detail = f"kserve {_version('kserve')}, fastapi {_version('fastapi')}"
    return Check("kserve-extra", True, detail, None, "--engine tsctl")


def mlserver_check(runtimes: Path) -> Check:
    """MLServer runs from this Python when it has it, else from the Python ``--python`` names: 'make
    runtimes' builds one in the checkout (samples/runtime_env.py), which is looked for too."""
    from .mlserver import REQUIREMENT

    needed_for = "--engine mlserver"
    if _found("mlserver"):
        return Check("mlserver", True, f"MLServer {_version('mlserver')} in {sys.executable}", None, needed_for)
    venv_python = Path(runtimes) / f"mlserver-{REQUIREMENT.split('==')[1]}" / "bin" / "python"
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('mlserver') and u.find_spec('ts') else 1)"
    if venv_python.is_file():
        try:
            usable = subprocess.run([str(venv_python), "-c", probe], capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            usable = False
        if usable:
            detail = f"not in {sys.executable}, but in {venv_python}: serve with --python {venv_python}"
            return Check("mlserver", True, detail, None, needed_for)
    detail = f"MLServer is neither in {sys.executable} nor in {venv_python}"
    fix = f"run 'make runtimes' in tsctl's checkout and serve with --python {venv_python}"
    fix += f" (or --python any Python with {REQUIREMENT} and torchserve)"
    return Check("mlserver", False, detail, fix, needed_for)


def uv_check() -> Check:
    """``export kserve --runtime`` locks requirements with ``python -m uv`` (archiver/kserve_images.py)."""
    needed_for = "export kserve --runtime"
    if _found("uv"):
        return Check("uv", True, f"uv {_version('uv')} in {sys.executable} (python -m uv)", None, needed_for)
    fix = f"uv pip install --python {sys.executable} uv (or pip install uv there)"
    return Check("uv", False, f"no uv module in {sys.executable} (the export runs python -m uv)", fix, needed_for)


def archiver_check() -> Check:
    needed_for = "archives made with torch-model-archiver, tsctl's tests"
    if _found("model_archiver"):
        detail = f"torch-model-archiver {_version('torch-model-archiver')}"
        return Check("torch-model-archiver", True, detail, None, needed_for)
    fix = "pip install torch-model-archiver==0.12.0 (tsctl package does not need it)"
    return Check("torch-model-archiver", False, f"not installed in {sys.executable}", fix, needed_for)


def gpu_check(python: str = sys.executable) -> Check:
    """The GPUs the servers would give workers (serving/gpus.py: CUDA_VISIBLE_DEVICES, else NVML's list), the
    driver, and whether ``python``'s torch sees as many (a CPU build of torch, or one built for a newer CUDA
    than the driver, sees none). No GPU is fine: workers run on the CPU."""
    from serving import gpus

    needed_for = "GPUs (number_of_gpu, deviceType: gpu, --gpu)"
    driver, why = gpus.nvml_driver()
    found = gpus.count_gpus()
    if not found:
        detail = f"no GPU ({why or 'the driver lists none'}): workers run on the CPU"
        return Check("gpu", True, detail, None, needed_for)
    listed = ", ".join(f"{i}: {d.name} ({d.memory_total_mib:,} MiB)" for i, d in sorted(gpus.sample_devices().items()))
    code = "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        version, cuda, seen = done.stdout.split()
    except (OSError, ValueError, subprocess.TimeoutExpired):
        fix = f"install torch in {python} ('make venv')"
        return Check(
            "gpu", False, f"{found} GPU(s) [{listed}], driver {driver}; {python} cannot import torch", fix, needed_for
        )
    detail = f"{found} GPU(s) [{listed}], driver {driver}; torch {version} (CUDA {cuda}) sees {seen}"
    if int(seen) < found:
        fix = (
            f"install a CUDA build of torch that driver {driver} runs (pip install torch --index-url "
            "https://download.pytorch.org/whl/cu126), or set CUDA_VISIBLE_DEVICES to the GPUs it should use"
        )
        return Check("gpu", False, detail, fix, needed_for)
    return Check("gpu", True, detail, None, needed_for)


def disk_checks(min_free: int = MIN_FREE) -> List[Check]:
    """Free space where served archives are unpacked (the state directory, .tsctl/ under the current
    directory) and where pip and uv download (TMPDIR): below ``min_free`` is short."""
    checks = [_disk("disk-cwd", Path.cwd(), "the current directory", "serve: archives unpacked in .tsctl/", min_free)]
    needed_for = "pip and uv downloads: torch wheels"
    tmpdir = os.environ.get("TMPDIR")
    if tmpdir and not (Path(tmpdir).is_dir() and os.access(tmpdir, os.W_OK | os.X_OK)):
        detail = f"TMPDIR={tmpdir} is not a writable directory (pip, uv and Python would fall back to another)"
        checks.append(Check("disk-tmp", False, detail, f"create {tmpdir} or unset TMPDIR", needed_for))
    else:
        what = "TMPDIR" if tmpdir else "the temporary directory"
        checks.append(_disk("disk-tmp", Path(tmpdir or tempfile.gettempdir()), what, needed_for, min_free))
    return checks


def _disk(name: str, path: Path, what: str, needed_for: str, min_free: int) -> Check:
    free = shutil.disk_usage(path).free
    detail = f"{free / (1 << 30):.1f} GiB free in {path} ({what})"
    if free >= min_free:
        return Check(name, True, detail, None, needed_for)
    elsewhere = "point TMPDIR at a bigger disk" if name == "disk-tmp" else "work from a bigger disk"
    fix = f"free space there (at least {min_free / (1 << 30):.0f} GiB), or {elsewhere}"
    return Check(name, False, detail, fix, needed_for)
