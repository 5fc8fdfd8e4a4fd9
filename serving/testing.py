"""Run a .mar (or an unpacked model directory) in-process, the way a TorchServe worker would.

    from serving.testing import LocalModel

    with LocalModel("model-store/resnet18.mar") as model:
        [answer] = model.predict([open("kitten.jpg", "rb").read()])
        assert answer.status == 200, answer.json()

The archive runs as a TorchServe 0.12 worker runs it (``serving/worker.py``): TorchServe's own
model loader, ``Service`` and ``Context`` (metrics cache, manifest, system properties,
model-config.yaml, per-request headers), the ``module:function`` entry point or the one class of a
handler file, envelopes; so any handler TorchServe serves (its built-in handlers, ``BaseHandler``
subclasses, the toolkit's) runs here unchanged. No Java, no HTTP. Each input is one HTTP request of
the batch (``bytes`` a raw body, ``str`` a text, ``dict``/``list`` a JSON body, a ``Path`` the file
with the content type of its suffix, or a ``worker.Request`` with headers of its own); each answer
is what TorchServe's frontend would send (status, content type, headers, body bytes).

**The archive's code, not this process's.** A worker has the model directory first on its path, so
``handlers.image:handle`` imports the ``handlers/`` package the archive carries (every toolkit
archive bundles it), and a handler file of yours that imports ``handlers`` gets that copy too. A
LocalModel does the same, without letting archives (which may carry different ``handlers/``
versions) or the ``handlers`` package installed here mix in one process:

- The model directory *owns* the top-level module names it provides: ``handlers`` and every other
  package or ``.py`` file at its top, and its model file's name (``handlers/loading.py`` registers
  the model class module under it); standard-library names excepted.
- While the LocalModel loads and while it runs a batch (``_active``), and only then, it swaps those
  names in ``sys.modules``: whatever the process had under them (the installed ``handlers``, another
  archive's ``model``) is set aside, this model's own module objects are put in, and the model
  directory is first on ``sys.path``. Its first load therefore imports every module fresh from the
  directory, under the very names a worker uses (``handlers.base``, relative imports and all);
  afterwards the modules are kept by the LocalModel and taken out of ``sys.modules`` again, and
  ``sys.modules``, ``sys.path`` and the path importer cache are exactly as before, whether the load
  worked or failed. Functions that are already loaded hold their own modules' globals, so only imports
  made at call time look at ``sys.modules``: that is why the swap is in place during each batch too.
- The one process-wide patch a ``handlers`` copy makes on import (``envelopes.py`` makes TorchServe's
  envelopes step aside for toolkit handlers) is undone after the load: the envelope TorchServe wrapped
  around this model already holds the patched method, and nobody else sees this copy's.
- The working directory is the model directory while the model loads and runs a batch, as a
  TorchServe worker's is (it starts in the unpacked archive), so a handler that opens
  ``index_to_name.json`` by a bare relative path finds it; the caller's is restored after.
- A lock serialises LocalModels' swaps, so several may be open and used from several threads. Code
  outside any LocalModel that imports one of a model's names for the first time *while that model
  runs a batch* would get the model's copy; calling ``model.handler``'s methods directly runs outside
  the swap (fine unless they import the model's modules at call time), and outside it
  ``sys.modules[type(model.handler).__module__]`` (what ``inspect.getfile`` and pickle look up) is the
  process's module of that name, not the archive's.

**One handler instance per LocalModel.** ``entry_point`` keeps the instance on the TorchServe
context (a worker has one for its life: one instance per worker, as TorchServe does); every
LocalModel has its own, so closing one and opening the same directory again reads its files again.
On ``close()``, and when the load fails (bad weights, bad settings: the handler's own exception is
raised), the temporary unpack directory is removed.
"""

import os
import shutil
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

from ts.torch_handler.request_envelope.base import BaseEnvelope

from handlers import identity, signing
from handlers.archives import Archive, opened

from . import worker
from .worker import Request, Response, as_request

__all__ = ["LocalModel", "Request", "Response"]

_SWAP = threading.RLock()  # one model's names in sys.modules at a time
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | frozenset(sys.builtin_module_names)


