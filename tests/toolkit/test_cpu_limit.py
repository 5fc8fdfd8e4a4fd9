"""A worker's thread count follows its CPU quota (a pod's CPU limit), not the cores it can see."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from handlers import cpu_limit

ROOT = Path(__file__).resolve().parents[2]


def tree(tmp_path, cgroup: str, files: dict) -> tuple:
    """A fake /proc/self/cgroup and /sys/fs/cgroup: ``files`` maps paths under the root to contents."""
    (tmp_path / "cgroup").write_text(cgroup)
    for name, text in files.items():
        path = tmp_path / "sys" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path / "cgroup"), str(tmp_path / "sys")


@pytest.mark.parametrize(
    "cgroup, files, expected",
    [
        ("0::/\n", {"cpu.max": "max 100000\n"}, None),  # v2, no limit
        ("0::/pod/c1\n", {"pod/c1/cpu.max": "150000 100000\n", "cpu.max": "max 100000"}, 1),  # 1.5 cores: 1
        ("0::/pod/c1\n", {"pod/c1/cpu.max": "max 100000\n", "pod/cpu.max": "300000 100000"}, 3),  # the parent's
        ("0::/c\n", {"c/cpu.max": "50000 100000\n"}, 1),  # half a core: still one thread
        (
            "3:cpu,cpuacct:/kubepods/x\n",
            {"cpu,cpuacct/kubepods/x/cpu.cfs_quota_us": "200000", "cpu,cpuacct/kubepods/x/cpu.cfs_period_us": "100000"},
            2,
        ),  # v1
        ("1:cpu:/\n2:cpuacct:/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        ("1:cpu:/../../etc\n", {"cpu/cpu.cfs_quota_us": "100000", "cpu/cpu.cfs_period_us": "100000"}, 1),  # no escape
        ("garbage\n0::/x\n", {"x/cpu.max": "not numbers"}, None),
    ],
)
def test_the_quota_in_whole_cores(tmp_path, cgroup, files, expected):
    assert cpu_limit.cores(*tree(tmp_path, cgroup, files)) == expected


def test_no_cgroup_file_means_no_limit(tmp_path):
    assert cpu_limit.cores(str(tmp_path / "absent"), str(tmp_path)) is None


def test_a_process_in_a_real_cpu_cgroup_sizes_its_threads_by_the_quota():
    """A v1 cpu cgroup with a quota of one core on this machine: a process started in it reads 1 core and
    pick_threads gives its worker 1 thread, where outside it torch's default (the visible cores) applies."""
    mount = Path("/sys/fs/cgroup/cpu")
    group = mount / f"tsctl-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")
    except OSError as exc:
        pytest.skip(f"no cgroup v1 cpu controller to make a group in: {exc}")
    code = "from handlers import cpu_limit, loading; print(cpu_limit.cores(), loading.pick_threads(0, 1))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(ROOT)
    try:
        inside = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
        outside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    finally:
        group.rmdir()
    assert inside.stdout.split() == ["1", "1"], inside.stderr
    from handlers.loading import DEFAULT_THREADS

    assert outside.stdout.split()[1] == str(min(DEFAULT_THREADS, cpu_limit.cores() or DEFAULT_THREADS)), outside.stderr
