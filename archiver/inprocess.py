"""An archive's handler run here, without a server: ``tsctl run`` and in-process ``tsctl verify``.

``run`` answers as ``tsctl predict`` does against a server ``tsctl config`` configured: each file is one
request (its content type from its suffix, or the one ``--content-type`` gives) in a batch of its own, as
predict's requests reach a worker one after the other (a stateful archive's, ``sequenceBatching: true``: the
files are one sequence, in order, the first with TorchServe's start header and the last with its end; a
continuous-batching archive's, ``continuousBatching: true``: each run step by step to its end, its parts
joined); the model-config.yaml's keys as the engine takes them (``config_notes``: a note for a key it does
not do, one line for one it refuses); the handler gets the bodies as that worker would (a toolkit archive
raw, ``decode_input_request=false``, as tsctl config and the tsctl engine set it; any other TorchServe's
default, parsed), with the archive's batchSize as its context's. The archive runs in TorchServe's worker
process (``serving.local_model.LocalModel``), whose log is kept, not printed (a handler logs a traceback for a
request it refuses, TorchServe one for a batch that failed); this process's own log records and warnings are
kept too while a command runs one (``quiet_logs``). A batch the handler failed as a whole (TorchServe's
frontend answers 503 ``Prediction failed``, 500 ``Worker died.`` ...) is one ServerFailure naming the archive,
the input and the handler's own error, read from the worker's log (``handler_error``).

Nothing here imports torch.
"""

import base64
import contextlib
import json
import logging
import re
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from .errors import ServerFailure, UserError

FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')  # a traceback's frame, as a worker logs it
# TorchServe's frontend's answers for a batch that failed as a whole (serving/worker/ts_wire.batch_error).
FRONTEND_ERROR = "InternalServerException"