class LocalModel:
    """An archive loaded as a worker loads it, with the code it carries. The archive is checked
    first (names, sizes, manifest paths inside it: ``handlers/archives.py``); whatever fails,
    nothing is left behind: no temporary files, no modules, no ``sys.path`` entry."""

    def __init__(
        self,
        archive: Union[str, Path, Archive],
        batch_size: int = 8,
        envelope: Optional[str] = None,
        gpu: Optional[int] = None,
        decode_input_request: bool = True,
        limit_max_image_pixels: bool = True,
        metrics_config: Optional[str] = None,
        public_key: Optional[str] = None,
        expected: Tuple[Optional[str], Optional[str]] = (None, None),
    ):
        self.decode_input_request = decode_input_request
        self._tmp = None
        self.model_dir = None
        self.service = None
        self._names: FrozenSet[str] = frozenset()
        self.record: Optional[dict] = None
        self._modules: Dict[str, Any] = {}  # this model's entries of sys.modules while it is not active
        try:
            with opened(archive) as found:  # a path is opened here; an Archive given is read once for all
                self.manifest = found.manifest
                self.record = identity.read(found)  # MAR-INF/tsctl.json: which class is the handler
                if found.kind != "dir":
                    self._tmp = tempfile.mkdtemp(prefix="tsctl-run-")
                self.model_dir = found.model_dir(self._tmp)
                name = found.path.name
            if public_key:  # before any of the archive's code is imported
                signing.verify(self.model_dir, public_key, name, *expected)
            model = self.manifest["model"]
            self.model_name = model["modelName"]
            self._names = own_names(self.model_dir, model)
            with self._active():
                self.service = worker.load(
                    self.model_name,
                    str(self.model_dir),
                    model["handler"],
                    gpu,
                    batch_size,
                    envelope,
                    limit_max_image_pixels,
                    metrics_config,
                )
        except BaseException:
            self.close()
            raise

    @contextmanager
    def _active(self):
        """This model's modules under their names in ``sys.modules`` and its directory first on
        ``sys.path``; on the way out both are as they were (see the module docstring)."""
        with _SWAP:
            outside = self._owned(sys.modules)
            for name in outside:
                del sys.modules[name]
            sys.modules.update(self._modules)
            path, envelope_handle, no_bytecode = list(sys.path), BaseEnvelope.handle, sys.dont_write_bytecode
            cwd = os.getcwd()
            os.chdir(self.model_dir)  # a worker's working directory: handlers open bare relative paths
            sys.path.insert(0, str(self.model_dir))
            sys.dont_write_bytecode = True  # no __pycache__ in the model directory, no stale bytecode
            try:
                yield
            finally:
                self._modules = self._owned(sys.modules)
                for name in self._modules:
                    del sys.modules[name]
                sys.modules.update(outside)
                sys.path[:] = path
                os.chdir(cwd)
                sys.dont_write_bytecode = no_bytecode
                inside = (str(self.model_dir), str(self.model_dir) + os.sep)
                for entry in [p for p in sys.path_importer_cache if p in inside or str(p).startswith(inside[1])]:
                    del sys.path_importer_cache[entry]  # a directory that was edited is listed again
                if BaseEnvelope.handle is not envelope_handle and self._defined_here(BaseEnvelope.handle):
                    BaseEnvelope.handle = envelope_handle

    def _owned(self, modules: dict) -> dict:
        """The entries of ``modules`` under this model's top-level names (``handlers``, ``handlers.*``)."""
        names, packages = self._names, tuple(name + "." for name in self._names)
        return {name: modules[name] for name in list(modules) if name.startswith(packages) or name in names}

    def _defined_here(self, function) -> bool:
        """True when ``function`` belongs to one of this model's modules."""
        namespace = getattr(function, "__globals__", None)
        return any(vars(module) is namespace for module in self._modules.values())

    @property
    def handler(self):
        """The instance of the handler class the archive's record names (MAR-INF/tsctl.json); None
        for an archive without one (not a toolkit handler) and once closed."""
        if self.service is None or self.record is None:
            return None
        entry = self.service._entry_point
        entry = getattr(getattr(entry, "__self__", None), "_handle_fn", entry)  # inside an envelope
        if hasattr(entry, "handler_for"):
            found = entry.handler_for(self.service.context)
        else:
            found = getattr(entry, "__self__", None)  # a handler class TorchServe instantiated itself
        return found if type(found).__qualname__ == self.record["class"] else None

    def serve(self, requests: List[Request]) -> List[Response]:
        """Run one batch of HTTP requests as TorchServe's worker runs it (``serving/worker.py``):
        one Response per request, in order, as TorchServe's frontend would answer it."""
        return self._run(worker.frontend_batch(list(requests), self.decode_input_request))

    def predict_rows(self, rows: List[dict], headers: Optional[List[Dict[str, str]]] = None) -> List[Response]:
        """Run one batch of rows as the worker hands them to the handler after decoding (``{"body":
        value}``, or form fields ``{"data": ..., "file": ...}``), each with its HTTP ``headers``."""
        return self._run(worker.rows_batch(rows, headers))

    def _run(self, batch: List[dict]) -> List[Response]:
        if self.service is None:
            raise RuntimeError(f"LocalModel {self.model_name!r} is closed")
        with self._active():
            return worker.predict(self.service, batch)

    def predict(self, inputs: Sequence[Any]) -> List[Response]:
        """Run one batch: each input is one request (``bytes`` a raw body, ``str`` a text, ``dict``
        or ``list`` a JSON body, a ``Path`` the file with the content type of its suffix, or a
        ``Request``)."""
        return self.serve([as_request(i) for i in inputs])

    def close(self):
        """Let go of the handler, its modules and the temporary directory; safe to call twice."""
        pool = getattr(self.handler, "pool", None)
        if pool is not None:
            pool.shutdown(wait=False)
        self.service = None
        self._modules = {}
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def own_names(model_dir: Path, model: dict) -> FrozenSet[str]:
    """The top-level module names a worker would import from ``model_dir``: its packages (``handlers``
    among them) and ``.py`` files, and the model file's name; standard-library names excepted."""
    names = {os.path.splitext(os.path.basename(model["modelFile"]))[0]} if model.get("modelFile") else set()
    for entry in model_dir.iterdir():
        if entry.suffix == ".py" and entry.is_file():
            names.add(entry.stem)
        elif entry.is_dir() and (entry / "__init__.py").is_file():
            names.add(entry.name)
    return frozenset(name for name in names if name.isidentifier() and name not in STDLIB)
