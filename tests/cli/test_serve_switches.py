"""``tsctl serve --host/--port/--disable-token-auth`` (issue #47): the address and port a user asks for, and
TorchServe's token switch, on TorchServe 0.12 and the tsctl engine alike, from a config that asks for tokens
(TorchServe's default). A port another process holds, a host that is no address of this machine, and a
switch a runtime does not have are each one line, exit 2, nothing started.

Each server runs as a user starts it (``tsctl serve`` as its own process) in its own home, stopped by the test
by its process group (server.json); about 20 s a runtime."""

import contextlib
import json
import shutil
import socket

import pytest
import torch

from archiver import properties, server
from helpers.engine import free_ports
from helpers.hostile import build, scripted
from helpers.paths import short_tmp
from helpers.processes import tsctl


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """model-store/ with a tensor model of a few weights; config/config.properties from tsctl config, with
    token authorization on as TorchServe 0.12's default."""
    root = tmp_path_factory.mktemp("switches")
    build(root, "tensor", "tensor", scripted(root / "tensor.pt", torch.nn.Linear(4, 2)), "batchSize: 1\n")
    (root / "store").rename(root / "model-store")
    config = properties.write_config(root / "model-store", root / "config" / "config.properties")
    text = config.read_text().replace("disable_token_authorization=true", "disable_token_authorization=false")
    config.write_text(text)
    assert "disable_token_authorization=false" in config.read_text()
    return root


def listening(port: int) -> set:
    """The local addresses listening on ``port`` (IPv4 and IPv6), from /proc/net/tcp*."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # LISTEN
                found.add(address)
    return found


@contextlib.contextmanager
def served(root, *args):
    """``tsctl serve --json ARGS`` in ``root`` with a home of its own: its report and Server, stopped after."""
    home = short_tmp("switch-")
    code, out, err = tsctl("serve", "--home", home, "--json", *args, cwd=root)
    srv = server.read_state(home)
    try:
        assert code == 0, out + err
        yield json.loads(out), srv
    finally:
        if srv is not None:
            server.stop(srv)
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("engine", ["tsctl", "torchserve"])
def test_the_port_host_and_token_switch_asked_for_are_served(root, engine):
    [port] = free_ports(1)
    with served(root, "--engine", engine, "--host", "0.0.0.0", "--port", port, "--disable-token-auth") as (report, srv):
        assert report["addresses"]["inference"] == f"http://127.0.0.1:{port}" and report["key_file"] is None, report
        assert listening(port) & {"00000000", "00000000000000000000000000000000"}, listening(port)  # every address
        body = json.dumps([[1, 2, 3, 4]]).encode()
        status, answer = server.request(
            f"http://127.0.0.1:{port}/predictions/tensor", body, "POST", {"Content-Type": "application/json"}, 60
        )  # no key sent
        assert status == 200, answer
        status, _ = server.request(f"{srv.management}/models", timeout=30)
        assert status == 200  # the management API too takes no key


def test_without_the_switch_the_config_asks_for_keys(root):
    """The control: the same config without --disable-token-auth, on a free port, refuses a call without a key."""
    with served(root, "--engine", "tsctl") as (report, srv):
        assert report["key_file"], report
        status, answer = server.request(f"{srv.inference}/ping", timeout=30)
        assert status == 400 and answer["type"] == "InvalidKeyException", answer


def test_a_port_in_use_or_a_host_not_here_is_one_line_and_nothing_starts(root):
    home = short_tmp("switch-")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for engine in ("tsctl", "torchserve"):
            code, out, err = tsctl("serve", "--engine", engine, "--home", home, "--port", port, cwd=root, timeout=60)
            assert code == 2 and out == "", err
            assert (
                err.strip() == f"error: --port {port}: 127.0.0.1:{port} is in use by another process: stop that "
                "process, or give --port another port"
            ), err
    code, _, err = tsctl("serve", "--home", home, "--host", "192.0.2.1", cwd=root)  # TEST-NET-1: no machine's
    assert code == 2 and err.strip().startswith("error: --host 192.0.2.1 is not an address of this machine"), err
    assert server.read_state(home) is None  # nothing was started


def test_a_switch_the_runtime_does_not_have_is_one_line(root):
    code, out, err = tsctl("serve", "--engine", "mlserver", "--disable-token-auth", cwd=root, timeout=60)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "--disable-token-auth" in lines[0], err
    assert "or serve with --engine torchserve" in lines[0], err
    code, out, err = tsctl("serve", "--port", "70000", cwd=root, timeout=60)
    assert code == 2 and "70000" in err and "Traceback" not in err, err