@contextlib.contextmanager
def quiet_logs() -> Iterator[List[logging.LogRecord]]:
    """Keep every log record (and warning) emitted inside instead of printing it; yields the list."""
    records: List[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    keep, root = Keep(logging.DEBUG), logging.getLogger()
    root.addHandler(keep)  # with a handler on the root, logging's last resort (stderr) stays silent
    logging.captureWarnings(True)
    try:
        yield records
    finally:
        logging.captureWarnings(False)
        root.removeHandler(keep)


def handler_error(lines: Sequence[str], model_dir: Optional[Path] = None) -> Optional[str]:
    """The handler's own error in its worker's log lines: the last Python error logged (``Type:
    message``, ``ts_wire.cause_of``) and, when a traceback before it passes through the archive's
    code, where (``file.py:LINE in function``, its last frame there)."""
    from serving.worker.ts_wire import cause_of
    from serving.worker.worker_process import PYTHON_ERROR

    errors = [(i, line.strip()) for i, line in enumerate(lines) if PYTHON_ERROR.match(line)]
    cause = cause_of([error for _, error in errors])
    if cause is None:
        return None
    at = max(i for i, error in errors if error == cause)
    where = None
    for line in lines[:at]:
        for path, number, function in FRAME.findall(line):
            if model_dir is not None and Path(path).is_relative_to(model_dir):
                where = f"{Path(path).relative_to(model_dir)}:{number} in {function}"
    return f"{cause} ({where})" if where else cause


def worker_error(model, seen: int, wait: float = 2.0) -> Optional[str]:
    """``handler_error`` of the lines ``model``'s worker logged since its ``seen``-th (``model.logged``);
    its log is read by a thread of its own, so the lines of a batch's failure are waited for (up to
    ``wait`` s)."""
    deadline = time.monotonic() + wait
    while True:
        new = model.logged - seen
        lines = list(model.log)[-new:] if new > 0 else []
        found = handler_error(lines, model.model_dir)
        if found is not None or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def failed_whole(response) -> bool:
    """True for TorchServe's frontend's answer to a batch the handler failed as a whole."""
    if response.status < 500:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("type") == FRONTEND_ERROR


def metrics_config(given: Optional[str] = None, config: Optional[str] = None) -> Optional[str]:
    """The metrics.yaml the archive's worker reads (TorchServe's ``metrics_config``), as an absolute
    path: ``given`` (``--metrics-config``), else the ``metrics_config`` of ``config`` (``--config``;
    None: config/config.properties when it exists, the config ``tsctl serve`` reads by default), each
    as ``properties.metrics_yaml`` reads it. None: TorchServe's own metrics.yaml."""
    from .engines.base import DEFAULT_CONFIG
    from .properties import config_metrics, metrics_yaml

    if given:
        return metrics_yaml(given, "--metrics-config")
    if config is None and not Path(DEFAULT_CONFIG).is_file():
        return None
    return config_metrics(config or DEFAULT_CONFIG)


def worker_gpu(choice: str, archive) -> int:
    """The gpu an in-process worker of ``archive`` (an Archive) is loaded with, from ``--gpu`` (``choice``):
    an id among the visible GPUs, ``cpu`` (-1), or ``auto``: the GPU TorchServe gives a model's first worker
    on this machine (serving/gpus.py: its model-config.yaml's deviceType and deviceIds honoured), else -1.
    One UserError for an id this machine does not have."""
    from serving import gpus

    choice = (choice or "auto").strip().lower()
    found = gpus.count_gpus()
    if choice == "cpu":
        return gpus.CPU
    if choice == "auto":
        try:
            devices = gpus.model_devices(archive.config, found, f"{archive.path.name}'s model-config.yaml")
        except gpus.PlacementError as exc:
            raise UserError(str(exc)) from None
        return gpus.Placement(found).next_gpu(devices)
    if not re.fullmatch(r"[0-9]+", choice):  # not str.isdigit: '²' and '٣' are digits to it
        raise UserError(f"--gpu {choice}: give a GPU's id (0, 1, ...), cpu or auto")
    if int(choice) >= found:
        have = f"{found} visible GPU{'s' if found != 1 else ''}" if found else "no visible GPU"
        raise UserError(
            f"--gpu {choice}: this machine has {have} (CUDA_VISIBLE_DEVICES, the driver): give a "
            "smaller id, cpu or auto"
        )
    return int(choice)


def config_notes(archive) -> List[str]:
    """The engine's notes on the model-config.yaml keys it does not do (serving/model_config_keys.py), as
    its worker runs the archive here too; a key it refuses is a UserError naming it."""
    from serving import model_config_keys
    from serving.engine.sequences import SequenceConfigError, SequenceSettings

    where = f"{archive.path}'s model-config.yaml"
    try:
        notes = model_config_keys.check(archive.config, where)
        SequenceSettings.of(archive.config, where)  # as the engine reads them at load
    except (model_config_keys.ModelConfigRefused, SequenceConfigError) as exc:
        raise UserError(str(exc)) from None
    return notes


def batch_size(archive) -> int:
    """The batchSize a server gives the archive (an Archive): its model-config.yaml's (as 'tsctl config'
    writes it), else 1."""
    value = archive.config.get("batchSize", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def run(
    archive,
    paths: Sequence[Path],
    public_key: Optional[str] = None,
    progress: Callable[[str], None] = lambda message: None,
    expected: Tuple[Optional[str], Optional[str]] = (None, None),
    metrics: Optional[str] = None,
    kind: Optional[str] = None,
    gpu: str = "auto",
) -> List[Tuple[Path, object]]:
    """(path, Response) for each file, answered as ``tsctl predict`` would be answered (module
    docstring). The handler's failure to load is raised as it is (the caller names it); its failure on
    a batch is a ServerFailure naming ``archive``, the input and the handler's error. With ``public_key``
    the archive must be signed as ``expected`` (name, version; None: any); ``metrics``: the worker's
    metrics.yaml (``metrics_config``; None: TorchServe's); ``kind``: the content type every file is sent
    with ('': none; None: its suffix's); ``gpu``: ``--gpu`` (``worker_gpu``)."""
    from handlers import identity
    from handlers.archives import opened

    with opened(archive) as archive:  # the archive read once: record, config, files (its notes: the caller's)
        raw = identity.read(archive) is not None  # a toolkit handler: served with decode_input_request=false
        device = worker_gpu(gpu, archive)
        progress(f"loading {archive.path.name}" + (f" on GPU {device}" if device >= 0 else ""))
        from serving.local_model import LocalModel  # the worker process imports torch, not this one

        model = LocalModel(
            archive,
            batch_size=batch_size(archive),
            decode_input_request=not raw,
            public_key=public_key,
            expected=expected,
            metrics_config=metrics,
            gpu=None if device < 0 else device,
            continuous=archive.config.get("continuousBatching") is True,
        )
        stateful = archive.config.get("sequenceBatching") is True
        sequence = f"tsctl-run-{uuid.uuid4()}"
        with model:
            answered = []
            for number, path in enumerate(paths, 1):
                seen = model.logged
                request = request_of(Path(path), kind)
                if stateful:  # the files are one sequence, in order: started by the first, ended by the last
                    request.headers.update(sequence_headers(sequence, number == 1, number == len(paths)))
                [response] = model.predict([request])
                if failed_whole(response):
                    cause = worker_error(model, seen) or response.json().get("message")
                    if "MetricsCacheKeyError" in str(cause) and not metrics:  # a metric declared in the example's yaml
                        cause += ": give the metrics.yaml that declares it with --metrics-config"
                    raise ServerFailure(f"{archive.path}: the handler failed on {path}: {cause}")
                answered.append((Path(path), response))
                progress(f"{number}/{len(paths)} {path}: {response.status}")
    return answered


def sequence_headers(sequence: str, first: bool, last: bool) -> dict:
    """The headers TorchServe's frontend gives a stateful handler's request (serving/engine/sequences.py)."""
    from serving.engine.sequences import SEQUENCE_END, SEQUENCE_ID, SEQUENCE_START

    headers = {SEQUENCE_ID: sequence}
    if first:
        headers[SEQUENCE_START] = "true"
    if last:
        headers[SEQUENCE_END] = "true"
    return headers


def request_of(path: Path, kind: Optional[str] = None):
    """The request ``tsctl predict`` sends for the file: its bytes with the content type ``kind`` ('':
    no Content-Type, as curl -T sends a file), else (None) the one its suffix says."""
    from handlers.requests import content_type
    from serving.worker.ts_wire import RequestInput

    kind = content_type(path) if kind is None else kind
    return RequestInput(path.read_bytes(), {"Content-Type": kind} if kind else {})


def line(path, response) -> str:
    """``PATH: STATUS ANSWER`` as 'tsctl predict' prints it (a binary answer by its size and type)."""
    answer = response.answer()
    if isinstance(answer, bytes):
        return f"{path}: {response.status} <{len(answer):,} bytes of {response.content_type}>"
    return f"{path}: {response.status} {json.dumps(answer)}"


def as_json(path, response) -> dict:
    """One result of 'tsctl run --json' (docs/json-output.md): a binary answer in base64, flagged."""
    answer = response.answer()
    binary = isinstance(answer, bytes)
    return {
        "path": str(path),
        "status": response.status,
        "content_type": response.content_type,
        "answer": base64.b64encode(answer).decode("ascii") if binary else answer,
        "base64": binary,
    }
