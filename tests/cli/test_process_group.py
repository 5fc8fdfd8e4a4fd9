"""server.group_members / group_alive (psutil): a process group's live members, zombies left out, as
`tsctl stop` waits for a server's frontend and workers to end."""

import os
import signal
import subprocess
import sys
import time

from archiver import server

# A leader with a sleeping child and a child that exits at once and is never reaped (a zombie); it prints
# both pids, then sleeps.
GROUP = """
import os, sys, time
sleeper = os.fork()
if sleeper == 0:
    time.sleep(60)
    os._exit(0)
zombie = os.fork()
if zombie == 0:
    os._exit(0)
print(sleeper, zombie, flush=True)
time.sleep(60)
"""


def is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_a_groups_live_members_are_found_and_its_zombies_are_not():
    leader = subprocess.Popen([sys.executable, "-c", GROUP], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        sleeper, zombie = map(int, leader.stdout.readline().split())
        assert wait_for(lambda: is_zombie(zombie))
        assert sorted(server.group_members(leader.pid)) == sorted([leader.pid, sleeper])
        assert server.group_alive(leader.pid)
        assert server.group_members(os.getpgid(0)) and os.getpid() in server.group_members(os.getpgid(0))
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
        leader.stdout.close()
    assert wait_for(lambda: not server.group_members(leader.pid))
    assert not server.group_alive(leader.pid)


def test_a_zombie_leader_alone_is_no_live_group():
    """killpg still finds a group whose leader is an unreaped zombie: group_alive asks for a live member."""
    leader = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    assert wait_for(lambda: is_zombie(leader.pid))
    os.killpg(leader.pid, 0)  # the zombie keeps the group id in use
    assert server.group_members(leader.pid) == []
    assert not server.group_alive(leader.pid)
    leader.wait()


def test_stop_ends_the_whole_group(tmp_path):
    leader = subprocess.Popen([sys.executable, "-c", GROUP], stdout=subprocess.PIPE, text=True, start_new_session=True)
    sleeper, _ = map(int, leader.stdout.readline().split())
    running = server.Server(leader.pid, str(tmp_path), "http://127.0.0.1:1", "http://127.0.0.1:1", "", [])
    assert server.stop(server=running, grace=5)
    assert not server.group_alive(leader.pid) and sleeper not in server.group_members(leader.pid)
    assert leader.poll() is not None  # reaped by stop
    leader.stdout.close()
