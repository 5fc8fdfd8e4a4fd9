"""Workers admitted against the memory the engine has: the one check a register or a scale passes before
it starts a worker (management.py).

- **worker memory** (``admit``): the workers a register or a scale would add, each at the model's
  measured cost (``worker_cost``: the most any of its running workers holds of its own, /proc/PID/
  smaps_rollup's Private_Clean + Private_Dirty + Swap; a model with no worker running: the most any
  worker of the engine holds; no worker at all: 0), and the workers still starting (loading, or waiting
  to start again after they died: at their model's cost), must fit in what is left of the engine's
  memory: ``body_limit.memory_limit()`` (the smallest limit of its memory cgroup and those above it, the
  pod's, or the machine's memory) less the memory in use (``in_use``: that group's usage less its
  inactive file cache, as the kubelet counts a working set; the machine's MemTotal less MemAvailable)
  and, where a cgroup sets the limit, less the bound on request bodies in flight (``--max_inflight_bytes``:
  what bodies may yet hold). A cost of 0 (no worker measured yet) is admitted.
  Refused before anything starts, in TorchServe 0.12's shape for a scale that ran out of memory:
  507 InternalServerException "Failed to start workers for model NAME version: VERSION" (WorkerThread
  sets HTTP_ENTITY_TOO_LARGE on an OutOfMemoryError, WorkerThread.java:315-317;
  ApiUtils.updateModelWorkers makes the message and the InternalServerException, ApiUtils.java:306-311;
  ManagementRequestHandler.sendResponse maps 413 to 507, ManagementRequestHandler.java:293-302), the
  figures and the fix after it.

A scale down, an unregister and a register of 0 workers add nothing and pass. What it cannot see: a model's
first worker when no worker runs anywhere (cost 0: the group's own limit then bounds it, and its OOM kill
is answered as any worker's death), and a worker that grows after it was measured.
"""

import os
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

from . import body_limit

PRIVATE = ("Private_Clean:", "Private_Dirty:", "Swap:")  # smaps_rollup's lines of a process's own memory


class NotEnoughMemory(Exception):
    """A register or scale whose workers would not fit (``admit``): 507, its message the figures."""


@dataclass
class Memory:
    limit: int  # body_limit.memory_limit()
    source: str  # what sets it
    used: int  # in_use()
    reserved: int  # request bodies in flight may hold (--max_inflight_bytes)

    @property
    def left(self) -> int:
        return self.limit - self.used - self.reserved


def own_memory(pid: int) -> int:
    """What process ``pid`` holds of its own (no page it shares with its fork server or another worker), in
    bytes; 0 when it cannot be read (ended)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            lines = rollup.read().splitlines()
    except OSError:
        return 0
    return sum(int(line.split()[1]) * 1024 for line in lines if line.startswith(PRIVATE))


def in_use(folder: Optional[str]) -> int:
    """The memory in use where the limit is set: the cgroup ``folder``'s usage less its inactive file cache
    (v1 ``memory.usage_in_bytes``, ``total_inactive_file``; v2 ``memory.current``, ``inactive_file``), or
    the machine's MemTotal less MemAvailable (``folder`` None)."""
    if folder is None:
        info = stat_numbers("/proc/meminfo")
        return (info.get("MemTotal:", 0) - info.get("MemAvailable:", 0)) * 1024
    for usage_file, inactive in (("memory.usage_in_bytes", "total_inactive_file"), ("memory.current", "inactive_file")):
        usage = body_limit._read_number(os.path.join(folder, usage_file))
        if usage is not None:
            return max(0, usage - stat_numbers(os.path.join(folder, "memory.stat")).get(inactive, 0))
    return 0


def stat_numbers(path: str) -> Dict[str, int]:
    """``name value`` lines (memory.stat, /proc/meminfo) as numbers."""
    found = {}
    for line in body_limit._read_lines(path):
        fields = line.split()
        if len(fields) >= 2 and fields[1].isdigit():
            found[fields[0]] = int(fields[1])
    return found


def memory(reserved: int) -> Memory:
    """The memory the engine may use and what is left of it. ``reserved`` (the bound on bodies in flight)
    is kept aside only where a cgroup sets the limit (the pod's: the engine and its workers alone in it);
    on the machine's memory, other processes' use is in ``in_use`` already, and keeping a quarter of the
    machine aside refused every worker on a busy workstation (22 of 25 GB in use by others)."""
    limit, source, folder = body_limit.limiting_group()
    return Memory(limit, source, in_use(folder), reserved if folder is not None else 0)


def model_costs(models: Iterable) -> Dict[int, int]:
    """The most one running worker of each model holds of its own, by ``id(model)`` (0: none running): each
    worker's memory read once."""
    return {
        id(model): max((own_memory(w.process.pid) for w in model.workers if w.process and w.process.alive()), default=0)
        for model in models
    }


def worker_cost(model, costs: Dict[int, int]) -> int:
    """What one more worker of ``model`` (an workers.ModelWorkers, or None: one being registered)
    will hold: the most one of its running workers holds of its own; none running, the most any worker of
    the engine holds (``costs``: ``model_costs``)."""
    own = costs.get(id(model), 0) if model is not None else 0
    return own or max(costs.values(), default=0)


def admit(name: str, version: Optional[str], adding: int, model, models: List, reserved: int) -> None:
    """NotEnoughMemory when ``adding`` more workers of model ``name`` ``version`` (``model``: its
    ModelWorkers, None while it is being registered) would not fit in the memory left beside ``models``
    (the engine's) and ``reserved`` (the bound on request bodies in flight)."""
    if adding <= 0:
        return
    costs = model_costs(models)
    each = worker_cost(model, costs)
    if each == 0:
        return  # nothing measured yet (no worker runs): the cgroup's own limit bounds the first
    pending = sum(worker_cost(m, costs) for m in models for w in m.workers if w.status == "STARTING")
    have = memory(reserved)
    needed = adding * each
    if needed + pending <= have.left:
        return
    raise NotEnoughMemory(
        f"Failed to start workers for model {name} version: {version or 'null'}: {adding} more workers need "
        f"about {needed:,} bytes ({each:,} each, the most a running worker holds of its own), and "
        f"{max(0, have.left - pending):,} are left of {have.limit:,} ({have.source}: {have.used:,} in use, "
        f"{have.reserved:,} kept for request bodies in flight (--max_inflight_bytes)"
        + (f", {pending:,} for the workers starting" if pending else "")
        + "): ask for fewer workers, or give the engine more memory"
    )
