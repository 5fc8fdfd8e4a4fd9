"""podman on this machine, for the test that builds and runs the tsctl engine's runtime image as docs/kserve.md
shows it (tests/export/test_kserve_image.py): whether it can build at all (``missing``), and the settings it
needs where its defaults cannot start a container (``settings``: a containers.conf for CONTAINERS_CONF).

Where podman's defaults fail, two things have been seen (docs/kserve.md says which and why):

- crun refuses a cgroup v1 hierarchy beside a v2 one that has controllers ("cgroups in hybrid mode not
  supported, drop all controllers from cgroupv2"), with ``--cgroups=disabled`` too; runc runs there;
- podman 4.3's rlimits for a container (open files 1048576; processes 1048576 once open files are set)
  are above the hard limits of the machine and root lacks CAP_SYS_RESOURCE to raise them: setrlimit fails
  with EPERM. Limits at or below what podman itself runs with work (it runs with 32768 processes).
"""

import os
import resource
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional, Tuple

CACHE = Path("/var/cache/tsctl-image")  # docs/kserve.md's kserve-image-base block: the root and the base, made once
BASE = "localhost/bookworm-python:3.11"
PODMAN_NPROC = 32768  # the process limit podman 4.3 runs with: a container cannot be given more
TOOLS = {"podman": "podman", "debootstrap": "debootstrap", "curl": "curl"}  # tool: its Debian package


def missing() -> Optional[str]:
    """Why the image cannot be built here at all (not root, a tool not installed), or None."""
    if os.geteuid() != 0:
        return "needs root: debootstrap, chroot and rootful podman (docs/kserve.md)"
    for tool, package in TOOLS.items():
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package})"
    return None


def run_problem(env: dict) -> Optional[str]:
    """podman's last line when it cannot run a container of the base image with ``env``, else None."""
    done = subprocess.run(
        ["podman", "run", "--rm", "--network=none", BASE, "true"], env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]


def conf_text() -> str:
    """runc, and rlimits at the hard limits of this process (processes: at most podman's own)."""
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    processes = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], PODMAN_NPROC)
    return (
        "# podman's settings where its defaults cannot start a container (tests/helpers/containers.py)\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={files}:{files}", "nproc={processes}:{processes}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )


def settings() -> Tuple[Optional[Path], List[str]]:
    """(CONTAINERS_CONF, []) for podman here: None when its defaults run containers; else a containers.conf
    written to CACHE that does. (None, [why each try failed]) when none does."""
    problem = run_problem(dict(os.environ))
    if problem is None:
        return None, []
    tried = [f"podman's defaults: {problem}"]
    if shutil.which("runc") is None:
        return None, tried + ["runc is not installed (apt-get install runc)"]
    conf = CACHE / "containers.conf"
    conf.write_text(conf_text())
    problem = run_problem(dict(os.environ, CONTAINERS_CONF=str(conf)))
    if problem is None:
        return conf, tried
    return None, tried + [f"runc with rlimits within the hard limits ({conf}): {problem}"]
