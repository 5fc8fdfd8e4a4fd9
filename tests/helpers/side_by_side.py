"""TorchServe 0.12 and the tsctl engine started on one tree (``config/config.properties``, ``model-store/``),
for the tests that send both the same calls; both stopped by their own process groups after."""

import contextlib
import shutil
from pathlib import Path

from archiver import server
from archiver.engines import torchserve_launch
from helpers.engine import Engine
from helpers.paths import short_tmp


@contextlib.contextmanager
def started(root: Path, prefix: str):
    """(torchserve, engine): TorchServe's ``server.Server`` (its home a short temporary directory named
    ``prefix``...) and the engine (helpers/engine.py), each ready."""
    home = short_tmp(prefix)
    ts_server = torchserve_launch.start(root / "config" / "config.properties", root / "model-store", home, timeout=300)
    engine = None
    try:
        engine = Engine(root).wait_ready()
        yield ts_server, engine
    finally:
        server.stop(ts_server)
        shutil.rmtree(home, ignore_errors=True)
        if engine is not None:
            assert engine.stop() == 0


def http_port(ts_server) -> int:
    return int(ts_server.inference.rsplit(":", 1)[1])
