"""A worker's descendants: kept below it, and ended with it.

A handler may fork, and a forked child may fork again and leave the worker's session and process group
(``setsid``: a daemon, as a shell's ``cmd &`` or a library's daemonize makes one), so killing the
worker's process group misses it. Each worker therefore makes itself a child subreaper (``subreaper``,
Linux's PR_SET_CHILD_SUBREAPER, called by ``worker_launch.py``): a process below it whose parent ends is
reparented to the worker instead of to init, and so stays below it whatever session it is in.
``end_tree`` ends a process with everything below it (each stopped first, so that none forks meanwhile).
The fork server is a subreaper too (``fork_server.sweep``: what a worker leaves when it dies on its own
comes to the server, which ends it).

What still escapes (docs/limits.md): a process that a spawned worker (not forked: ``TSCTL_FORK_SERVER=0``,
an archive shadowing a preloaded module) leaves when it dies on its own, and what a worker leaves when its
fork server is killed from outside: both are reparented above the engine; and a handler that turns the
worker's subreaper off leaves its orphans to the fork server, ended at the next worker's exit. Standard
library only (run by path with the fork server).
"""

import os
import signal
from typing import Dict, List


def subreaper():
    """Make this process a child subreaper (Linux's PR_SET_CHILD_SUBREAPER): a process below it whose
    parent ends is reparented to it instead of to init, and stays below it."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # 36: PR_SET_CHILD_SUBREAPER
    except (AttributeError, OSError):  # no prctl: not Linux
        pass


def parents() -> Dict[int, int]:
    """Every live process's parent, from /proc (a zombie has no children: left out)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    fields = stat.read().rpartition(b")")[2].split()
            except OSError:  # ended meanwhile
                continue
            if fields and fields[0] != b"Z":
                found[int(entry)] = int(fields[1])
    return found


def children(pid: int) -> List[int]:
    """``pid``'s live children: read from the kernel's list of each of its threads' children
    (/proc/PID/task/TID/children, microseconds: fast enough to catch a child that changes its pid every few
    ms), else from every process's parent (``parents``, a read of all of /proc)."""
    try:
        found = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as listed:
                found.extend(int(child) for child in listed.read().split())
    except (OSError, ValueError):  # no such file: a kernel without CONFIG_PROC_CHILDREN
        return [child for child, parent in parents().items() if parent == pid]
    return [child for child in found if not zombie(child)]


def zombie(pid: int) -> bool:
    """Whether ``pid`` has ended and waits to be reaped (or is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[:1] in ([b"Z"], [b"X"], [])
    except OSError:
        return True


def end_tree(pid: int):
    """SIGKILL ``pid`` and every process below it. Each is stopped first (SIGSTOP), the tree read again
    until no new one shows (a stopped process forks no more, and a child of one killed would be
    reparented above), then all are killed."""
    stopped: List[int] = []
    while True:
        below, tree, added = parents(), {pid}, True
        while added:  # each pass adds the children of those found (a child's pid may be below its parent's)
            added = False
            for child, parent in below.items():
                if parent in tree and child not in tree:
                    tree.add(child)
                    added = True
        new = [p for p in tree if p not in stopped]
        if not new:
            break
        for process in new:
            try:
                os.kill(process, signal.SIGSTOP)
            except OSError:
                pass
        stopped.extend(new)
    for process in stopped:
        try:
            os.kill(process, signal.SIGKILL)
        except OSError:
            pass
