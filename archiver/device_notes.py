"""What ``tsctl serve`` says before it starts about where the workers will run: a GPU asked for that this
machine does not have (``number_of_gpu`` in config.properties, a model-config.yaml's ``deviceType: gpu`` or
``deviceIds``), which every runtime turns into workers on the CPU, or into another list, without a word
(TorchServe logs a warning at most). The rules are serving/gpus.py's, TorchServe 0.12's."""

from pathlib import Path
from typing import List, Optional

from serving import config_properties, gpus, ts_config


def device_notes(config: Optional[str], model_store) -> List[str]:
    """A line for each GPU setting this machine cannot honour; none when the config or the store cannot be
    read (starting says why) or nothing asks for a GPU."""
    from handlers.archives import ArchiveError, opened

    try:
        properties = config_properties.with_environment(config_properties.read_properties(config)) if config else {}
        found = gpus.count_gpus()
        usable = gpus.number_of_gpu(properties, found)
        archives = served_archives(properties, config, Path(model_store))
    except (config_properties.ConfigError, gpus.PlacementError, OSError):
        return []
    note = gpus.number_of_gpu_note(properties, found, str(config))
    notes = [note] if note else []
    for archive in archives:
        try:
            with opened(archive) as found_archive:
                devices = gpus.model_devices(found_archive.config, usable, f"{archive.name}'s model-config.yaml")
        except (ArchiveError, gpus.PlacementError, OSError):
            continue  # the runtime says why it cannot serve it
        notes.extend(devices.notes)
    return notes


def served_archives(properties: dict, config: Optional[str], model_store: Path) -> List[Path]:
    """The archives a config's model_snapshot names in ``model_store``, else every archive of the store."""
    if properties.get("model_snapshot"):
        snapshot = ts_config.snapshot_of(properties, config)
        names = ts_config.snapshot_archives(snapshot)
        return [model_store / name for name in sorted(n for n in names if isinstance(n, str) and "/" not in n)]
    return ts_config.archives_in(model_store) if model_store.is_dir() else []
