"""A pod's CPU and memory limits around a server this machine starts: ``tsctl bench --capacity --cpu 1.5
--memory 4Gi``.

``PodLimits.make(cpu, memory)`` makes a cgroup of its own per controller: cgroup v1 (``cpu.cfs_quota_us`` over
a 100 ms ``cpu.cfs_period_us``, ``memory.limit_in_bytes``) or v2 (``cpu.max``, ``memory.max``), as a
child of the cgroup this process is in (else of the hierarchy's root), as a container runtime does for
a pod's ``resources.limits``. Where none can be made (no permission, no such controller, another
layout) it says why in ``reason`` and limits nothing: the server then runs without.

The server joins the groups as it is started: ``with limits.joined():`` moves this process into them,
every process the server forks while it starts (TorchServe's JVM and workers, the engine's fork server
and workers, MLServer's workers) is born inside, and the block's end moves this process back, so that
the load generator is not limited. ``release()`` removes the groups once the server has stopped.
"""

import errno
import os
import re
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional, Tuple

from ..errors import UserError

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000  # the CFS period a quota is a share of (Kubernetes' and Docker's default)
MIN_QUOTA_US = 1_000  # the kernel's smallest quota; the kubelet raises a smaller one to it (MinQuotaPeriod)
UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?\s*$", re.IGNORECASE)


def parse_memory(text: str) -> int:
    """``--memory`` as Kubernetes writes a quantity: bytes, ``512Mi``/``4Gi`` (powers of 1024) or
    ``500M``/``4G`` (powers of 1000); a UserError for anything else or below 64 MiB."""
    found = MEMORY.match(text or "")
    if not found:
        raise UserError(f"--memory {text!r} must be bytes or a quantity such as 512Mi, 4Gi or 4G")
    size = int(float(found.group(1)) * UNITS[(found.group(2) or "").lower()])
    if size < 64 * 2**20:
        raise UserError(f"--memory {text} is below 64Mi: no server starts in that")
    return size


def _own_path(controller: str) -> Optional[str]:
    """This process's cgroup in ``controller``'s v1 hierarchy ("" for v2's), from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if (controller == "" and names == "") or controller in names.split(","):
            return path
    return None


class PodLimits:
    """The cgroups a server runs in (``groups``: (group, the cgroup this process came from)); ``kind`` is
    "cgroup v1" or "cgroup v2", None with ``reason`` saying why nothing is limited."""

    def __init__(self, cpu: Optional[float] = None, memory: Optional[int] = None):
        self.cpu, self.memory = cpu, memory
        self.groups: List[Tuple[Path, Path]] = []
        self.kind: Optional[str] = None
        self.reason: Optional[str] = None

    @classmethod
    def make(cls, cpu: Optional[float], memory: Optional[int]) -> "PodLimits":
        if cpu is not None and cpu * PERIOD_US < MIN_QUOTA_US:  # --cpu 1m, as the kubelet writes it: 0.01
            cpu = MIN_QUOTA_US / PERIOD_US
        limits = cls(cpu, memory)
        if cpu is None and memory is None:
            return limits
        name = f"tsctl-capacity-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        unified = (ROOT / "cgroup.controllers").is_file()
        try:
            if unified:
                limits._make_v2(name)
            else:
                limits._make_v1(name)
            limits.kind = "cgroup v2" if unified else "cgroup v1"
        except OSError as exc:
            limits.release()
            if exc.errno == errno.EINVAL:  # the hierarchy is there, the kernel refuses the value
                given = [f"--cpu {cpu:g}" if cpu is not None else "", f"--memory {memory}" if memory else ""]
                raise UserError(
                    f"{' '.join(filter(None, given))}: the kernel refuses it as a cgroup limit: give the "
                    "pod's own limits"
                ) from None
            limits.groups, limits.cpu, limits.memory = [], None, None
            limits.reason = f"no cgroup could be made here ({exc.strerror or exc})"
        return limits

    def _writes(self, controller: str, v2: bool) -> List[Tuple[str, str]]:
        """The files to write in ``controller``'s group, and what (none: the controller is not limited)."""
        if controller == "cpu" and self.cpu is not None:
            quota = str(round(self.cpu * PERIOD_US))
            if v2:
                return [("cpu.max", f"{quota} {PERIOD_US}")]
            return [("cpu.cfs_period_us", str(PERIOD_US)), ("cpu.cfs_quota_us", quota)]
        if controller == "memory" and self.memory is not None:
            return [("memory.max" if v2 else "memory.limit_in_bytes", str(self.memory))]
        return []

    def _make_v1(self, name: str):
        for controller in ("cpu", "memory"):
            writes = self._writes(controller, v2=False)
            if not writes:
                continue
            hierarchy = ROOT / controller
            if not (hierarchy / "cgroup.procs").is_file():
                raise OSError(f"no cgroup v1 {controller} controller at {hierarchy}")
            own = hierarchy / (_own_path(controller) or "/").lstrip("/")
            self.groups.append((self._child(own, hierarchy, name, writes), own))

    def _make_v2(self, name: str):
        own = ROOT / (_own_path("") or "/").lstrip("/")
        writes = self._writes("cpu", v2=True) + self._writes("memory", v2=True)
        self.groups.append((self._child(own, ROOT, name, writes), own))

    @staticmethod
    def _child(own: Path, root: Path, name: str, writes) -> Path:
        """A new group below ``own`` (else below ``root``) with ``writes`` made, or the last OSError."""
        error = None
        for parent in dict.fromkeys((own, root)):
            group = parent / name
            try:
                group.mkdir()
            except OSError as exc:
                error = exc
                continue
            try:
                for file, value in writes:
                    (group / file).write_text(value)
                return group
            except OSError as exc:
                error = exc
                group.rmdir()
        raise error

    @contextmanager
    def joined(self):
        """This process (and so what it starts meanwhile) inside the groups for the block, then back."""
        moved = []
        try:
            for group, own in self.groups:
                (group / "cgroup.procs").write_text(str(os.getpid()))
                moved.append(own)
            yield
        finally:
            for own in moved:
                for place in (own, *own.parents):  # our own group, else the nearest one above that takes us
                    try:
                        (place / "cgroup.procs").write_text(str(os.getpid()))
                        break
                    except OSError:
                        continue

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` runs inside every group (the server did start inside its limits)."""
        return all(str(pid) in _read(group / "cgroup.procs").split() for group, _ in self.groups)

    def describe(self) -> str:
        """One line: what limits the server, or why nothing does."""
        if self.reason:
            return f"--cpu/--memory not applied: {self.reason}; the server runs without limits"
        given = [f"{self.cpu:g} CPU" if self.cpu is not None else "", f"{self.memory:,} bytes" if self.memory else ""]
        return f"the server runs in a {self.kind} of its own: {', '.join(g for g in given if g)}"

    def release(self, wait: float = 10):
        """Remove the groups (their processes exit first: up to ``wait`` seconds each)."""
        for group, _ in self.groups:
            deadline = time.monotonic() + wait
            while group.exists():
                try:
                    group.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
