"""MLServer as an engine: the model repository it reads, and where to find it.

MLServer (``mlserver start FOLDER``) serves every folder below FOLDER that holds a
``model-settings.json``, with the server's own ``settings.json`` at the top. For a model store the
repository is one folder per model version:

    FOLDER/settings.json                      ports, host, parallel_workers 0 (the archive's workers
                                              are processes of their own already), no debug
    FOLDER/NAME-VERSION/model-settings.json   name, version, implementation ArchiveModel
                                              (serving/runtimes/mlserver_runtime.py), the archive's uri, and
                                              its worker settings in parameters.extra

``model_settings`` is what ``tsctl serve --engine mlserver`` writes beside each archive's path and
what ``tsctl export seldon`` puts in each model's folder next to the archive itself.

MLServer starts through ``serving/runtimes/mlserver_start.py`` (``command``): nothing can load or unload a model
through its model repository API, and its REST app bounds request bodies as the tsctl engine does.

MLServer runs in an environment that has it (``mlserver==1.7.*``, with torch and torchserve for the
workers): this one when it does, else ``--python``. Its dependencies (an older fastapi, starlette
and protobuf than kserve's) rarely fit beside the rest of a development environment, so a venv of
its own is the usual home: ``samples/runtime_env.py mlserver-1.7.1`` builds the one the tests use.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from serving.ts_config import ModelSpec

from .errors import UserError

IMPLEMENTATION = "serving.runtimes.mlserver_runtime.ArchiveModel"
VERSION = "1.7"  # the MLServer release the runtime is written and tested for
REQUIREMENT = "mlserver==1.7.1"  # what an image of it installs (samples/runtime_env.py's venv too)
SETTINGS = "settings.json"
MODEL_SETTINGS = "model-settings.json"


def model_settings(spec: ModelSpec, uri: str, extra: Optional[Dict[str, Any]] = None) -> dict:
    """One model version's model-settings.json. MLServer's adaptive batching stays off
    (``max_batch_size`` 1): the runtime batches with the archive's ``batchSize``/``maxBatchDelay``
    itself, each request keeping its own answer."""
    settings = {
        "name": spec.name,
        "implementation": IMPLEMENTATION,
        "max_batch_size": 1,
        "max_batch_time": 0,
        "parameters": {
            "uri": uri,
            "version": spec.version,
            "extra": {
                "minWorkers": spec.min_workers,
                "batchSize": spec.batch_size,
                "maxBatchDelay": spec.max_batch_delay,
                "responseTimeout": spec.response_timeout,
                **(extra or {}),
            },
        },
    }
    return settings


def server_settings(host: str, http_port: int, grpc_port: int, metrics_port: int) -> dict:
    return {
        "debug": False,
        "host": host,
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        "parallel_workers": 0,  # predict runs on MLServer's loop; the archive's workers are processes already
        "load_models_at_startup": True,
    }


def write_repository(specs: List[ModelSpec], folder: Path, extra: Optional[Dict[str, Any]] = None) -> Path:
    """FOLDER as ``mlserver start`` reads it, each model's uri the absolute path of its archive;
    anything there from an earlier start is replaced."""
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for spec in specs:
        model = folder / f"{spec.name}-{spec.version}"
        model.mkdir()
        settings = model_settings(spec, str(Path(spec.archive).resolve()), extra)
        (model / MODEL_SETTINGS).write_text(json.dumps(settings, indent=2) + "\n")
    return folder


def find_python(python: Optional[str]) -> str:
    """The Python that runs MLServer: ``python`` if given, else this one; a UserError naming the fix
    when MLServer is not importable there."""
    if python is None:
        if importlib.util.find_spec("mlserver") is not None:
            return sys.executable
        raise UserError(
            f"MLServer is not installed in this environment ({sys.executable}): pass --python with a Python that has "
            f"mlserver=={VERSION}.*, torch and torchserve ('make runtimes' in tsctl's checkout builds one: "
            ".runtimes/mlserver-1.7.1/bin/python)"
        )
    path = Path(python)
    if path.is_dir() and (path / "bin" / "python").is_file():
        raise UserError(f"--python {python} is a directory: pass its interpreter, --python {path / 'bin' / 'python'}")
    if not path.is_file() or not os.access(path, os.X_OK):
        where = "" if path.is_absolute() else f" (a path relative to {Path.cwd()})"
        raise UserError(
            f"--python {python} is not a Python interpreter{where}: give the full path of the MLServer venv's "
            "bin/python ('make runtimes' in tsctl's checkout builds .runtimes/mlserver-1.7.1)"
        )
    found = subprocess.run([python, "-c", "import mlserver, ts"], capture_output=True)
    if found.returncode != 0:
        raise UserError(
            f"--python {python} cannot import mlserver and ts: install 'mlserver=={VERSION}.*', torch and "
            "torchserve==0.12.0 there"
        )
    return os.path.abspath(python)  # the server starts in its home: a relative path would not be found there


def command(python: str, folder: Path) -> List[str]:
    """``mlserver start FOLDER`` through serving/runtimes/mlserver_start.py: its model repository's load and unload
    calls refused (REST and gRPC), request bodies bounded."""
    return [python, "-m", "serving.runtimes.mlserver_start", "--read-only", "start", str(folder)]
