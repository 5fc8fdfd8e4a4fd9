"""A worker's Unix socket path fits, whatever ``--home`` is (issue #31, item 8).

Each server puts its workers' sockets under its TEMP (``home/tmp``, or a short private directory when
that is too deep), one level deeper for the tsctl engine and MLServer's runtime (serving/worker/sockets.py).
A ``--home`` of 68-84 bytes once failed every worker of the tsctl engine with "AF_UNIX path too long"
(TEMP was chosen for TorchServe's ``TEMP/.ts.sock.PORT`` alone), while TorchServe worked at 80. Here:
the TEMP chosen for every home length from 30 to 130 bytes gives each engine's socket a path that fits,
and keeps ``home/tmp`` whenever it does; a socket that cannot fit is refused in one line naming its
path and the fix; and the engines, served from homes of lengths on either side of their boundaries,
come up and answer, their real sockets where ``socket_below`` says.
"""

import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from archiver import engines, properties, server
from archiver.engines import torchserve_launch
from archiver.engines.mlserver import MLSERVER_SOCKET
from archiver.errors import UserError
from helpers.hostile import build, scripted
from helpers.paths import short_tmp
from samples import runtime_env
from serving.worker import sockets

ENGINE_SOCKET = sockets.socket_below(sockets.ENGINE, sockets.engine_port(1))  # the tsctl engine, one model
BELOW = {"TorchServe": sockets.socket_below(), "tsctl engine": ENGINE_SOCKET, "MLServer": MLSERVER_SOCKET}
BODY = b'{"instances": [[1, 2, 3, 4]]}'
V2_BODY = b'{"inputs": [{"name": "input-0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}'  # MLServer's


def home_of_length(length: int) -> Path:
    """A new directory whose absolute path is ``length`` bytes."""
    base = short_tmp("sk-")
    home = base / ("h" * (length - len(str(base)) - 1))
    assert len(str(home)) == length, (home, length)
    home.mkdir()
    return home


def boundary(below: str) -> int:
    """The longest home whose own tmp/ holds a socket ``below`` it."""
    return sockets.MAX_PATH - len(below) - len("/tmp")


def test_the_boundaries_are_where_the_issue_found_them():
    assert boundary(ENGINE_SOCKET) == 67  # homes of 68-84 bytes kept their tmp/ (then up to 88 bytes) and failed
    assert boundary(sockets.socket_below()) == 88  # TorchServe at 80 worked
    assert boundary(MLSERVER_SOCKET) == 65


@pytest.mark.parametrize("engine", list(BELOW))
def test_every_home_length_gives_each_engine_a_socket_that_fits(engine):
    below = BELOW[engine]
    for length in range(30, 131):
        home = home_of_length(length)
        try:
            temp = server.check_home(home, below)
            assert sockets.fits(f"{temp}{below}"), (engine, length, temp)
            assert (temp == home / "tmp") == (length <= boundary(below)), (
                engine,
                length,
                temp,
            )  # moved only when needed
        finally:
            server.remove_temp(home)
            shutil.rmtree(home.parent)


def test_a_socket_that_cannot_fit_anywhere_is_refused_in_one_line_naming_it(monkeypatch):
    deep, home = home_of_length(100), home_of_length(90)
    monkeypatch.setenv("TMPDIR", str(deep))  # where the short directory would go is itself too deep
    monkeypatch.setattr(tempfile, "tempdir", None)
    try:
        with pytest.raises(UserError) as caught:
            server.check_home(home, ENGINE_SOCKET)
        said = str(caught.value)
        assert "\n" not in said and f"{deep}/tsctl-" in said and "/.ts.sock.9099 (" in said, said
        assert "past the 107 bytes" in said and "TMPDIR=/tmp" in said, said
        assert not list(deep.iterdir()), "the refused directory was left behind"
    finally:
        shutil.rmtree(deep.parent)
        shutil.rmtree(home.parent)


def test_a_worker_refuses_a_socket_path_too_long_before_it_starts():
    path = "/tmp/" + "s" * 95 + "/.ts.sock.9000"
    with pytest.raises(
        sockets.SocketPathError, match=r"a worker's socket would be /tmp/s+/\.ts\.sock\.9000 \(114 bytes"
    ):
        sockets.check(path)
    sockets.check(path.replace("s" * 95, "s" * 88))  # 107 bytes: fits


# ---- served from homes around each boundary --------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("sockets")
    build(root, "tensor", "tensor", scripted(root / "tensor.pt", torch.nn.Linear(4, 2)), "batchSize: 1\n")
    return root / "store"


def serve_and_ask(engine: str, store: Path, length: int, **options):
    """``engine`` serving ``store`` from a home of ``length`` bytes: its answer (status, body), the path
    of each worker socket it made, and the path ``socket_below`` computed for them."""
    home = home_of_length(length)
    row = home.parent / "row.json"
    row.write_bytes(V2_BODY if engine == "mlserver" else BODY)
    try:
        if engine == "torchserve":
            config = properties.write_config(store, home.parent / "config.properties")
            srv = torchserve_launch.start(config, store, home, timeout=240)
        else:
            srv = engines.ENGINES[engine].start(store, home=home, timeout=240, **options)
        try:
            answer = engines.predict(srv, "tensor", row, 60)
            temp = (home / "tmp").resolve()
            found = [str(p) for p in temp.rglob(".ts.sock.*") if p.is_socket()]
        finally:
            engines.engine_of(srv).stop(srv)
        below = {"torchserve": sockets.socket_below(), "tsctl": ENGINE_SOCKET, "mlserver": MLSERVER_SOCKET}[engine]
        return answer, found, f"{temp}{below}"
    finally:
        shutil.rmtree(home.parent, ignore_errors=True)


def check_served(answer, found, computed, length):
    status, body = answer
    assert status == 200, (length, body)
    assert found, f"home of {length} bytes: no worker socket found"
    for path in found:  # where socket_below says: as long as computed (its port has as many digits)
        assert sockets.fits(path) and len(path) == len(computed), (path, computed)


def test_the_tsctl_engine_serves_from_a_home_of_80_bytes(store):
    """The issue's home (every worker failed with "AF_UNIX path too long"); about 8 s."""
    check_served(*serve_and_ask("tsctl", store, 80), 80)


@pytest.mark.matrix  # about 30 s: four starts
@pytest.mark.parametrize("length", [67, 68, 84, 85])
def test_the_tsctl_engine_serves_from_homes_around_its_boundary(store, length):
    check_served(*serve_and_ask("tsctl", store, length), length)


@pytest.mark.matrix  # about 40 s: three starts of TorchServe
@pytest.mark.parametrize("length", [80, 88, 89])
def test_torchserve_serves_from_homes_around_its_boundary(store, length):
    check_served(*serve_and_ask("torchserve", store, length), length)


@pytest.mark.matrix  # about 90 s: MLServer starts slowly
@pytest.mark.parametrize("length", [65, 66, 70])
def test_mlserver_serves_from_homes_around_its_boundary(store, length):
    python = str(runtime_env.ensure_mlserver())
    check_served(*serve_and_ask("mlserver", store, length, python=python), length)
