"""Worker memory: limited like a pod's, peak read from /proc."""

import time
from pathlib import Path


class MemoryLimit:
    """Put a worker process under a memory limit, as a pod limit would: a memory cgroup (v2 or v1)
    where this machine lets us make one, else RLIMIT_AS (allocations beyond it fail instead of the
    process being killed). Either way an attack that balloons the worker shows as a failed or
    restarted worker, never as a machine swapping to death. ``kind`` says which was used.
    ``pid=None``: the cgroup alone (None where none can be made), for a process to ``join()`` as it
    starts."""

    def __init__(self, pid, limit: int):
        self.pid, self.limit, self.cgroup = pid, limit, None
        self.kind = self._cgroup() or (self._rlimit() if pid is not None else None)

    def _cgroup(self):
        import uuid

        name = f"tsctl-test-{uuid.uuid4().hex[:8]}"
        layouts = [
            (Path("/sys/fs/cgroup"), "memory.max", "cgroup v2"),
            (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes", "cgroup v1"),
        ]
        for root, limit_file, kind in layouts:
            if kind == "cgroup v2" and "memory" not in _read(root / "cgroup.subtree_control"):
                continue
            group = root / name
            try:
                group.mkdir()
                (group / limit_file).write_text(str(self.limit))
                if self.pid is not None:
                    (group / "cgroup.procs").write_text(str(self.pid))
            except OSError:
                if group.exists():
                    group.rmdir()
                continue
            self.cgroup = group
            return kind
        return None

    def join(self):
        """Put the calling process in the cgroup: a child's ``preexec_fn``, so that it starts (and
        reads its memory limit) inside it, its own children with it."""
        import os

        (self.cgroup / "cgroup.procs").write_text(str(os.getpid()))

    def _rlimit(self):
        import resource

        size = int(_read(Path(f"/proc/{self.pid}/status"), "VmSize:").split()[0]) * 1024
        resource.prlimit(self.pid, resource.RLIMIT_AS, (size + self.limit, size + self.limit))
        return "RLIMIT_AS"

    def peak(self):
        """The most memory the cgroup's processes held at once, in bytes (v2's ``memory.peak``, v1's
        ``memory.max_usage_in_bytes``); None without a cgroup, or on a kernel that does not keep it."""
        for name in ("memory.peak", "memory.max_usage_in_bytes"):
            text = _read(self.cgroup / name).strip() if self.cgroup is not None else ""
            if text.isdigit():
                return int(text)
        return None

    def release(self):
        """Remove the cgroup once its process is gone (the server was stopped)."""
        if self.cgroup is not None:
            for _ in range(50):
                try:
                    self.cgroup.rmdir()
                    return
                except OSError:
                    time.sleep(0.2)


def _read(path: Path, prefix: str = "") -> str:
    try:
        text = path.read_text()
    except OSError:
        return ""
    if not prefix:
        return text
    return next((line[len(prefix) :] for line in text.splitlines() if line.startswith(prefix)), "")


def peak_rss(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM), in bytes."""
    return int(_read(Path(f"/proc/{pid}/status"), "VmHWM:").split()[0]) * 1024


def reset_peak(pid: int) -> int:
    """Reset the process's peak resident memory (VmHWM) to what it holds now, and return that."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return peak_rss(pid)
