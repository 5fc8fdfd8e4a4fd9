"""A script run in a worker forked by a fork server (serving/worker/fork_server.py), as the engine forks one."""

import json
import os
from pathlib import Path
from typing import Optional

from serving.worker import fork_server


def forked_probe(server: fork_server.ForkServer, folder: Path, env: dict) -> Optional[dict]:
    """``folder/probe.py`` run in a worker forked by ``server`` in ``folder`` (its PYTHONPATH): the JSON of
    the last line it printed, or None when the server did not take it (the caller would spawn it)."""
    out_read, out_write = os.pipe()
    metrics_read, metrics_write = os.pipe()
    try:
        child = server.spawn(
            [str(folder / "probe.py")], str(folder), dict(env, PYTHONPATH=str(folder)), out_write, metrics_write
        )
    finally:
        os.close(out_write)
        os.close(metrics_write)
        os.close(metrics_read)
    with os.fdopen(out_read, "rb") as out:
        if child is None:
            return None
        assert child.wait(120) == 0
        return json.loads(out.read().decode().strip().splitlines()[-1])
