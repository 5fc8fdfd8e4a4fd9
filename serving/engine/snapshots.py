"""TorchServe's config snapshots, as its FSSnapshotSerializer writes them and `torchserve --start` without
``--ts-config`` reads the newest back: ``LOG_LOCATION/config/<yyyyMMddHHmmssSSS>-<kind>.cfg``, a properties
file holding the server's config and a ``model_snapshot`` of every model version it serves, with its settings
(kind: ``startup``, ``snapshot`` after each management call that changed them, ``shutdown``).

The tsctl engine writes them where it is told (``--snapshot_dir``; `tsctl serve` gives ``HOME/logs/config``,
where the TorchServe it starts writes its own), so that what was registered, scaled or unregistered through
the management API outlives a restart: `tsctl serve --last-snapshot` serves the newest one either wrote.
"""

import datetime
import json
import logging
import re
import time
from pathlib import Path
from typing import Dict, Optional

logger = logging.getLogger(__name__)

SNAPSHOT_FILE = re.compile(r"^\d{17}-\w+\.cfg$")  # TorchServe's name: a local time to the millisecond, a kind
DROPPED = ("model_snapshot", "load_models")  # the models are the snapshot's own


def file_name(kind: str, now: Optional[datetime.datetime] = None) -> str:
    """The snapshot's file name, as TorchServe's SnapshotManager makes it (its local time, in ms)."""
    now = now or datetime.datetime.now()
    return f"{now.strftime('%Y%m%d%H%M%S')}{now.microsecond // 1000:03d}-{kind}.cfg"


def model_state(versions) -> Dict[str, Dict[str, dict]]:
    """``model_snapshot``'s ``models`` of a server's ModelVersions: name -> version -> the settings TorchServe's
    Model.getModelState keeps (its archive's file name in the store, workers, batching, timeouts)."""
    models: Dict[str, Dict[str, dict]] = {}
    for name, by_version in versions.versions.items():
        default = versions.defaults.get(name)
        for version, model in by_version.items():
            spec = model.spec
            state = {"defaultVersion": model is default, "marName": spec.archive.name, **spec.describe_settings()}
            if spec.startup_timeout is not None:
                state["startupTimeout"] = spec.startup_timeout
            models.setdefault(name, {})[version] = state
    return models


class Snapshots:
    """Where one server's snapshots go, its config's properties, and what it serves (``versions``)."""

    def __init__(self, directory: Path, properties: Dict[str, str], versions):
        self.directory = Path(directory)
        self.properties = {k: v for k, v in properties.items() if k not in DROPPED}
        self.versions = versions

    def save(self, kind: str) -> Optional[Path]:
        """Write one snapshot of ``kind``; its path, or None when it could not be written (said in the
        log: a server goes on serving without its snapshot, as TorchServe does)."""
        import javaproperties

        name = file_name(kind)
        models = model_state(self.versions)
        snapshot = {
            "name": name,
            "modelCount": sum(len(v) for v in models.values()),
            "created": int(time.time() * 1000),
            "models": models,
        }
        path = self.directory / name
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(path, "x", encoding="utf-8") as out:  # one already of that name is kept, as TorchServe does
                properties = {**self.properties, "model_snapshot": json.dumps(snapshot, indent=2)}
                javaproperties.dump(properties, out, comments="Saving snapshot")
        except OSError as exc:
            logger.error("the snapshot %s was not saved: %s", path, exc)
            return None
        return path


def latest(directory: Path) -> Optional[Path]:
    """The newest snapshot in ``directory`` by the time its name holds (TorchServe's getLastSnapshot), or None:
    the names start with that time, at a fixed width, so the greatest name is the newest."""
    found = [p for p in Path(directory).glob("*.cfg") if p.is_file() and SNAPSHOT_FILE.match(p.name)]
    return max(found, key=lambda p: p.name, default=None)
