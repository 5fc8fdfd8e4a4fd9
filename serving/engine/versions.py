"""The model versions a tsctl engine serves (``ModelVersions``): each an ``workers.ModelWorkers``,
by name and version, and each name's default; opened and added at start and by a management call's
register, removed by its unregister (serving/engine/management.py). ``open`` is the one place an archive
is opened for serving: unpacked, its signature checked when the engine has ``--public_key``."""

import itertools
import os
import shutil
from typing import Dict, List, Optional

from handlers.archives import Archive, opened

from .. import gpus, tree_digests
from ..frontend_settings import Frontend
from ..model_opening import open_model
from ..ts_config import ModelSpec
from ..worker import sockets
from .workers import ModelWorkers


class ModelVersions:
    """The model versions a server serves, by name and version, and each name's default version: opened
    and added at start and by a register, removed by an unregister (``remove``, then ``forget`` once
    their workers are told to end). ``metrics``: the server's (metrics.Metrics), for each version's
    observer and its workers' metric lines."""

    def __init__(self, frontend: Frontend, run_dir: str, decode_default=None, metrics=None, tree=None):
        self.frontend, self.run_dir, self.decode_default, self.metrics = frontend, run_dir, decode_default, metrics
        self.tree: Optional[tree_digests.Tree] = tree  # the pinned tree (--tree_digest): each archive checked
        self.versions: Dict[str, Dict[str, ModelWorkers]] = {}
        self.defaults: Dict[str, ModelWorkers] = {}
        self.numbers = itertools.count()  # each model version's number: its unpack folder and worker ids
        self.leaving: set = set()  # removed, their workers not ended yet (``forget``)
        self.placement = gpus.Placement(frontend.number_of_gpu)  # each new worker's GPU, across every model

    def open(self, spec: ModelSpec, archive: Optional[Archive] = None) -> ModelWorkers:
        """A model version's workers, not started: its archive (``archive``, opened already by a register,
        else ``spec.archive``) unpacked and checked (``open_model``): the one place startup and a register
        open an archive for serving. Refused, nothing of it stays on disk."""
        number = next(self.numbers)
        first_port = sockets.FIRST_PORT + sockets.PORTS_PER_MODEL * number
        unpack = os.path.join(self.run_dir, f"m{number}")
        on_metric = self.metrics.worker_metric if self.metrics is not None else None
        try:
            with opened(archive or spec.archive, within=spec.store) as found:
                if self.tree is not None and found.kind != "dir":  # the bytes opened, before any is unpacked
                    self.tree.check_archive(spec.archive.name, digest=found.file_digest())
                model = open_model(
                    spec,
                    self.frontend,
                    unpack,
                    first_port,
                    self.decode_default,
                    on_metric=on_metric,
                    archive=found,
                    placement=self.placement,
                )
                if self.tree is not None and found.kind == "dir":  # the copy its workers run
                    self.tree.check_archive(spec.archive.name, folder=str(model.model_dir))
        except BaseException:
            shutil.rmtree(unpack, ignore_errors=True)
            raise
        if self.metrics is not None:
            model.observe = self.metrics.observer(spec)
        model.unpack_dir = unpack
        return model

    def add(self, model: ModelWorkers):
        """Serve ``model`` (the default version of its name when it is the first, or its spec says so)."""
        spec = model.spec
        self.versions.setdefault(spec.name, {})[spec.version] = model
        if spec.default or spec.name not in self.defaults:
            self.set_default(model)

    def set_default(self, model: ModelWorkers):
        for other in self.versions.get(model.spec.name, {}).values():
            other.spec.default = other is model
        self.defaults[model.spec.name] = model

    def remove(self, model: ModelWorkers):
        """Route no more requests to ``model`` (its workers still run: ``forget``)."""
        versions = self.versions.get(model.spec.name, {})
        if versions.get(model.spec.version) is model:
            del versions[model.spec.version]
        if not versions:
            self.versions.pop(model.spec.name, None)
        self.leaving.add(model)
        if self.defaults.get(model.spec.name) is model:
            del self.defaults[model.spec.name]
            if versions:
                self.set_default(next(iter(versions.values())))

    def forget(self, model: ModelWorkers):
        """End a removed model's workers and remove what it unpacked and their sockets."""
        model.stop()
        self.leaving.discard(model)
        shutil.rmtree(getattr(model, "unpack_dir", ""), ignore_errors=True)
        for index in range(sockets.PORTS_PER_MODEL):  # its workers' sockets (their ids are not given again)
            try:
                os.unlink(sockets.socket_path(self.run_dir, model.first_port + index))
            except OSError:
                pass

    def all(self) -> List[ModelWorkers]:
        """Every model version (copied whole: /metrics reads it from another thread while calls change it)."""
        return [w for versions in list(self.versions.values()) for w in list(versions.values())]

    def find(self, name: str, version: Optional[str] = None) -> Optional[ModelWorkers]:
        if version is None:
            return self.defaults.get(name)
        return self.versions.get(name, {}).get(version)
