"""The CPU a worker may use: its cgroup's quota, as a pod's CPU limit sets it.

A container sees every core of its node (``os.cpu_count()``, torch's default thread count) while
its CPU limit is a CFS quota: a worker that runs one thread per visible core under a limit of one
core spends most of its time throttled (``docs/capacity.md``: resnet18 at 3.5 instead of 16.7
req/s). ``cores()`` is the quota in whole cores (at least 1), or None where no quota applies;
``usable()`` the cores a process may keep busy, the ones it may run on within that quota. ``cores`` reads
the process's own group and each parent up to the root, the smallest quota counting:

- cgroup v2: ``cpu.max`` (``"max 100000"``: none; ``"150000 100000"``: 1.5 cores);
- cgroup v1: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` in the ``cpu`` controller (-1: none).
"""

import os
from typing import Iterator, Optional, Tuple

PROC_CGROUP = "/proc/self/cgroup"
ROOT = "/sys/fs/cgroup"


def cores(proc_cgroup: str = PROC_CGROUP, root: str = ROOT) -> Optional[int]:
    """The CPU quota of this process's cgroups in whole cores (rounded down, at least 1); None without one."""
    quotas = [quota / period for quota, period in _quotas(proc_cgroup, root) if quota > 0 and period > 0]
    return max(1, int(min(quotas))) if quotas else None


def visible() -> int:
    """The cores this process may run on: its CPU affinity (what a container sees of its node)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def usable(proc_cgroup: str = PROC_CGROUP, root: str = ROOT) -> int:
    """The cores this process may keep busy: those it may run on (``visible``), within its cgroup's quota.
    What the tsctl engine divides among a model's workers (OMP_NUM_THREADS) and TorchServe counts as its
    default workers per model."""
    seen = visible()
    return max(1, min(seen, cores(proc_cgroup, root) or seen))


def _quotas(proc_cgroup: str, root: str) -> Iterator[Tuple[int, int]]:
    try:
        with open(proc_cgroup) as lines:
            entries = [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return
    for entry in entries:
        if len(entry) != 3:
            continue
        _, controllers, path = entry
        if controllers == "":  # v2's one hierarchy
            for group in _ancestry(os.path.join(root, "unified") if _is_hybrid(root) else root, path):
                yield _v2(os.path.join(group, "cpu.max"))
        elif "cpu" in controllers.split(","):
            mount = next((m for m in (controllers, "cpu,cpuacct", "cpu") if os.path.isdir(os.path.join(root, m))), None)
            if mount is not None:
                for group in _ancestry(os.path.join(root, mount), path):
                    yield _v1(group)


def _is_hybrid(root: str) -> bool:
    return os.path.isdir(os.path.join(root, "unified"))


def _ancestry(mount: str, path: str) -> Iterator[str]:
    """``mount``/``path`` and each parent directory up to ``mount`` itself."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    for depth in range(len(parts), -1, -1):
        yield os.path.join(mount, *parts[:depth])


def _v2(cpu_max: str) -> Tuple[int, int]:
    try:
        with open(cpu_max) as file:
            quota, period = (file.read().split() + ["", ""])[:2]
    except OSError:
        return -1, 0
    return (int(quota), int(period)) if quota.isdigit() and period.isdigit() else (-1, 0)


def _v1(group: str) -> Tuple[int, int]:
    return _read_int(os.path.join(group, "cpu.cfs_quota_us")), _read_int(os.path.join(group, "cpu.cfs_period_us"))


def _read_int(path: str) -> int:
    try:
        with open(path) as file:
            return int(file.read().strip())
    except (OSError, ValueError):
        return -1
